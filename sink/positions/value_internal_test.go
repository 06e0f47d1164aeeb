package positions

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

func TestAPositionValueKeepsItsOriginAndAnOldOneReadsAsUnknown(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    Position
		wantErr bool
	}{
		{"version 1: no origin", `{"v":1,"commit_lsn":"0/1A2B3C8","events":12}`, Position{CommitLSN: 0x1A2B3C8, Events: 12}, false},
		{"version 1 with origin fields is still of unknown origin", `{"v":1,"system_identifier":"7","timeline":3,"commit_lsn":"0/10","events":1}`, Position{CommitLSN: 0x10, Events: 1}, false},
		{"version 2", `{"v":2,"system_identifier":"7714668250760685997","timeline":2,"commit_lsn":"1/0","events":3}`,
			Position{CommitLSN: 1 << 32, Events: 3, SystemID: "7714668250760685997", Timeline: 2}, false},
		{"version 2 without a timeline", `{"v":2,"system_identifier":"7","commit_lsn":"0/10","events":1}`, Position{}, true},
		{"version 2 without a system identifier", `{"v":2,"timeline":1,"commit_lsn":"0/10","events":1}`, Position{}, true},
		{"a later version", `{"v":3,"commit_lsn":"0/10","events":1}`, Position{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := Decode([]byte(tt.value))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("Decode(%s) = %+v, %v; want %+v (error: %v)", tt.value, got, err, tt.want, tt.wantErr)
			}
		})
	}
	for _, p := range []Position{
		{CommitLSN: 0x5000000, Events: 4, SystemID: "7714668250760685997", Timeline: 3},
		{CommitLSN: 0x5000000, Events: 4}, // unknown origin: written as version 1
	} {
		got, _, err := Decode(Encode(p, nil))
		if err != nil || got != p {
			t.Errorf("%+v encoded as %s decodes to %+v, %v", p, Encode(p, nil), got, err)
		}
	}
}

func TestAPositionValueKeepsWhereItsTransactionWrote(t *testing.T) {
	pos := Position{CommitLSN: 0x5000000, Events: 4, SystemID: "7714668250760685997", Timeline: 3}
	written := map[producer.TopicPartition]producer.Span{{Topic: "orders", Partition: 2}: {First: 30, Last: 41}, {Topic: "orders", Partition: 0}: {First: 7, Last: 7}, {Topic: "dlq", Partition: 0}: {First: 1, Last: 3}, {Topic: "lost", Partition: 1}: {First: -1, Last: -1}}
	value := Encode(pos, written)
	const want = `{"v":2,"system_identifier":"7714668250760685997","timeline":3,"commit_lsn":"0/5000000","events":4,"written":[{"topic":"dlq","partition":0,"first":1,"last":3},{"topic":"orders","partition":0,"first":7,"last":7},{"topic":"orders","partition":2,"first":30,"last":41}]}`
	if string(value) != want {
		t.Fatalf("encoded as\n%s\nwant (sorted, the unknown span left out)\n%s", value, want)
	}
	got, gotWritten, err := Decode(value)
	if err != nil || got != pos {
		t.Fatalf("decodes to %+v, %v; want %+v", got, err, pos)
	}
	delete(written, producer.TopicPartition{Topic: "lost", Partition: 1})
	if len(gotWritten) != len(written) {
		t.Fatalf("written decodes to %v; want %v", gotWritten, written)
	}
	for tp, sp := range written {
		if gotWritten[tp] != sp {
			t.Errorf("written[%v] = %v; want %v", tp, gotWritten[tp], sp)
		}
	}
	for _, bad := range []string{
		`{"v":2,"system_identifier":"7","timeline":1,"commit_lsn":"0/10","events":1,"written":[{"topic":"a","partition":0,"first":5,"last":4}]}`,
		`{"v":2,"system_identifier":"7","timeline":1,"commit_lsn":"0/10","events":1,"written":[{"topic":"a","partition":0,"first":-1,"last":4}]}`,
	} {
		if _, _, err := Decode([]byte(bad)); err == nil {
			t.Errorf("%s decodes without an error", bad)
		}
	}
	// A position written before it carried this has none.
	if _, w, err := Decode([]byte(`{"v":2,"system_identifier":"7","timeline":1,"commit_lsn":"0/10","events":1}`)); err != nil || w != nil {
		t.Errorf("an older value decodes with written %v, %v; want nil", w, err)
	}
}
