package sink_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestRejectAppliesTheFailurePolicy: an event the relay could not build (here: no payload column
// when the row was written) goes to the dead-letter topic with what could be read, or halts the
// sink, and is acknowledged only by the dead-letter write.
func TestRejectAppliesTheFailurePolicy(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cause := errors.New(`outbox table public.outbox_events had no column "payload" (columns.payload)`)
	for _, policy := range []sink.Policy{sink.DeadLetter, sink.Halt} {
		t.Run(string(policy), func(t *testing.T) {
			aggType := testenv.UniqueName(t, "agg")
			dlq := testenv.UniqueName(t, "dlq")
			s := readySink(t, k.Brokers(), sink.Config{Policy: policy, DeadLetterTopic: dlq})
			a := &acker{}
			ev := newEvent("unreadable-1", []byte(aggType), "order-7", "Placed", nil)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := s.Reject(ctx, ev, sink.ReasonSchemaMismatch, cause, a); err != nil {
				t.Fatalf("Reject: %v", err)
			}
			if got := s.metric(t, "outbox_relay_events_failed_total", "reason", sink.ReasonSchemaMismatch); got != 1 {
				t.Errorf("events_failed_total{reason=%q} = %v, want 1", sink.ReasonSchemaMismatch, got)
			}
			if policy == sink.Halt {
				id, reason, _, halted := s.Halted()
				if !halted || id != "unreadable-1" || reason != sink.ReasonSchemaMismatch {
					t.Fatalf("Halted() = %q, %q, %v; want the rejected event and reason", id, reason, halted)
				}
				s.mustClose(t) // the producers have stopped: an acknowledgement would have come
				if a.n.Load() != 0 {
					t.Fatal("a rejected event was acknowledged under the halt policy")
				}
				return
			}
			eventually(t, 30*time.Second, "the dead-letter write acknowledged", func() bool { return a.n.Load() == 1 })
			recs := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), dlq)
			if len(recs) != 1 {
				t.Fatalf("dead-letter topic holds %d records, want 1", len(recs))
			}
			r := recs[0]
			want := map[string]string{
				"id": "unreadable-1", "outbox.dlq.reason": sink.ReasonSchemaMismatch, "outbox.dlq.error": cause.Error(),
				"outbox.dlq.original_topic": harness.TopicFor(aggType), "event_type": "Placed",
			}
			for h, v := range want {
				if r.Header(h) != v {
					t.Errorf("header %s = %q, want %q", h, r.Header(h), v)
				}
			}
			if string(r.Key) != "order-7" || r.Value != nil {
				t.Errorf("key %q value %q; want the aggregate id and no value", r.Key, r.Value)
			}
			s.mustClose(t)
		})
	}
}
