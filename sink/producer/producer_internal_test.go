package producer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestMurmur2MatchesKafkaGo checks the hash against kafka-go's port of the Java client's murmur2;
// sink_test.go checks the resulting partitions against the Java client itself.
func TestMurmur2MatchesKafkaGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	partitions := make([]int, 7)
	for i := range partitions {
		partitions[i] = i
	}
	for n := 0; n < 2000; n++ {
		key := make([]byte, rng.IntN(40))
		for i := range key {
			key[i] = byte(rng.IntN(256))
		}
		want := kafka.Murmur2Balancer{Consistent: true}.Balance(kafka.Message{Key: key}, partitions...)
		if got := int((Murmur2(key) & 0x7fffffff) % 7); got != want {
			t.Fatalf("key %x: partition %d, kafka-go says %d", key, got, want)
		}
	}
}

func TestRequestsRespectRecordAndByteLimits(t *testing.T) {
	tests := []struct {
		name       string
		sizes      []int64
		maxRecords int
		maxBytes   int
		want       []int // records per request, in order
	}{
		{"everything fits in one request", []int64{10, 10, 10}, 10, 100, []int{3}},
		{"the record cap splits", []int64{1, 1, 1, 1, 1}, 2, 100, []int{2, 2, 1}},
		{"the byte cap splits", []int64{40, 40, 40}, 10, 100, []int{2, 1}},
		{"a record over the byte cap still goes, alone", []int64{500, 10}, 10, 100, []int{1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &partitionQueue{p: &Producer{maxRecords: tt.maxRecords, maxBytes: tt.maxBytes}}
			for _, size := range tt.sizes {
				q.pending = append(q.pending, &Record{Size: size})
			}
			var got []int
			for len(q.pending) > 0 {
				got = append(got, len(q.takeLocked()))
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("requests %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAfterAHaltOnlyRecordsBeforeTheHaltedOneAreSent(t *testing.T) {
	tests := []struct {
		name   string
		seqs   []uint64
		stopAt uint64
		want   int // records that may be sent
	}{
		{"not halted: everything", []uint64{1, 2, 3}, math.MaxUint64, 3},
		{"halted later: everything", []uint64{1, 2, 3}, 7, 3},
		{"halted inside the batch: the records before it", []uint64{4, 5, 6}, 5, 1},
		{"halted on the first: nothing", []uint64{5, 6}, 5, 0},
		{"halted before the batch: nothing", []uint64{8, 9}, 5, 0},
		{"out of order (dead letters): up to the first one at or after it", []uint64{3, 9, 4}, 5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Producer{stopAt: func() uint64 { return tt.stopAt }}
			var batch []*Record
			for _, seq := range tt.seqs {
				batch = append(batch, &Record{Seq: seq})
			}
			if got := len(p.beforeHalt(batch)); got != tt.want {
				t.Fatalf("%d records may be sent, want %d", got, tt.want)
			}
		})
	}
}

// TestAPushWakesThePartitionOnlyWhenItsDecisionChanges: the partition's goroutine is woken by a
// first record (its linger starts), a record put ahead of others (an earlier Kafka transaction's)
// and a full batch, never by a record queued behind others while the batch lingers: a wake per
// event was most of the table-free drain's hand-off cost.
func TestAPushWakesThePartitionOnlyWhenItsDecisionChanges(t *testing.T) {
	tests := []struct {
		name     string
		pending  []uint64 // the queued records' transactions
		txn      uint64   // the pushed record's
		maxBytes int
		want     bool
	}{
		{"a first record wakes it", nil, 0, 1000, true},
		{"a record behind others lingers with them", []uint64{0, 0}, 0, 1000, false},
		{"a record of a later transaction waits behind", []uint64{1}, 2, 1000, false},
		{"a record of an earlier transaction goes ahead and wakes it", []uint64{2}, 1, 1000, true},
		{"a record that fills the batch's bytes wakes it", []uint64{0}, 0, 20, true},
		{"a record that fills the batch's count wakes it", []uint64{0, 0, 0}, 0, 1000, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &partitionQueue{p: &Producer{maxRecords: 4, maxBytes: tt.maxBytes}, wake: make(chan struct{}, 1)}
			for _, txn := range tt.pending {
				q.pending = append(q.pending, &Record{Txn: txn, Size: 10})
				q.bytes += 10
			}
			q.push(&Record{Txn: tt.txn, Size: 10})
			if got := len(q.wake) == 1; got != tt.want {
				t.Fatalf("woken %v, want %v", got, tt.want)
			}
		})
	}
}
