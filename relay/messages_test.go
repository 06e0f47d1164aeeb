package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sink"
)

// newMessagesFixture is newFixture for the table-free outbox: a database without an outbox table
// (only the relay's ledger), whose harness writes every event as a logical decoding message with
// the fixture's own prefix.
func newMessagesFixture(t *testing.T, pg *devenv.Postgres, brokers string, nTypes int) *fixture {
	t.Helper()
	dsn := testenv.MessagesDatabase(t, pg)
	ob, err := harness.NewOutbox(context.Background(), dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ob.Close)
	f := &fixture{t: t, dsn: dsn, brokers: brokers, slot: testenv.UniqueName(t, "slot"), outbox: ob}
	for i := range nTypes {
		f.types = append(f.types, testenv.UniqueName(t, fmt.Sprintf("agg%d", i)))
	}
	ob.UseMessages(f.prefix(), 1)
	return f
}

// prefix is the fixture's messages_prefix: its own, so that nothing else's messages count.
func (f *fixture) prefix() string { return "outbox." + f.slot }

// messagesConfig reads messages with the fixture's prefix, alongside the table or (noTable)
// instead of it.
func (f *fixture) messagesConfig(noTable bool) relay.Config {
	cfg := f.config()
	cfg.Decoder.MessagePrefix = f.prefix()
	cfg.Decoder.NoTable = noTable
	return cfg
}

