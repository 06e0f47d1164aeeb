package producer_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/producer"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// onFake is an idempotent producer of topic "events" on a fake broker, with the answers it gave.
type onFake struct {
	p   *producer.Producer
	seq uint64

	mu      sync.Mutex
	answers map[string]error // by record id: nil acknowledged, else the refusal
	settled chan struct{}    // a token per record answered
}

func newOnFake(t *testing.T, fb *fakebroker.Broker, linger time.Duration) *onFake {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(fb.Addr()), Timeout: 5 * time.Second}
	log := zaptest.NewLogger(t)
	f := &onFake{answers: map[string]error{}, settled: make(chan struct{}, 100)}
	ctx, cancel := context.WithCancel(context.Background())
	f.p = producer.New(ctx, producer.Config{
		Client: client, MaxBytes: 1 << 20, MaxRecords: 500, Linger: linger, Timeout: 5 * time.Second,
		Identity: producer.NewIdentity(client, log, producer.IdempotenceOn, "", 0), Log: log,
		Done: func(batch []*producer.Record, err error) {
			f.mu.Lock()
			for _, rec := range batch {
				f.answers[string(rec.Msg.Headers[0].Value)] = err
			}
			f.mu.Unlock()
			for range batch {
				f.settled <- struct{}{}
			}
		},
		Retrying: func(string, int, int, error, time.Duration) {},
		Sent:     func(int) {},
		StopAt:   func() uint64 { return math.MaxUint64 },
		Failed:   func(err error) { t.Errorf("the producer failed: %v", err) },
	})
	t.Cleanup(func() {
		f.p.Close()
		cancel()
	})
	return f
}

// enqueue hands over the record id of key order-1.
func (f *onFake) enqueue(t *testing.T, id string) {
	t.Helper()
	f.seq++
	rec := &producer.Record{Msg: kafka.Message{Topic: "events", Key: []byte("order-1"), Value: []byte(`{}`),
		Headers: []kafka.Header{{Key: record.HeaderID, Value: []byte(id)}}}, Partition: -1, Seq: f.seq, Enqueued: time.Now()}
	rec.Size = int64(producer.RecordSize(&rec.Msg))
	if err := f.p.Enqueue(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

// wait waits until n more records are answered.
func (f *onFake) wait(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for range n {
		select {
		case <-f.settled:
		case <-deadline:
			t.Fatalf("a record was not answered within 30 s")
		}
	}
}

// sawFor is what the broker was sent for topic, batch by batch.
func sawFor(fb *fakebroker.Broker, topic string) []string {
	var got []string
	for _, b := range fb.Batches() {
		if b.Topic == topic {
			got = append(got, b.String())
		}
	}
	return got
}

// TestIdempotentProducerAnswersEachSequenceErrorLikeTheJavaProducer scripts, with the fake broker,
// the answers a real broker gives only in rare moments (its producer state lost or expired, a
// retry of a batch it already holds) and checks what the producer sends next: producer id, epoch
// and base sequence of every batch, in order. e1's first attempt gets the scripted answer.
func TestIdempotentProducerAnswersEachSequenceErrorLikeTheJavaProducer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		code    kafka.Error
		want    []string // batches the broker saw: ids, pid, epoch, seq, answer
		refused bool     // e1 is answered with the refusal
	}{
		{"a transient error is retried with the same id, epoch and sequence", kafka.NotEnoughReplicas, []string{
			"[e0] pid 1000 epoch 0 seq 0 -> 0",
			"[e1] pid 1000 epoch 0 seq 1 -> 19",
			"[e1] pid 1000 epoch 0 seq 1 -> 0",
			"[e2] pid 1000 epoch 0 seq 2 -> 0",
		}, false},
		{"DUPLICATE_SEQUENCE_NUMBER means the broker has the batch: acknowledged, not retried", kafka.DuplicateSequenceNumber, []string{
			"[e0] pid 1000 epoch 0 seq 0 -> 0",
			"[e1] pid 1000 epoch 0 seq 1 -> 46",
			"[e2] pid 1000 epoch 0 seq 2 -> 0",
		}, false},
		{"OUT_OF_ORDER_SEQUENCE_NUMBER at the head: the partition's next epoch, from sequence 0", kafka.OutOfOrderSequenceNumber, []string{
			"[e0] pid 1000 epoch 0 seq 0 -> 0",
			"[e1] pid 1000 epoch 0 seq 1 -> 45",
			"[e1] pid 1000 epoch 1 seq 0 -> 0",
			"[e2] pid 1000 epoch 1 seq 1 -> 0",
		}, false},
		{"UNKNOWN_PRODUCER_ID: the partition's next epoch, from sequence 0", kafka.UnknownProducerId, []string{
			"[e0] pid 1000 epoch 0 seq 0 -> 0",
			"[e1] pid 1000 epoch 0 seq 1 -> 59",
			"[e1] pid 1000 epoch 1 seq 0 -> 0",
			"[e2] pid 1000 epoch 1 seq 1 -> 0",
		}, false},
		{"INVALID_PRODUCER_EPOCH: a new producer id, from sequence 0", kafka.InvalidProducerEpoch, []string{
			"[e0] pid 1000 epoch 0 seq 0 -> 0",
			"[e1] pid 1000 epoch 0 seq 1 -> 47",
			"[e1] pid 1001 epoch 0 seq 0 -> 0",
			"[e2] pid 1001 epoch 0 seq 1 -> 0",
		}, false},
		{"a refused record gives its sequence back to the next batch", kafka.InvalidRecord, []string{
			"[e0] pid 1000 epoch 0 seq 0 -> 0",
			"[e1] pid 1000 epoch 0 seq 1 -> 87",
			"[e2] pid 1000 epoch 0 seq 1 -> 0",
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := fakebroker.New(t)
			first := true
			fb.SetIdempotent(true, 0)
			fb.SetPlan(func(ids []string) int16 {
				if slices.Contains(ids, "events/e1") && first {
					first = false
					return int16(tt.code)
				}
				return 0
			})
			f := newOnFake(t, fb, -1)
			for i := range 3 {
				f.enqueue(t, fmt.Sprintf("e%d", i))
				f.wait(t, 1)
			}
			if got := sawFor(fb, "events"); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("the broker saw\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for id, err := range f.answers {
				if refused := id == "e1" && tt.refused; refused != (err != nil) || refused && !errors.Is(err, tt.code) {
					t.Errorf("%s answered with %v", id, err)
				}
			}
		})
	}
}

