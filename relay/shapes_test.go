package relay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// outboxColumns is the outbox table's definition without constraints, for recreating it.
const outboxColumns = `id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
	aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, headers jsonb,
	created_at timestamptz NOT NULL DEFAULT now()`

// partitionOutbox replaces the fixture's outbox table with a partitioned one: a range partition
// around now that is itself hash-partitioned (so rows land in partitions of a partition), and a
// default partition.
func (f *fixture) partitionOutbox(ctx context.Context) {
	f.t.Helper()
	f.exec(ctx,
		"DROP TABLE outbox_events",
		"CREATE TABLE outbox_events ("+outboxColumns+", PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)",
		"CREATE TABLE outbox_events_cur PARTITION OF outbox_events FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '1 day') PARTITION BY HASH (id)",
		"CREATE TABLE outbox_events_cur_0 PARTITION OF outbox_events_cur FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
		"CREATE TABLE outbox_events_cur_1 PARTITION OF outbox_events_cur FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
		"CREATE TABLE outbox_events_default PARTITION OF outbox_events DEFAULT",
	)
}

func (f *fixture) exec(ctx context.Context, stmts ...string) {
	f.t.Helper()
	for _, s := range stmts {
		if _, err := f.outbox.Pool().Exec(ctx, s); err != nil {
			f.t.Fatalf("%s: %v", s, err)
		}
	}
}

// run starts a relay and returns a channel with Run's result, for tests that expect it to stop.
func (f *fixture) run(cfg relay.Config) <-chan error {
	f.t.Helper()
	r, err := relay.New(cfg, zaptest.NewLogger(f.t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { done <- r.Run(ctx); close(finished) }()
	f.t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(time.Minute):
			f.t.Error("relay did not stop within a minute")
		}
	})
	return done
}

// writer writes transactions until stopped, so DDL happens while events stream.
func (f *fixture) writer(ctx context.Context, seed uint64) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, seed))
		for wctx.Err() == nil {
			specs := make([]harness.Spec, 1+rng.IntN(3))
			for i := range specs {
				specs[i] = harness.Spec{AggregateType: f.types[rng.IntN(len(f.types))], AggregateID: fmt.Sprintf("agg-%d", rng.IntN(20))}
			}
			if err := f.outbox.WriteTx(wctx, specs...); err != nil && wctx.Err() == nil {
				f.t.Errorf("write: %v", err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		// A transaction cut off by the cancel may have committed: settle it, or its events would
		// arrive as unknown ones.
		rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
		defer rcancel()
		if n, err := f.outbox.ResolveUncertain(rctx); err != nil || n > 0 {
			f.t.Fatalf("%d transactions of unknown outcome: %v", n, err)
		}
	}
}

// TestPartitionedOutboxDeliversEveryEventWhilePartitionsChange streams a partitioned outbox table
// while a partition is attached and rows move into it, and the original one is detached and
// dropped: every event must arrive once, in order.
func TestPartitionedOutboxDeliversEveryEventWhilePartitionsChange(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()
	f.partitionOutbox(ctx)
	f.start(f.config())

	stopWriter := f.writer(ctx, 7)
	step := func(stmts ...string) {
		time.Sleep(300 * time.Millisecond)
		f.exec(ctx, stmts...)
	}
	step("CREATE TABLE outbox_events_next (" + outboxColumns + ", PRIMARY KEY (id, created_at))")
	step("ALTER TABLE outbox_events ATTACH PARTITION outbox_events_next FOR VALUES FROM (now() + interval '1 day') TO (now() + interval '3 days')")
	step("ALTER TABLE outbox_events ALTER COLUMN created_at SET DEFAULT now() + interval '2 days'") // rows go to the new partition
	step("ALTER TABLE outbox_events DETACH PARTITION outbox_events_cur")
	step("DROP TABLE outbox_events_cur")
	step("ALTER TABLE outbox_events ALTER COLUMN created_at SET DEFAULT now() + interval '10 days'") // and to the default one
	time.Sleep(300 * time.Millisecond)
	stopWriter()

	var counts [3]int
	for i, table := range []string{"outbox_events_next", "outbox_events_default", "outbox_events_cur"} {
		f.outbox.Pool().QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&counts[i])
	}
	if counts[0] == 0 || counts[1] == 0 {
		t.Fatalf("rows per partition %v: the test did not route rows through every partition", counts)
	}
	rep := f.verify(2*time.Minute, false)
	t.Logf("delivered through changing partitions: %s", rep)
}