func TestMessagesOnlyOutboxDeliversEveryEventInCommitOrderWithoutATable(t *testing.T) {
	f := newMessagesFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 3)
	ctx := context.Background()
	pool := f.outbox.Pool()
	var table bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('public.outbox_events') IS NOT NULL").Scan(&table); err != nil || table {
		t.Fatalf("the database has an outbox table (%v): the test must prove the relay needs none", err)
	}
	stop := f.start(f.messagesConfig(true))
	var pubTables int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1", f.slot).Scan(&pubTables); err != nil || pubTables != 0 {
		t.Fatalf("the relay's publication lists %d tables (%v), want an empty one", pubTables, err)
	}

	rng := rand.New(rand.NewPCG(21, 22))
	f.writeMany(ctx, rng, 200, 5, 30)
	big := make([]harness.Spec, 4000)
	for i := range big {
		big[i] = harness.Spec{AggregateType: f.types[i%len(f.types)], AggregateID: fmt.Sprintf("agg-%d", i%30)}
	}
	if err := f.outbox.WriteTx(ctx, big...); err != nil {
		t.Fatal(err)
	}
	// What must not be published: a rolled-back transaction's messages, a message in a subtransaction
	// rolled back to its savepoint, messages with another prefix, and a non-transactional message with
	// the outbox prefix (not tied to any commit: ignored with a warning).
	foreign := `{"id":"foreign","aggregate_type":"` + f.types[0] + `","aggregate_id":"agg-1"}`
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", f.prefix(), foreign)
		if err != nil {
			return err
		}
		return fmt.Errorf("roll back")
	}); err == nil || err.Error() != "roll back" {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'other.prefix', $1), pg_logical_emit_message(false, $2, $1),
		pg_logical_emit_message(true, $2 || '.v2', $1)`, foreign, f.prefix()); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	commit, err := f.outbox.WriteIn(ctx, tx, harness.Spec{AggregateType: f.types[1], AggregateID: "agg-2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SAVEPOINT s1; SELECT pg_logical_emit_message(true, '"+f.prefix()+"', '"+foreign+"'); ROLLBACK TO SAVEPOINT s1"); err != nil {
		t.Fatal(err)
	}
	commit2, err := f.outbox.WriteIn(ctx, tx, harness.Spec{AggregateType: f.types[1], AggregateID: "agg-2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	commit()
	commit2()
	f.writeMany(ctx, rng, 30, 5, 30)

	rep := f.verify(2*time.Minute, false) // Verify counts any record with an unknown id as a failure
	t.Logf("delivered: %s", rep)
	end := f.currentLSN()
	await.True(t, 30*time.Second, "the slot to be confirmed past the last transaction", func() bool {
		return f.confirmedLSN() >= end
	})
	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}

	// A restart resumes from the slot: messages written meanwhile arrive, nothing twice.
	f.writeMany(ctx, rng, 20, 3, 30)
	f.start(f.messagesConfig(true))
	f.writeMany(ctx, rng, 20, 3, 30)
	rep = f.verify(2*time.Minute, false)
	t.Logf("after a clean restart: %s", rep)
}

func TestTableRowsAndMessagesInOneTransactionKeepCommitOrder(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	f.outbox.UseMessages(f.prefix(), 2) // every other event a message, interleaved with rows
	f.start(f.messagesConfig(false))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(23, 24))
	// Few aggregates, so each one's events alternate between rows and messages within and across
	// transactions; Verify requires every aggregate's sequence to arrive in commit order.
	f.writeMany(ctx, rng, 300, 6, 8)
	big := make([]harness.Spec, 3001)
	for i := range big {
		big[i] = harness.Spec{AggregateType: f.types[i%2], AggregateID: fmt.Sprintf("agg-%d", i%8)}
	}
	if err := f.outbox.WriteTx(ctx, big...); err != nil {
		t.Fatal(err)
	}
	f.writeMany(ctx, rng, 50, 6, 8)
	written := f.outbox.Written()
	var rows, msgs int
	var rowCount int
	if err := f.outbox.Pool().QueryRow(ctx, "SELECT count(*) FROM outbox_events").Scan(&rowCount); err != nil {
		t.Fatal(err)
	}
	rows, msgs = rowCount, len(written)-rowCount
	if rows < len(written)/3 || msgs < len(written)/3 {
		t.Fatalf("%d rows and %d messages: the mix is not what the test means to check", rows, msgs)
	}
	rep := f.verify(2*time.Minute, false)
	t.Logf("%d rows and %d messages delivered: %s", rows, msgs, rep)
	end := f.currentLSN()
	await.True(t, 30*time.Second, "the slot to be confirmed past the last transaction", func() bool {
		return f.confirmedLSN() >= end
	})
}

func TestInvalidMessagesGoToTheFailurePolicy(t *testing.T) {
	brokers := testenv.SharedKafka(t).Brokers()
	f := newMessagesFixture(t, testenv.SharedPostgres(t), brokers, 1)
	cfg := f.messagesConfig(true)
	dlq := testenv.UniqueName(t, "dlq")
	cfg.Sink.Policy, cfg.Sink.DeadLetterTopic = sink.DeadLetter, dlq
	cfg.Decoder.Extra = []string{"tenant"}
	cfg.Sink.Record.ExtraHeaders = []string{"tenant"}
	f.start(cfg)
	ctx := context.Background()
	typ := f.types[0]
	bad := []struct{ content, why, key string }{
		{`{"id": "bad-1", "aggregate_type": "` + typ + `", oops`, "not valid JSON", ""},
		{`{"id": "bad-2", "aggregate_type": "` + typ + `", "tenant": "acme"}`, `"aggregate_id" is missing`, ""},
		{`{"id": "bad-3", "aggregate_type": "` + typ + `", "aggregate_id": 7}`, `"aggregate_id" must be a JSON string`, ""},
		{`["not", "an", "object"]`, "must be a JSON object", ""},
		{`{"aggregate_type": "` + typ + `", "aggregate_id": "k-4"}`, `"id" is missing`, "k-4"},
	}
	// Each bad message shares its transaction with good events of the same aggregate.
	for _, b := range bad {
		tx, err := f.outbox.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c1, err := f.outbox.WriteIn(ctx, tx, harness.Spec{AggregateType: typ, AggregateID: "agg-1"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", f.prefix(), b.content); err != nil {
			t.Fatal(err)
		}
		c2, err := f.outbox.WriteIn(ctx, tx, harness.Spec{AggregateType: typ, AggregateID: "agg-1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		c1()
		c2()
	}
	f.verify(time.Minute, false)
	end := f.currentLSN()

	c := harness.NewConsumer(brokers, dlq)
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.ReadUntil(rctx, time.Second, func(recs []harness.Record) bool { return len(recs) >= len(bad) }); err != nil {
		t.Fatalf("dead-letter topic %s: %v", dlq, err)
	}
	recs := c.Records()
	if len(recs) != len(bad) {
		t.Fatalf("dead-letter topic holds %d records, want the %d invalid messages", len(recs), len(bad))
	}
	byValue := make(map[string]harness.Record)
	for _, r := range recs {
		byValue[string(r.Value)] = r
	}
	for _, b := range bad {
		rec, ok := byValue[b.content]
		if !ok {
			t.Errorf("no dead-letter record whose value is the content %s", b.content)
			continue
		}
		if rec.Header("outbox.dlq.reason") != "invalid_message" || !strings.Contains(rec.Header("outbox.dlq.error"), b.why) {
			t.Errorf("%s: reason %q error %q, want invalid_message and %q", b.content, rec.Header("outbox.dlq.reason"), rec.Header("outbox.dlq.error"), b.why)
		}
		if string(rec.Key) != b.key {
			t.Errorf("%s: key %q, want %q", b.content, rec.Key, b.key)
		}
	}
	if rec := byValue[bad[1].content]; rec.Header("id") != "bad-2" || rec.Header("tenant") != "acme" {
		t.Errorf("the dead-letter record lacks what could be read: id %q tenant %q", rec.Header("id"), rec.Header("tenant"))
	}
	await.True(t, 30*time.Second, "the slot to be confirmed past the invalid messages", func() bool {
		return f.confirmedLSN() >= end
	})
}

func TestMessagesOnlyRefusesABackfill(t *testing.T) {
	cfg := relay.Config{Decoder: decoder.Config{MessagePrefix: "outbox", NoTable: true}, Backfill: &relay.Backfill{},
		Sink: sink.Config{Brokers: []string{"localhost:9092"}}}
	if _, err := relay.New(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "backfill") {
		t.Fatalf("New = %v, want an error about the backfill", err)
	}
}
