package poll_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/poll"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestALongAggregateQueueDoesNotHoldUpTheOthers: an aggregate whose rows cannot go now (another
// worker holds it, or its oldest row waits in backoff after a refusal) is skipped whole, and other
// aggregates go on, however many rows it has queued. A claim used to look only at the first four
// batches' worth of the queue: once one aggregate's rows filled them, every claim came back empty
// and the other aggregates waited for the holder's batch or the backoff (minutes).
func TestALongAggregateQueueDoesNotHoldUpTheOthers(t *testing.T) {
	t.Parallel()
	const batch, queued = 5, 40 * 5 // the held aggregate's rows: 40 batches, past several windows
	for _, tc := range []struct {
		name string
		// hold makes aggregate (typ, "a") unpublishable for now; it returns what the poller needs.
		hold func(t *testing.T, ctx context.Context, dsn string, ob *harness.Outbox, brokers, typ string) (poll.Config, func())
	}{
		{name: "held by another worker", hold: func(t *testing.T, ctx context.Context, dsn string, ob *harness.Outbox, brokers, typ string) (poll.Config, func()) {
			if err := ob.WriteTx(ctx, queue(typ, queued, 0)...); err != nil {
				t.Fatal(err)
			}
			// What a worker of another relay holds during its batch (or for as long as that relay is
			// frozen with its transaction open).
			return poll.Config{BatchSize: batch, Workers: 2}, aggregateLock(t, dsn, typ, "a")
		}},
		{name: "waiting behind its row in backoff", hold: func(t *testing.T, ctx context.Context, dsn string, ob *harness.Outbox, brokers, typ string) (poll.Config, func()) {
			// The aggregate's oldest row is too large for its topic: refused, then in backoff.
			if err := createTopic(ctx, brokers, harness.TopicFor(typ), map[string]string{"max.message.bytes": "2048"}); err != nil {
				t.Fatal(err)
			}
			if err := ob.WriteTx(ctx, queue(typ, queued, 4000)...); err != nil {
				t.Fatal(err)
			}
			return poll.Config{BatchSize: batch, Workers: 2, MaxAttempts: 5, RetryBackoff: 10 * time.Minute}, func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, ob := pollDB(t)
			brokers := testenv.SharedKafka(t).Brokers()
			held, other := testenv.UniqueName(t, "held"), testenv.UniqueName(t, "other")
			pc, release := tc.hold(t, ctx, dsn, ob, brokers, held)
			defer release()
			if err := ob.WriteTx(ctx, harness.Spec{AggregateType: other, AggregateID: "b"}); err != nil {
				t.Fatal(err)
			}
			startPoller(t, dsn, brokers, pc, sink.Config{})
			c := harness.NewConsumer(brokers, harness.TopicFor(other))
			defer c.Close()
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_ = c.ReadUntil(rctx, 0, func(recs []harness.Record) bool { return len(recs) >= 1 })
			if len(c.Records()) != 1 {
				t.Fatalf("the other aggregate's event was not published within 30s (%d rows pending): an aggregate that cannot go now must be skipped whole",
					pendingRows(t, ob))
			}
		})
	}
}

// queue is n events of aggregate (typ, "a"), the first padded by pad bytes.
func queue(typ string, n, pad int) []harness.Spec {
	specs := make([]harness.Spec, n)
	for i := range specs {
		specs[i] = harness.Spec{AggregateType: typ, AggregateID: "a"}
	}
	specs[0].PadBytes = pad
	return specs
}
