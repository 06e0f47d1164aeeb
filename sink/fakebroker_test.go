package sink_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestSinkRetriesBrokerErrorsThatAreNotAboutTheRecord: error codes kafka-go does not mark temporary
// but that say nothing about the record (a broker restarting, a credential or ACL rotation) must be
// retried in place, never dead-lettered or halted on; a record-level code must still go to the
// policy. Which codes are which is the producer's (sink/producer's
// TestBrokerErrorsThatAreNotAboutTheRecordAreRetriedInPlace holds the whole table); here, what the
// sink makes of each kind: a retry counted and no policy, or the dead-letter topic.
func TestSinkRetriesBrokerErrorsThatAreNotAboutTheRecord(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		produce, metadata, auth int
		code                    kafka.Error
		deadLettered            bool // code refuses e0 for good
	}{
		{"topic authorization failed on produce (an ACL rotation)", 3, 0, 0, kafka.TopicAuthorizationFailed, false},
		{"an invalid record still goes to the dead-letter topic", 0, 0, 0, kafka.InvalidRecord, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := fakebroker.New(t)
			s := newSink(t, "", sink.Config{
				Brokers: []string{fb.Addr()}, Record: record.Options{TopicTemplate: "events"}, DeadLetterTopic: "dlq",
				SASL: plain.Mechanism{Username: "relay", Password: "secret"}, Linger: -1, WriteTimeout: 5 * time.Second,
			})
			fb.Script(tt.produce, tt.metadata, tt.auth, tt.code)
			if tt.deadLettered {
				fb.RefuseID("e0")
			}
			a := &acker{}
			const n = 3
			for i := range n {
				s.publish(t, newEvent(fmt.Sprintf("e%d", i), []byte("Order"), "order-1", "Changed", []byte(`{}`)), a)
			}
			eventually(t, 60*time.Second, "every event settled", func() bool { return a.n.Load() == n })
			s.mustClose(t)
			stored, left := fb.State()
			if left != 0 {
				t.Fatalf("%d scripted failures never happened: the test did not test", left)
			}
			// Order holds within a topic; the dead-letter topic is another topic.
			want := "events/e0,events/e1,events/e2"
			if tt.deadLettered {
				want = "events/e1,events/e2,dlq/e0"
				slices.SortStableFunc(stored, func(a, b string) int { return strings.Compare(b[:3], a[:3]) })
				if got := s.metric(t, "outbox_relay_events_dead_lettered_total"); got != 1 {
					t.Errorf("events_dead_lettered_total = %v, want 1", got)
				}
			} else {
				if got := s.metric(t, "outbox_relay_events_failed_total"); got != 0 {
					t.Errorf("events_failed_total = %v, want 0: %v is not about the record", got, tt.code)
				}
				if got := s.metric(t, "outbox_relay_kafka_retries_total"); got < 1 {
					t.Errorf("kafka_retries_total = %v, want retries", got)
				}
			}
			if _, _, _, halted := s.Halted(); halted {
				t.Error("the sink halted")
			}
			if got := strings.Join(stored, ","); got != want {
				t.Errorf("the broker stored %s, want %s", got, want)
			}
		})
	}
}

// Refusals of two partitions arrive out of publish order: b1 (topic B, key K) is retried after
// transient errors and refused last, a1 (topic A, published after b1 and b2) is refused at once.
// The halt must hold at b1, the earliest, so key K's b2 never reaches Kafka without b1.
func TestAHaltHoldsAtTheEarliestRefusedRecordWhateverOrderRefusalsArriveIn(t *testing.T) {
	fb := fakebroker.New(t)
	var mu sync.Mutex
	attemptsB1 := 0
	fb.SetPlan(func(ids []string) int16 {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case slices.Contains(ids, "B/b1"):
			attemptsB1++
			if attemptsB1 <= 2 {
				return int16(kafka.NotEnoughReplicas) // transient: b1 is retried in place
			}
			return int16(kafka.InvalidRecord)
		case slices.Contains(ids, "A/a1"):
			return int16(kafka.InvalidRecord)
		}
		return 0
	})
	s := newHaltingSink(t, fb)
	a := &acker{}
	attempts := func() int {
		mu.Lock()
		defer mu.Unlock()
		return attemptsB1
	}
	s.publish(t, newEvent("b1", []byte("B"), "K", "X", []byte(`{}`)), a)
	// b1 is on its way (and b2 goes in a batch of its own behind it) before the others follow.
	await.True(t, 10*time.Second, "the broker sent b1", func() bool { return attempts() > 0 })
	s.publish(t, newEvent("b2", []byte("B"), "K", "X", []byte(`{}`)), a)
	s.publish(t, newEvent("a1", []byte("A"), "J", "X", []byte(`{}`)), a)
	await.True(t, 10*time.Second, "b1 refused for good (its third attempt)", func() bool { return attempts() > 2 })
	await.True(t, 10*time.Second, "the sink halted", func() bool { _, _, _, halted := s.Halted(); return halted })
	// Close returns once every partition's producer has stopped: whatever the halt wrongly
	// released has been sent by then.
	s.mustClose(t)
	stored, _ := fb.State()
	id, _, _, halted := s.Halted()
	if !halted || id != "b1" {
		t.Errorf("halted on %q (halted %v), want b1, the earliest refused event", id, halted)
	}
	if slices.Contains(stored, "B/b2") {
		t.Errorf("key K's b2 reached Kafka without b1: %v", stored)
	}
	if n := a.n.Load(); n != 0 {
		t.Errorf("%d events acknowledged, want none: each is the halted one or behind it", n)
	}
}

