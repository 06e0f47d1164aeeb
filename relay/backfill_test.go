package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
)

func TestBackfillPublishesExistingRowsWithoutGapOrDuplicates(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()
	pool := f.outbox.Pool()

	// Rows from before the relay's first start: some too old for the backfill filter.
	for i := range 40 {
		spec := harness.Spec{AggregateType: f.types[i%2], AggregateID: fmt.Sprintf("agg-%d", i%7)}
		if err := f.outbox.WriteTx(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	old := f.outbox.Written()[:15]
	for _, w := range old {
		if _, err := pool.Exec(ctx, "UPDATE outbox_events SET created_at = now() - interval '3 days' WHERE id = $1", w.ID); err != nil {
			t.Fatal(err)
		}
	}

	// Keep writing while the relay creates its slot and backfills, so the snapshot boundary is
	// crossed by live traffic.
	writeCtx, stopWriting := context.WithCancel(ctx)
	written := make(chan struct{})
	go func() {
		defer close(written)
		for i := 0; writeCtx.Err() == nil; i++ {
			f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[i%2], AggregateID: fmt.Sprintf("agg-%d", i%7)})
		}
	}()
	cfg := f.config()
	cfg.Backfill = &relay.Backfill{Since: time.Now().Add(-24 * time.Hour)}
	stop := f.start(cfg)
	await.True(t, time.Minute, "the relay to create its slot (the backfill's snapshot)", func() bool {
		var n int
		f.outbox.Pool().QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&n)
		return n == 1
	})
	f.outbox.AwaitMore(t, 20, "after the slot's snapshot")
	stopWriting()
	<-written

	want := f.outbox.Written()[len(old):]
	rep := f.verifySubset(want, old, 2*time.Minute)
	if rep.Duplicates != 0 {
		t.Fatalf("backfill and stream overlapped: %s", rep)
	}
	t.Logf("backfilled and streamed: %s", rep)

	// A restart must not backfill again.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.start(cfg)
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "agg-last"}); err != nil {
		t.Fatal(err)
	}
	rep = f.verifySubset(f.outbox.Written()[len(old):], old, 2*time.Minute)
	if rep.Duplicates != 0 {
		t.Fatalf("the backfill ran again after a restart: %s", rep)
	}
}

