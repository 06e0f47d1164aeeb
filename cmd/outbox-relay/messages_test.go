package main_test

import (
	"context"
	"database/sql"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// TestTableFreeOutboxFromMigrateToKafka runs the documented messages-only setup on a fresh
// database: migrate creates the slot ledger and an empty publication and no outbox table; run
// streams; events emitted by hand in SQL (the README's example transaction), with outbox.Emit
// (pgx) and with outbox.EmitSQL (database/sql) arrive as the same records the table would give,
// with their aggregate versions, in both delivery modes (exactly-once read with read_committed).
func TestTableFreeOutboxFromMigrateToKafka(t *testing.T) {
	t.Parallel()
	for _, delivery := range []string{"at-least-once", "exactly-once"} {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			tableFreeOutbox(t, delivery)
		})
	}
}

func tableFreeOutbox(t *testing.T, delivery string) {
	ctx := context.Background()
	pg, k := testenv.SharedPostgres(t), testenv.SharedKafka(t)
	e := newE2E(t, pgPassword)
	db := newDatabase(t, pg)
	slot := testenv.UniqueName(t, "slot")
	env := relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS="+k.Brokers(), "OUTBOX_OUTBOX_SHAPE=messages",
		"OUTBOX_SLOT="+slot, "OUTBOX_PUBLICATION="+slot, "OUTBOX_DELIVERY="+delivery,
		"OUTBOX_TRANSACTIONAL_ID="+slot, "OUTBOX_POSITIONS_TOPIC="+slot+".positions",
		"OUTBOX_COLUMNS_AGGREGATE_VERSION=aggregate_version")
	e.mustRun("migrate", env, "migrate")
	var table, ledger bool
	var pubTables int
	if err := db.pool.QueryRow(ctx, `SELECT to_regclass('public.outbox_events') IS NOT NULL, to_regclass('public.outbox_relay_slots') IS NOT NULL,
		(SELECT count(*) FROM pg_publication_tables WHERE pubname = $1)`, slot).Scan(&table, &ledger, &pubTables); err != nil {
		t.Fatal(err)
	}
	if table || !ledger || pubTables != 0 {
		t.Fatalf("after migrate: outbox table %t, ledger %t, %d published tables; want no table, the ledger, an empty publication", table, ledger, pubTables)
	}

	relay := e.relay("relay", env, "run", "--shutdown-timeout="+shutdownTimeout.String())
	waitSlotActive(t, db.pool, slot, relay)
	typ := testenv.UniqueName(t, "order")
	db.exec(t, "CREATE TABLE orders (id text PRIMARY KEY, customer text, total numeric)")

	// The README's example transaction, by hand.
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, customer, total) VALUES ('o-1001', 'ada', 42.00)"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', jsonb_build_object(
			'id', 'a3f1c2d4-0b5e-4c6f-8a7b-9c0d1e2f3a4b', 'aggregate_type', $1::text, 'aggregate_id', 'o-1001',
			'event_type', 'OrderCreated', 'payload', jsonb_build_object('id', 'o-1001', 'total', 42.00),
			'headers', jsonb_build_object('tenant', 'acme'), 'aggregate_version', 1)::text)`, typ)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{AggregateType: typ, AggregateID: "o-1001", EventType: "OrderPaid", Payload: map[string]any{"paid": true},
		Headers: map[string]string{"tenant": "acme"}, AggregateVersion: 2}
	cols := outbox.DefaultColumns
	cols.AggregateVersion = "aggregate_version"
	em, err := outbox.NewEmitter(outbox.EmitterConfig{Columns: cols})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		ids, err = em.Emit(ctx, tx, ev)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sqlDB, err := sql.Open("pgx", db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev.EventType, ev.Payload, ev.AggregateVersion = "OrderShipped", nil, 3
	more, err := em.EmitSQL(ctx, tx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	want := []struct {
		id, eventType, value, version string
	}{
		{"a3f1c2d4-0b5e-4c6f-8a7b-9c0d1e2f3a4b", "OrderCreated", `{"id": "o-1001", "total": 42.00}`, "1"},
		{ids[0], "OrderPaid", `{"paid":true}`, "2"},
		{more[0], "OrderShipped", "", "3"},
	}
	c := harness.NewConsumer(k.Brokers(), "outbox.event."+typ)
	if delivery == "exactly-once" {
		c = harness.NewCommittedConsumer(k.Brokers(), "outbox.event."+typ)
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, deliverTimeout)
	defer cancel()
	if err := c.ReadUntil(rctx, 500*time.Millisecond, func(recs []harness.Record) bool { return len(recs) >= len(want) }); err != nil {
		t.Fatal(err)
	}
	recs := c.Records()
	if len(recs) != len(want) {
		t.Fatalf("topic holds %d records, want %d", len(recs), len(want))
	}
	for i, w := range want {
		got := recs[i] // one aggregate: one partition, in commit order
		headers := map[string]string{"id": w.id, "event_type": w.eventType, "aggregate_type": typ, "tenant": "acme", "aggregate_version": w.version}
		if string(got.Key) != "o-1001" || string(got.Value) != w.value || (w.value == "" && got.Value != nil) || !maps.Equal(got.Headers, headers) {
			t.Errorf("record %d: key %q value %q headers %v; want o-1001, %q, %v", i, got.Key, got.Value, got.Headers, w.value, headers)
		}
	}
	stopRelay(t, relay)
}
