package producer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/producer"
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

// TestABrokerThatDeniesIdempotenceIsAWarningUnlessItIsRequired: with idempotence auto the
// producer publishes without a producer id and says so once; with on, the identity is a start
// error naming kafka.idempotence (what the sink makes of it, a failed WaitReady and Publish, is
// sink's TestAStartThatRequiresIdempotenceFailsWhenTheBrokerDeniesIt).
func TestABrokerThatDeniesIdempotenceIsAWarningUnlessItIsRequired(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		offered    bool        // the broker offers InitProducerId
		code       kafka.Error // and answers it with
		mode       producer.Idempotence
		startError bool
	}{
		{"auto, IDEMPOTENT_WRITE denied: published without, with a warning", true, kafka.ClusterAuthorizationFailed, producer.IdempotenceAuto, false},
		{"auto, a broker without InitProducerId: published without, with a warning", false, 0, producer.IdempotenceAuto, false},
		{"on, IDEMPOTENT_WRITE denied: a start error naming kafka.idempotence", true, kafka.ClusterAuthorizationFailed, producer.IdempotenceOn, true},
		{"on, a broker without InitProducerId: a start error", false, 0, producer.IdempotenceOn, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := fakebroker.New(t)
			fb.SetIdempotent(tt.offered, tt.code)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if tt.startError {
				client := &kafka.Client{Addr: kafka.TCP(fb.Addr()), Timeout: 5 * time.Second, Transport: &kafka.Transport{}}
				_, err := producer.NewIdentity(client, zaptest.NewLogger(t), tt.mode, "", 0).Get(ctx)
				if err == nil || !strings.Contains(err.Error(), "kafka.idempotence") {
					t.Fatalf("Get = %v, want an error naming kafka.idempotence", err)
				}
				return
			}
			obs, logs := observer.New(zap.WarnLevel)
			log := zaptest.NewLogger(t).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, obs) }))
			f := newOnFakeVia(t, fb, -1, 5*time.Second, &kafka.Transport{}, tt.mode, log)
			f.enqueue(t, "events", "e0")
			f.wait(t, 1)
			if logs.FilterMessageSnippet("refuse the idempotent producer").Len() != 1 {
				t.Error("no warning says the producer runs without idempotence")
			}
			f.mu.Lock()
			if err := f.answers["e0"]; err != nil {
				t.Errorf("e0 answered with %v", err)
			}
			f.mu.Unlock()
			batches := fb.Batches()
			if len(batches) == 0 {
				t.Fatal("the broker saw no batch")
			}
			for _, b := range batches {
				if b.ProducerID != -1 || b.Seq != -1 {
					t.Errorf("batch %v carries a producer id", b)
				}
			}
		})
	}
}