// TestPartitionedOutboxWithLeafNamedWAL covers WAL written while the publication did not publish
// through the partition root: pgoutput names the leaf partitions for it even after the setting is
// changed, including leaves detached or dropped since. Without create_publication the relay
// refuses with the exact fix; with it, it sets the option and publishes the rows written before as
// well as after.
func TestPartitionedOutboxWithLeafNamedWAL(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()
	f.partitionOutbox(ctx)
	f.exec(ctx,
		fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox_events WITH (publish = 'insert')", f.slot),
		fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", f.slot),
	)
	rng := rand.New(rand.NewPCG(8, 9))
	f.writeMany(ctx, rng, 100, 3, 20)
	// Rows in two more leaves, one detached afterwards (it exists, outside the outbox) and one
	// detached and dropped: their WAL names relations today's catalog cannot place under the outbox.
	f.exec(ctx, "CREATE TABLE outbox_events_later PARTITION OF outbox_events FOR VALUES FROM (now() + interval '5 days') TO (now() + interval '20 days')",
		"ALTER TABLE outbox_events ALTER COLUMN created_at SET DEFAULT now() + interval '10 days'")
	f.writeMany(ctx, rng, 20, 3, 20)
	f.exec(ctx, "ALTER TABLE outbox_events ALTER COLUMN created_at SET DEFAULT now() + interval '30 days'")
	f.writeMany(ctx, rng, 20, 3, 20)
	f.exec(ctx, "ALTER TABLE outbox_events ALTER COLUMN created_at SET DEFAULT now()",
		"ALTER TABLE outbox_events DETACH PARTITION outbox_events_later",
		"ALTER TABLE outbox_events DETACH PARTITION outbox_events_default",
		"DROP TABLE outbox_events_default")

	cfg := f.config()
	cfg.Replication.CreatePublication = false
	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r, err := relay.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(runCtx)
	want := fmt.Sprintf(`ALTER PUBLICATION "%s" SET (publish_via_partition_root = true)`, f.slot)
	if !replication.IsFatal(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Run without create_publication = %v; want a fatal error saying %q", err, want)
	}

	f.start(f.config())
	f.writeMany(ctx, rng, 50, 3, 20)
	rep := f.verify(2*time.Minute, false)
	t.Logf("delivered from leaf-named and root-named WAL: %s", rep)
}

// waitStopped waits for Run's result and checks that it is a fatal error containing every want.
func waitStopped(t *testing.T, done <-chan error, timeout time.Duration, want ...string) {
	t.Helper()
	select {
	case err := <-done:
		if !replication.IsFatal(err) {
			t.Fatalf("Run = %v; want a fatal error", err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not contain %q", err, w)
			}
		}
	case <-time.After(timeout):
		t.Fatalf("the relay did not stop within %s", timeout)
	}
}

// TestOutboxChangedWhileStreamingStopsLoudly drops and recreates the outbox table, removes it
// from the publication, or makes it or a partition of it UNLOGGED (no WAL for its rows; PostgreSQL
// refuses that only for a table the publication lists by name) while the relay streams, and writes
// events into it: pgoutput sends none of them, so the relay must stop with an error that says what
// happened, and must not have confirmed the slot past the change.
func TestOutboxChangedWhileStreamingStopsLoudly(t *testing.T) {
	unlogged := []string{"UNLOGGED", "SET LOGGED", "backfill_since"}
	tests := []struct {
		name    string
		setup   func(ctx context.Context, f *fixture) // before the relay starts
		change  func(f *fixture) []string
		want    []string
		noTable bool // nothing can be written afterwards
	}{
		{
			name:    "dropped",
			change:  func(f *fixture) []string { return []string{"DROP TABLE outbox_events"} },
			want:    []string{"outbox_events", "no longer exists", "ADD TABLE"},
			noTable: true,
		},
		{
			name: "dropped and recreated",
			change: func(f *fixture) []string {
				// One statement string, so one transaction: a check between the two would rightly
				// report the table gone instead.
				return []string{"DROP TABLE outbox_events; CREATE TABLE outbox_events (" + outboxColumns + ", PRIMARY KEY (id))"}
			},
			want: []string{"outbox_events", "recreated", "ADD TABLE"},
		},
		{
			name: "removed from the publication",
			change: func(f *fixture) []string {
				return []string{fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE outbox_events", f.slot)}
			},
			want: []string{"outbox_events", "publication", "ADD TABLE"},
		},
		{
			name:  "partitions made unlogged",
			setup: func(ctx context.Context, f *fixture) { f.partitionOutbox(ctx) },
			change: func(*fixture) []string {
				return []string{"ALTER TABLE outbox_events_cur_0 SET UNLOGGED", "ALTER TABLE outbox_events_cur_1 SET UNLOGGED"}
			},
			want: append([]string{"outbox_events_cur_0"}, unlogged...),
		},
		{
			name:  "an unlogged partition attached",
			setup: func(ctx context.Context, f *fixture) { f.partitionOutbox(ctx) },
			change: func(*fixture) []string {
				return []string{
					"CREATE UNLOGGED TABLE outbox_events_next (LIKE outbox_events INCLUDING DEFAULTS)",
					"ALTER TABLE outbox_events ATTACH PARTITION outbox_events_next FOR VALUES FROM (now() + interval '3 days') TO (now() + interval '10 days')",
					`INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
						VALUES ('t', 'next', 'E', '{}', now() + interval '5 days')`,
				}
			},
			want: append([]string{"outbox_events_next"}, unlogged...),
		},
		{
			name: "made unlogged under a schema publication",
			setup: func(ctx context.Context, f *fixture) {
				f.exec(ctx, "CREATE PUBLICATION "+f.slot+" FOR TABLES IN SCHEMA public WITH (publish = 'insert')")
			},
			change: func(*fixture) []string { return []string{"ALTER TABLE outbox_events SET UNLOGGED"} },
			want:   append([]string{"outbox_events"}, unlogged...),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
			ctx := context.Background()
			if tt.setup != nil {
				tt.setup(ctx, f)
			}
			done := f.run(f.config())
			f.waitSlotActive()
			rng := rand.New(rand.NewPCG(10, 11))
			f.writeMany(ctx, rng, 20, 2, 5)
			f.verify(time.Minute, false)

			f.exec(ctx, tt.change(f)...)
			before := f.currentLSN()
			if !tt.noTable {
				f.writeMany(ctx, rng, 20, 2, 5)
			}
			waitStopped(t, done, time.Minute, tt.want...)
			if got := f.confirmedLSN(); got > before {
				t.Fatalf("confirmed_flush_lsn %X is past %X: events written after the change were confirmed unpublished", got, before)
			}
		})
	}
}

