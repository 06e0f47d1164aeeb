package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestRouterOptionsFromTheTableToKafka runs Debezium's router options end to end on a real
// PostgreSQL and Kafka: the record timestamp from a timestamptz column (else the commit time), the
// partition from a column, trace headers from Debezium's tracingspancontext, regex routing; then an
// UPDATE of the outbox with on_update fatal stops the relay before the transaction.
func TestRouterOptionsFromTheTableToKafka(t *testing.T) {
	k := testenv.SharedKafka(t)
	f := newFixture(t, testenv.SharedPostgres(t), k.Brokers(), 1)
	ctx := context.Background()
	f.exec(ctx, `ALTER TABLE outbox_events ADD COLUMN occurred_at timestamptz, ADD COLUMN partitionno int, ADD COLUMN tracingspancontext text`)
	typ := f.types[0]
	topic := "routed." + typ + ".events"
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	cfg := f.config()
	cfg.Replication.Columns = append(cfg.Replication.Columns, "occurred_at", "partitionno", "tracingspancontext")
	cfg.Decoder.Columns.Timestamp, cfg.Decoder.Columns.TracingSpanContext = "occurred_at", "tracingspancontext"
	cfg.Decoder.Extra = []string{"partitionno"}
	cfg.Sink.Record.ExtraHeaders, cfg.Sink.Record.ExtraPlacement = []string{"partitionno"}, []record.Placement{record.PlacePartition}
	cfg.Sink.Record.TopicRegex, cfg.Sink.Record.TopicReplacement = `(?<type>.*)`, "routed.${type}.events"
	cfg.OnUpdate = "fatal"
	// The publication sends UPDATEs from the start: altering it under a running relay stops the
	// relay by itself (the publication check cannot tell what it left out meanwhile).
	f.exec(ctx, "CREATE PUBLICATION "+f.slot+" FOR TABLE outbox_events WITH (publish = 'insert, update')")
	run := f.launch(cfg)
	f.waitSlotActive()

	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var txStart time.Time
	if err := f.outbox.Pool().QueryRow(ctx, `WITH w AS (INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload, occurred_at, partitionno, tracingspancontext)
		VALUES ('11111111-1111-4111-8111-111111111111', $1, 'a-1', 'E', '{"n": 1}', '2026-01-02 03:04:05.678901+05:30', 3, $2),
		       ('22222222-2222-4222-8222-222222222222', $1, 'a-1', 'E', '{"n": 2}', NULL, NULL, NULL)
		RETURNING 1) SELECT now() FROM w LIMIT 1`, typ, "#Tue Jan 02 UTC 2026\ntraceparent="+tp+"\ntracestate=k\\=v\n").Scan(&txStart); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()

	c := harness.NewConsumer(k.Brokers(), topic)
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.ReadUntil(rctx, time.Second, func(recs []harness.Record) bool { return len(recs) >= 2 }); err != nil {
		t.Fatal(err)
	}
	byID := map[string]harness.Record{}
	for _, r := range c.Records() {
		byID[r.Header("id")] = r
	}
	own, commit := byID["11111111-1111-4111-8111-111111111111"], byID["22222222-2222-4222-8222-222222222222"]
	if want := time.Date(2026, 1, 1, 21, 34, 5, 678000000, time.UTC); !own.Time.Equal(want) {
		t.Errorf("record timestamp %s, want the column's %s (to the millisecond)", own.Time.UTC(), want)
	}
	if commit.Time.Before(txStart.Truncate(time.Millisecond)) || commit.Time.After(committed) {
		t.Errorf("record timestamp %s of the row without one: want its commit time, between %s and %s", commit.Time.UTC(), txStart.UTC(), committed.UTC())
	}
	if own.Partition != 3 {
		t.Errorf("partition %d, want 3 from the partition column", own.Partition)
	}
	if own.Header("traceparent") != tp || own.Header("tracestate") != "k=v" || commit.Header("traceparent") != "" {
		t.Errorf("trace headers %v and %v", own.Headers, commit.Headers)
	}

	// An UPDATE is never an event; with on_update fatal it stops the relay before its transaction.
	before := f.confirmedLSN()
	f.exec(ctx, "UPDATE outbox_events SET event_type = 'Changed' WHERE aggregate_id = 'a-1'")
	updated := f.currentLSN()
	select {
	case err := <-run.done:
		if err == nil || !strings.Contains(err.Error(), "on_update is fatal") {
			t.Fatalf("the relay stopped with %v, want the UPDATE named", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the relay did not stop on the UPDATE")
	}
	if got := f.confirmedLSN(); got >= updated {
		t.Errorf("the slot was confirmed to %X, past the UPDATE's transaction (%X; %X before it)", got, updated, before)
	}
}