// TestAHaltedSinkClosesWithoutWaitingForARecordBehindTheHalt: a record published after the one
// the sink halts on may already be on its way to another partition, and be retried there (under
// exactly-once the halt aborts its transaction, and the broker refuses the retry for ever). It is
// never acknowledged (the slot stays before the halted record), so nothing waits for it: Close
// returns at once, where it waited for its whole deadline (a halted relay's stop took its
// shutdown_timeout).
func TestAHaltedSinkClosesWithoutWaitingForARecordBehindTheHalt(t *testing.T) {
	fb := fakebroker.New(t)
	var b1Sent atomic.Bool
	fb.SetPlan(func(ids []string) int16 {
		switch {
		case slices.Contains(ids, "B/b1"):
			b1Sent.Store(true)
			return int16(kafka.NotEnoughReplicas) // transient, for ever: retried in place
		case slices.Contains(ids, "A/a1") && b1Sent.Load():
			return int16(kafka.InvalidRecord) // refused for good: the halt, once b1 is out
		case slices.Contains(ids, "A/a1"):
			return int16(kafka.NotEnoughReplicas) // until then, a Publish of b1 is not held by the halt
		}
		return 0
	})
	s := newHaltingSink(t, fb)
	a := &acker{}
	s.publish(t, newEvent("a1", []byte("A"), "J", "X", []byte(`{}`)), a)
	s.publish(t, newEvent("b1", []byte("B"), "K", "X", []byte(`{}`)), a)
	await.True(t, 10*time.Second, "the sink halted on a1", func() bool { _, _, _, halted := s.Halted(); return halted })
	// a1 is refused only once b1 was sent: b1 is being retried now, or withheld.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_ = s.close(ctx)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close of the halted sink took %s: it waited for b1, which is behind the halt", took.Round(time.Millisecond))
	}
	if n := a.n.Load(); n != 0 {
		t.Errorf("%d events acknowledged, want none: a1 is the halted one and b1 is behind it", n)
	}
}

// newHaltingSink is a sink on fb that halts on a refused record, topics named by aggregate type,
// every record sent at once.
func newHaltingSink(t *testing.T, fb *fakebroker.Broker) *testSink {
	return newSink(t, "", sink.Config{
		Brokers: []string{fb.Addr()}, Record: record.Options{TopicTemplate: "{aggregate_type}"}, DeadLetterTopic: "dlq",
		Policy: sink.Halt, Linger: -1, WriteTimeout: 5 * time.Second,
	})
}

// TestARefusedRecordIsDeadLetteredUnderItsOwnPartitionsSequence: the broker refuses b1 of a batch
// for good; the policy sends it to the dead-letter topic, whose partition numbers its batches
// from sequence 0 of the same producer id (the producer's split of the refused batch is
// sink/producer's TestPartitionsOfOneBrokerShareAProduceRequestAndKeepTheirOwnAnswers).
func TestARefusedRecordIsDeadLetteredUnderItsOwnPartitionsSequence(t *testing.T) {
	t.Parallel()
	fb := fakebroker.New(t)
	fb.SetIdempotent(true, 0)
	fb.SetPlan(func(ids []string) int16 {
		if slices.Contains(ids, "B/b1") {
			return int16(kafka.InvalidRecord) // alone or with others
		}
		return 0
	})
	s := newSink(t, "", sink.Config{
		Brokers: []string{fb.Addr()}, Record: record.Options{TopicTemplate: "{aggregate_type}"}, DeadLetterTopic: "dlq",
		Linger: 300 * time.Millisecond, WriteTimeout: 5 * time.Second, Idempotence: sink.IdempotenceOn,
	})
	a := &acker{}
	for _, id := range []string{"b0", "b1", "b2"} {
		s.publish(t, newEvent(id, []byte("B"), "key-B", "Changed", []byte(`{}`)), a)
	}
	eventually(t, 30*time.Second, "every event settled", func() bool { return a.n.Load() == 3 })
	s.mustClose(t)
	var dlq []string
	for _, b := range fb.Batches() {
		if b.Topic == "dlq" {
			dlq = append(dlq, b.String())
		}
	}
	if want := []string{"[b1] pid 1000 epoch 0 seq 0 -> 0"}; !slices.Equal(dlq, want) {
		t.Errorf("the broker saw for dlq %v, want %v", dlq, want)
	}
	if n := s.metric(t, "outbox_relay_events_dead_lettered_total"); n != 1 {
		t.Errorf("events_dead_lettered_total = %v, want 1 (b1)", n)
	}
}