// TestSchemaChangeInReplayGoesToTheFailurePolicy renames payload away, writes an event, renames it
// back, all while the relay is stopped: the replay carries the historic Relation message without
// payload, so that event goes to the dead-letter topic as a schema mismatch and the others are
// published.
func TestSchemaChangeInReplayGoesToTheFailurePolicy(t *testing.T) {
	brokers := testenv.SharedKafka(t).Brokers()
	f := newFixture(t, testenv.SharedPostgres(t), brokers, 1)
	ctx := context.Background()
	cfg := f.config()
	dlq := testenv.UniqueName(t, "dlq")
	cfg.Sink.Policy = sink.DeadLetter
	cfg.Sink.DeadLetterTopic = dlq
	stop := f.start(cfg)
	rng := rand.New(rand.NewPCG(12, 13))
	f.writeMany(ctx, rng, 5, 2, 5)
	f.verify(time.Minute, false)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	f.writeMany(ctx, rng, 5, 2, 5) // unconfirmed before the rename
	badID := "5d5b1c2e-0c39-4c6a-8a36-0d7c1f9b7e01"
	f.exec(ctx,
		"ALTER TABLE outbox_events RENAME COLUMN payload TO body",
		fmt.Sprintf(`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, body)
			VALUES ('%s', '%s', 'agg-bad', 'Happened', '{"x": 1}')`, badID, f.types[0]),
		"ALTER TABLE outbox_events RENAME COLUMN body TO payload",
	)
	f.writeMany(ctx, rng, 5, 2, 5)
	f.start(cfg)
	f.writeMany(ctx, rng, 5, 2, 5)
	f.verify(2*time.Minute, true)

	c := harness.NewConsumer(brokers, dlq)
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.ReadUntil(rctx, time.Second, func(recs []harness.Record) bool { return len(recs) >= 1 }); err != nil {
		t.Fatalf("dead-letter topic %s: %v", dlq, err)
	}
	recs := c.Records()
	if len(recs) != 1 {
		t.Fatalf("dead-letter topic holds %d records, want the one event written without payload", len(recs))
	}
	rec := recs[0]
	for k, v := range map[string]string{"id": badID, "outbox.dlq.reason": "schema_mismatch", "aggregate_type": f.types[0]} {
		if rec.Header(k) != v {
			t.Errorf("header %s = %q, want %q", k, rec.Header(k), v)
		}
	}
	if e := rec.Header("outbox.dlq.error"); !strings.Contains(e, `"payload"`) {
		t.Errorf("outbox.dlq.error %q does not name the missing column", e)
	}
	if string(rec.Key) != "agg-bad" {
		t.Errorf("key %q, want agg-bad", rec.Key)
	}
	if errors.Is(rctx.Err(), context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}