// TestARefusedBatchIsSplitWithConsistentSequences: the broker refuses a batch of three for one
// record; the records then go one by one from the refused batch's sequence, the refused one gives
// its sequence back and alone is answered with the refusal.
func TestARefusedBatchIsSplitWithConsistentSequences(t *testing.T) {
	t.Parallel()
	fb := fakebroker.New(t)
	fb.SetIdempotent(true, 0)
	fb.SetPlan(func(ids []string) int16 {
		if slices.Contains(ids, "events/e1") {
			return int16(kafka.InvalidRecord) // alone or with others
		}
		return 0
	})
	f := newOnFake(t, fb, 300*time.Millisecond)
	for i := range 3 {
		f.enqueue(t, fmt.Sprintf("e%d", i))
	}
	f.wait(t, 3)
	f.enqueue(t, "e3")
	f.wait(t, 1)
	want := []string{
		"[e0 e1 e2] pid 1000 epoch 0 seq 0 -> 87",
		"[e0] pid 1000 epoch 0 seq 0 -> 0",
		"[e1] pid 1000 epoch 0 seq 1 -> 87",
		"[e2] pid 1000 epoch 0 seq 1 -> 0",
		"[e3] pid 1000 epoch 0 seq 2 -> 0",
	}
	if got := sawFor(fb, "events"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the broker saw\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range []string{"e0", "e1", "e2", "e3"} {
		err, answered := f.answers[id]
		if !answered || (id == "e1") != (err != nil) || id == "e1" && !errors.Is(err, kafka.InvalidRecord) {
			t.Errorf("%s answered %v with %v; want e1 alone refused (INVALID_RECORD), the others acknowledged", id, answered, err)
		}
	}
}
