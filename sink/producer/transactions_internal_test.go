package producer

import "testing"

func TestATransactionsSpanInAPartitionCoversEveryBatch(t *testing.T) {
	tp := TopicPartition{Topic: "orders", Partition: 1}
	tests := []struct {
		name  string
		spans []Span
		want  Span
	}{
		{"one batch", []Span{{First: 10, Last: 19}}, Span{First: 10, Last: 19}},
		{"batches in any order", []Span{{First: 20, Last: 29}, {First: 10, Last: 19}, {First: 30, Last: 30}}, Span{First: 10, Last: 30}},
		{"a batch whose place is unknown makes it unknown", []Span{{First: 10, Last: 19}, {First: -1, Last: -1}, {First: 20, Last: 29}}, Span{First: -1, Last: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var txn kafkaTxn
			for _, sp := range tt.spans {
				txn.wrote(tp, sp)
			}
			if got := txn.spans[tp]; got != tt.want {
				t.Errorf("span %v; want %v", got, tt.want)
			}
		})
	}
}
