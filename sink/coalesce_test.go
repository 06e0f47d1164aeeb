package sink_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestPartitionsOfOneBrokerShareAProduceRequestAndKeepTheirOwnAnswers: records of three partitions
// led by the same broker, published within one linger, travel in one Produce request; the broker
// answers each partition on its own, and each answer is handled for its partition only: A's
// OUT_OF_ORDER_SEQUENCE_NUMBER restarts A's sequence (a new epoch), B's refused record is split out
// and dead-lettered, and C's batch, written at once, is sent exactly once.
func TestPartitionsOfOneBrokerShareAProduceRequestAndKeepTheirOwnAnswers(t *testing.T) {
	t.Parallel()
	fb := fakebroker.New(t)
	firstA := true
	fb.SetIdempotent(true, 0)
	fb.SetPlan(func(ids []string) int16 {
		switch {
		case slices.Contains(ids, "A/a0") && firstA:
			firstA = false
			return int16(kafka.OutOfOrderSequenceNumber)
		case slices.Contains(ids, "B/b1"):
			return int16(kafka.InvalidRecord) // alone or with others
		}
		return 0
	})
	s := newSink(t, "", sink.Config{
		Brokers: []string{fb.Addr()}, Record: record.Options{TopicTemplate: "{aggregate_type}"}, DeadLetterTopic: "dlq",
		Linger: 300 * time.Millisecond, WriteTimeout: 5 * time.Second, Idempotence: sink.IdempotenceOn,
	})
	a := &acker{}
	for _, id := range []string{"a0", "b0", "c0", "a1", "b1", "c1", "b2"} {
		topic := strings.ToUpper(id[:1])
		s.publish(t, newEvent(id, []byte(topic), "key-"+topic, "Changed", []byte(`{}`)), a)
	}
	eventually(t, 30*time.Second, "every event settled", func() bool { return a.n.Load() == 7 })
	s.mustClose(t)

	requests := fb.Requests()
	if len(requests) == 0 || !sameSet(requests[0], []string{"A/0", "B/0", "C/0"}) {
		t.Errorf("the first produce request held %v, want the batches of A, B and C together (every request: %v)", firstOr(requests), requests)
	}
	got := map[string][]string{}
	for _, b := range fb.Batches() {
		got[b.Topic] = append(got[b.Topic], b.String())
	}
	want := map[string][]string{
		// A's sequence was lost: a new epoch from sequence 0, the same records.
		"A": {"[a0 a1] pid 1000 epoch 0 seq 0 -> 45", "[a0 a1] pid 1000 epoch 1 seq 0 -> 0"},
		// B's batch was refused for b1: split, b1 refused on its own gives its sequence back.
		"B": {"[b0 b1 b2] pid 1000 epoch 0 seq 0 -> 87", "[b0] pid 1000 epoch 0 seq 0 -> 0",
			"[b1] pid 1000 epoch 0 seq 1 -> 87", "[b2] pid 1000 epoch 0 seq 1 -> 0"},
		// C was written by the first request and never sent again.
		"C":   {"[c0 c1] pid 1000 epoch 0 seq 0 -> 0"},
		"dlq": {"[b1] pid 1000 epoch 0 seq 0 -> 0"},
	}
	for topic, w := range want {
		if g := got[topic]; strings.Join(g, "\n") != strings.Join(w, "\n") {
			t.Errorf("the broker saw for %s\n  %s\nwant\n  %s", topic, strings.Join(g, "\n  "), strings.Join(w, "\n  "))
		}
	}
	if n := s.metric(t, "outbox_relay_events_dead_lettered_total"); n != 1 {
		t.Errorf("events_dead_lettered_total = %v, want 1 (b1)", n)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func firstOr(requests [][]string) string {
	if len(requests) == 0 {
		return "nothing"
	}
	return fmt.Sprint(requests[0])
}

// TestCoalescedRequestsDeliverEveryPartitionCompleteAndInOrder publishes, in rounds, to every
// partition of four topics (twelve partitions, one broker), with the linger long enough for each
// round's batches to share requests: every event arrives once, in key order, in both delivery modes
// (exactly-once read as a read_committed consumer reads), and the requests prove the batches
// travelled together.
func TestCoalescedRequestsDeliverEveryPartitionCompleteAndInOrder(t *testing.T) {
	t.Parallel()
	for _, exactlyOnce := range []bool{false, true} {
		name := "at-least-once"
		if exactlyOnce {
			name = "exactly-once"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := testenv.SharedKafka(t)
			prefix := testenv.UniqueName(t, "co")
			types := []string{"a", "b", "c", "d"}
			for _, typ := range types {
				if err := k.CreateTopic(context.Background(), prefix+"."+typ, 3); err != nil {
					t.Fatal(err)
				}
			}
			cfg := sink.Config{
				Brokers: []string{k.Brokers()}, Record: record.Options{TopicTemplate: prefix + ".{aggregate_type}"},
				DeadLetterTopic: testenv.UniqueName(t, "dlq"), WriteTimeout: 10 * time.Second,
				Linger: 50 * time.Millisecond,
			}
			if exactlyOnce {
				cfg.Transactions = &sink.Transactions{
					ID: testenv.UniqueName(t, "txn"), Interval: 200 * time.Millisecond,
					PositionsTopic: testenv.UniqueName(t, "pos"),
				}
			}
			s := readySink(t, k.Brokers(), cfg)
			logs := map[string]*sent{}
			for _, typ := range types {
				logs[typ] = newSent()
			}
			stream := newPGStream(25)
			const rounds, keys = 25, 12 // per round and topic, one event per key: every partition gets some
			for round := range rounds {
				for _, typ := range types {
					a := &acker{}
					for key := range keys {
						ev := stream.next(fmt.Sprintf("%s-key-%02d", typ, key))
						ev.ID = fmt.Appendf(nil, "%s-%02d-%02d", typ, round, key)
						ev.AggregateType = []byte(typ)
						logs[typ].add(ev, a, nil)
						s.publish(t, ev, a)
					}
				}
				time.Sleep(120 * time.Millisecond) // the round is written before the next begins
			}
			eventually(t, 60*time.Second, "every event acknowledged", func() bool { events, _ := s.InFlight(); return events == 0 })
			requests := s.metric(t, "outbox_relay_kafka_produce_requests_total")
			s.mustClose(t)
			read := readBack
			if exactlyOnce {
				read = readCommitted
			}
			for _, typ := range types {
				topic := prefix + "." + typ
				logs[typ].checkAcked(t)
				records := read(t, k.Brokers(), 60*time.Second, atLeast(rounds*keys), topic)
				if dups := logs[typ].verify(t, topic, records); dups != 0 {
					t.Errorf("%s: %d duplicates", topic, dups)
				}
			}
			// Each round fills twelve partitions; one request per partition would be at least twelve
			// requests a round (and a transaction adds its position record).
			if limit := float64(rounds * 12 * 3 / 4); requests > limit {
				t.Errorf("%v produce requests for %d rounds of twelve partitions: more than %v, so batches did not share requests", requests, rounds, limit)
			}
			t.Logf("%v produce requests for %d rounds of twelve partitions", requests, rounds)
		})
	}
}
