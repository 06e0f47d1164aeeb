package producer_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
)

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
			f := newOnFake(t, fb, -1, 5*time.Second)
			for i := range 3 {
				f.enqueue(t, "events", fmt.Sprintf("e%d", i))
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
	f := newOnFake(t, fb, 300*time.Millisecond, 5*time.Second)
	for i := range 3 {
		f.enqueue(t, "events", fmt.Sprintf("e%d", i))
	}
	f.wait(t, 3)
	f.enqueue(t, "events", "e3")
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