// verifySubset checks that exactly want arrived (once each, in order) and none of absent did.
func (f *fixture) verifySubset(want, absent []harness.Written, timeout time.Duration) harness.Report {
	f.t.Helper()
	c := harness.NewConsumer(f.brokers, harness.Topics(f.outbox.Written(), nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := c.ReadUntil(ctx, 2*time.Second, func(recs []harness.Record) bool {
		return harness.Verify(want, recs, nil).Missing == 0
	})
	excluded := make(map[string]bool, len(absent))
	for _, w := range absent {
		excluded[w.ID] = true
	}
	var kept []harness.Record
	for _, r := range c.Records() {
		if excluded[r.Header("id")] {
			f.t.Fatalf("event %s is older than the backfill filter but was published", r.Header("id"))
		}
		kept = append(kept, r)
	}
	rep := harness.Verify(want, kept, nil)
	if err != nil || !rep.OK() {
		f.t.Fatalf("delivery check failed (read error: %v): %s", err, rep)
	}
	return rep
}

// TestBackfillKeepsEachAggregatesInsertionOrder writes, before the relay's first start, transactions
// of several events of one aggregate (equal created_at, random ids) and transactions of one
// aggregate that interleave: the later-started one inserts and commits first, so created_at order
// is the reverse of commit order. The backfill must publish every aggregate in insertion order.
func TestBackfillKeepsEachAggregatesInsertionOrder(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()
	pool := f.outbox.Pool()

	for i := range 12 {
		typ, agg := f.types[i%2], fmt.Sprintf("agg-%d", i%3)
		specs := []harness.Spec{{AggregateType: typ, AggregateID: agg}, {AggregateType: typ, AggregateID: agg}, {AggregateType: typ, AggregateID: agg}}
		if err := f.outbox.WriteTx(ctx, specs...); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		spec := harness.Spec{AggregateType: f.types[i%2], AggregateID: fmt.Sprintf("agg-%d", i%3)}
		early, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// now() is the transaction's start: take it before the other transaction starts.
		if _, err := early.Exec(ctx, "SELECT now()"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		if err := f.outbox.WriteTx(ctx, spec, spec); err != nil {
			t.Fatal(err)
		}
		commit, err := f.outbox.WriteIn(ctx, early, spec, spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := early.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		commit()
	}

	cfg := f.config()
	cfg.Backfill = &relay.Backfill{}
	f.start(cfg)
	rep := f.verifySubset(f.outbox.Written(), nil, 2*time.Minute)
	if rep.Duplicates != 0 {
		t.Fatalf("backfill published duplicates: %s", rep)
	}
}

// TestBackfillOfATableWithoutAnInsertionSequenceWarnsAndPublishesEverything: a table of the user's
// own making without seq still backfills, in created_at order, and the log says what that risks.
func TestBackfillOfATableWithoutAnInsertionSequenceWarnsAndPublishesEverything(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()
	if _, err := f.outbox.Pool().Exec(ctx, "ALTER TABLE outbox_events DROP COLUMN seq"); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[i%2], AggregateID: fmt.Sprintf("agg-%d", i%3)}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := f.config()
	cfg.Backfill = &relay.Backfill{}
	core, logs := observer.New(zap.WarnLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	r, err := relay.New(cfg, log, metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	rep := f.verifySubset(f.outbox.Written(), nil, 2*time.Minute)
	if rep.Duplicates != 0 {
		t.Fatalf("backfill published duplicates: %s", rep)
	}
	if logs.FilterMessageSnippet("no insertion sequence column").Len() == 0 {
		t.Fatal("no warning that the table has no insertion sequence column")
	}
}

// TestBackfillWithAMissingConfiguredOrderColumnStopsTheRelay: only the default seq may fall back to
// created_at order; a backfill_order_column the operator named that the table lacks (a typo, an
// unmigrated table) is an error naming the key, and nothing is published out of order meanwhile.
func TestBackfillWithAMissingConfiguredOrderColumnStopsTheRelay(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "agg"}); err != nil {
		t.Fatal(err)
	}
	cfg := f.config()
	cfg.Backfill = &relay.Backfill{OrderColumn: "position"}
	r, err := relay.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = r.Run(runCtx)
	if runCtx.Err() != nil || err == nil || !strings.Contains(err.Error(), "backfill_order_column") || !strings.Contains(err.Error(), "position") {
		t.Fatalf("Run with a missing backfill_order_column: %v (context: %v), want an error naming the key and the column", err, runCtx.Err())
	}
	t.Logf("stopped: %v", err)
}

// TestBackfillWithoutTheCreationTimeColumnStopsTheRelayNamingTheKey: a table without the
// columns.created_at column (Debezium's outbox table has none) cannot be backfilled; the error names
// the key and the column, not a bare SQL error.
func TestBackfillWithoutTheCreationTimeColumnStopsTheRelayNamingTheKey(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "agg"}); err != nil {
		t.Fatal(err)
	}
	cfg := f.config()
	cfg.Backfill = &relay.Backfill{CreatedColumn: "occurred"}
	r, err := relay.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = r.Run(runCtx)
	if runCtx.Err() != nil || err == nil || !strings.Contains(err.Error(), "columns.created_at") || !strings.Contains(err.Error(), `"occurred"`) {
		t.Fatalf("Run without the creation time column: %v (context: %v), want an error naming columns.created_at and the column", err, runCtx.Err())
	}
	t.Logf("stopped: %v", err)
}

// TestBackfillWhereIsOneConditionAndCannotLeaveTheReadOnlyTransaction: backfill_where is pasted
// into the backfill's query. A filter that closes the condition and adds statements (issue 46)
// must write nothing and stop the relay naming the key; a legitimate filter selects its rows.
func TestBackfillWhereIsOneConditionAndCannotLeaveTheReadOnlyTransaction(t *testing.T) {
	t.Run("an injected COMMIT and DELETE write nothing and stop the relay", func(t *testing.T) {
		f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
		ctx := context.Background()
		for i := range 3 {
			if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: fmt.Sprintf("agg-%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		for _, where := range []string{
			"false); COMMIT; DELETE FROM outbox_events; SELECT (1",
			// The same, ending in a statement that succeeds (so its implicit transaction commits).
			"false); COMMIT; DELETE FROM outbox_events; SELECT 1 FROM outbox_events WHERE (true",
			// One statement still, but not one condition: it closes the parenthesis and ORs away
			// the conditions beside it, or comments out the ORDER BY after it (per-aggregate
			// order lost, silently).
			"aggregate_id = 'agg-0') OR (true",
			"true) -- the rest of the line is a comment",
		} {
			cfg := f.config()
			cfg.Backfill = &relay.Backfill{Where: where}
			r, err := relay.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithTimeout(ctx, time.Minute)
			err = r.Run(runCtx)
			if runCtx.Err() != nil || err == nil || !strings.Contains(err.Error(), "backfill_where") {
				t.Errorf("Run with backfill_where %q: %v (context: %v), want an error naming the key", where, err, runCtx.Err())
			}
			cancel()
			var n int
			if err := f.outbox.Pool().QueryRow(ctx, "SELECT count(*) FROM outbox_events").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 3 {
				t.Fatalf("%d outbox rows left of 3 after backfill_where %q: the filter ran statements of its own", n, where)
			}
		}
	})
	t.Run("a legitimate filter publishes only the rows it selects", func(t *testing.T) {
		f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
		ctx := context.Background()
		for i := range 4 {
			if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: fmt.Sprintf("agg-%d", i%2)}); err != nil {
				t.Fatal(err)
			}
		}
		var want, absent []harness.Written
		for _, w := range f.outbox.Written() {
			if w.AggregateID == "agg-1" {
				want = append(want, w)
			} else {
				absent = append(absent, w)
			}
		}
		cfg := f.config()
		cfg.Backfill = &relay.Backfill{Where: "aggregate_id = 'agg-1' AND payload IS NOT NULL"}
		f.start(cfg)
		f.verifySubset(want, absent, 2*time.Minute)
	})
}
