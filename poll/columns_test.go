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

// TestAggregateColumnsOfAnyTypeArePolled: the WAL mode reads the aggregate columns as text
// whatever their type, so a table whose aggregate_id is a uuid (or aggregate_type an enum) is a
// valid outbox. The claim coalesced them with an empty string for the aggregate lock, which failed on every
// claim for a uuid ("invalid input syntax for type uuid"), and nothing was ever published.
func TestAggregateColumnsOfAnyTypeArePolled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	typ := testenv.UniqueName(t, "order")
	if _, err := ob.Pool().Exec(ctx, `DROP VIEW outbox_dead_letters;
		CREATE TYPE agg_kind AS ENUM ('`+typ+`');
		ALTER TABLE outbox_events ALTER COLUMN aggregate_id TYPE uuid USING aggregate_id::uuid,
			ALTER COLUMN aggregate_type TYPE agg_kind USING aggregate_type::agg_kind;
		CREATE VIEW outbox_dead_letters AS SELECT * FROM outbox_events WHERE retry_after = 'infinity'`); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Pool().Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, '6a0c6d4e-8a39-4d5f-9d1c-2f0b1c7e0a11', 'E', jsonb_build_object('n', i) FROM generate_series(1, 3) i`, typ); err != nil {
		t.Fatal(err)
	}
	startPoller(t, dsn, brokers, poll.Config{}, sink.Config{})
	c := harness.NewConsumer(brokers, harness.TopicFor(typ))
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = c.ReadUntil(rctx, 0, func(recs []harness.Record) bool { return len(recs) >= 3 })
	recs := c.Records()
	if len(recs) != 3 {
		t.Fatalf("%d of 3 rows with a uuid aggregate_id and an enum aggregate_type published within 30s (%d pending)", len(recs), pendingRows(t, ob))
	}
	for _, r := range recs {
		if string(r.Key) != "6a0c6d4e-8a39-4d5f-9d1c-2f0b1c7e0a11" {
			t.Fatalf("key %q, want the aggregate id in its text form", r.Key)
		}
	}
}
