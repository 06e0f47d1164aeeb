package prune_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/prune"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newDB creates a database with the relay's outbox table and the inbox ledger.
func newDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return dsn, pool
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// insertAged inserts n rows created age ago into the outbox table.
func insertAged(t *testing.T, pool *pgxpool.Pool, n int, age time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT 'order', i::text, 'Created', '{}', now() - $2::bigint * interval '1 microsecond' FROM generate_series(1, $1) i`,
		n, age.Microseconds())
	if err != nil {
		t.Fatal(err)
	}
}

func TestPruneDeletesOnlyOldRowsInBatchesOfTheGivenSize(t *testing.T) {
	cases := []struct {
		name    string
		opts    prune.Options
		setup   func(t *testing.T, pool *pgxpool.Pool)
		remain  string // counts the rows that must remain
		deleted string // counts the rows that must be gone
	}{
		{
			name: "the outbox table by created_at",
			opts: prune.Options{OlderThan: time.Hour, BatchSize: 7},
			setup: func(t *testing.T, pool *pgxpool.Pool) {
				insertAged(t, pool, 50, 2*time.Hour)
				insertAged(t, pool, 10, 59*time.Minute)
			},
			remain:  "SELECT count(*) FROM outbox_events WHERE created_at > now() - interval '1 hour'",
			deleted: "SELECT count(*) FROM outbox_events WHERE created_at < now() - interval '1 hour'",
		},
		{
			name: "the inbox ledger by processed_at",
			opts: prune.Options{Table: "public.processed_events", Column: "processed_at", OlderThan: 7 * 24 * time.Hour, BatchSize: 7},
			setup: func(t *testing.T, pool *pgxpool.Pool) {
				if _, err := pool.Exec(context.Background(), `INSERT INTO processed_events (consumer, event_id, processed_at)
					SELECT 'c', i::text, now() - CASE WHEN i <= 50 THEN interval '8 days' ELSE interval '6 days' END
					FROM generate_series(1, 60) i`); err != nil {
					t.Fatal(err)
				}
			},
			remain:  "SELECT count(*) FROM processed_events WHERE processed_at > now() - interval '7 days'",
			deleted: "SELECT count(*) FROM processed_events WHERE processed_at < now() - interval '7 days'",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, pool := newDB(t)
			c.setup(t, pool)
			var batches []int64
			c.opts.Progress = func(n int64) { batches = append(batches, n) }
			n, err := prune.Prune(context.Background(), pool, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if n != 50 || fmt.Sprint(batches) != "[7 7 7 7 7 7 7 1]" {
				t.Fatalf("deleted %d in batches %v; want 50 in [7 7 7 7 7 7 7 1]", n, batches)
			}
			if gone, kept := count(t, pool, c.deleted), count(t, pool, c.remain); gone != 0 || kept != 10 {
				t.Fatalf("%d old rows left and %d new rows kept; want 0 and 10", gone, kept)
			}
		})
	}
}

func TestPruneSkipsRowsAnotherTransactionHoldsInsteadOfWaiting(t *testing.T) {
	_, pool := newDB(t)
	ctx := context.Background()
	insertAged(t, pool, 20, 2*time.Hour)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM outbox_events WHERE aggregate_id = '5' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	n, err := prune.Prune(pctx, pool, prune.Options{OlderThan: time.Hour, BatchSize: 3})
	if err != nil {
		t.Fatalf("prune with a locked row: %v (it must skip the row, not wait)", err)
	}
	if n != 19 || count(t, pool, "SELECT count(*) FROM outbox_events WHERE aggregate_id = '5'") != 1 {
		t.Fatalf("deleted %d, want 19 and the locked row kept", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := prune.Prune(ctx, pool, prune.Options{OlderThan: time.Hour}); err != nil || n != 1 {
		t.Fatalf("the next run deleted %d (err %v), want the formerly locked row", n, err)
	}
}

func TestPruneLoopAlongsideBusyProducersLosesNoInsertAndEmptiesTheTable(t *testing.T) {
	_, pool := newDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		runs, pruned atomic.Int64
		loopErrs     = make(chan error, 100)
		loopDone     = make(chan error, 1)
	)
	go func() {
		loopDone <- prune.Loop(ctx, pool, prune.Options{BatchSize: 50}, 10*time.Millisecond, func(n int64, err error) {
			runs.Add(1)
			pruned.Add(n)
			if err != nil {
				select {
				case loopErrs <- err:
				default:
				}
			}
		})
	}()

	const producers, txs = 3, 150
	var wg sync.WaitGroup
	var inserted atomic.Int64
	errs := make(chan error, producers)
	for p := range producers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 1))
			for range txs {
				rows := 1 + rng.IntN(5)
				_, err := pool.Exec(context.Background(), `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
					SELECT 'order', $1, 'Created', '{}' FROM generate_series(1, $2)`, fmt.Sprint(p), rows)
				if err != nil {
					errs <- err
					return
				}
				inserted.Add(int64(rows))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a producer failed while pruning ran: %v", err)
	}
	// Let the loop catch up and run once more, then stop it: a run may still be draining its
	// batches when the producers finish (the producers took 0.3 s alongside one run that pruned
	// everything), and the loop's repeating is half of what this test is about.
	deadline := time.Now().Add(30 * time.Second)
	for (pruned.Load() < inserted.Load() || runs.Load() < 2) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-loopDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("Loop returned %v, want context.Canceled", err)
	}
	close(loopErrs)
	for err := range loopErrs {
		t.Fatalf("a prune run failed: %v", err)
	}
	if left := count(t, pool, "SELECT count(*) FROM outbox_events"); left != 0 || pruned.Load() != inserted.Load() || runs.Load() < 2 {
		t.Fatalf("%d rows left, %d of %d pruned in %d runs", left, pruned.Load(), inserted.Load(), runs.Load())
	}
}

func TestMistakesInOptionsAreErrors(t *testing.T) {
	_, pool := newDB(t)
	ctx := context.Background()
	for name, o := range map[string]prune.Options{
		"a negative age":           {OlderThan: -time.Second},
		"a table with three parts": {Table: "a.b.c"},
		"a table that is missing":  {Table: "public.nope"},
		"a column that is missing": {Column: "inserted_at"},
	} {
		if _, err := prune.Prune(ctx, pool, o); err == nil {
			t.Errorf("%s: Prune succeeded", name)
		}
	}
	if err := prune.Loop(ctx, pool, prune.Options{}, 0, nil); err == nil {
		t.Error("Loop accepted a zero interval")
	}
}

// TestPruneKeepsTheRowsOfTransactionsFromTheHorizonOnWhateverTheirAge: KeepXmin keeps the rows of
// transactions from the given id on, however old their creation time, also those of a transaction
// that got its id after the run read the server's next one (a long transaction that wrote its row
// late, its created_at its start): such an id is above next, and must not be taken for one 2^32
// ids older.
func TestPruneKeepsTheRowsOfTransactionsFromTheHorizonOnWhateverTheirAge(t *testing.T) {
	_, pool := newDB(t)
	ctx := context.Background()
	insertAged(t, pool, 5, 2*time.Hour) // below the horizon: pruned
	var horizon uint64
	if err := pool.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&horizon); err != nil {
		t.Fatal(err)
	}
	insertAged(t, pool, 3, 2*time.Hour) // from the horizon on: kept
	n, err := prune.Prune(ctx, pool, prune.Options{
		OlderThan: time.Hour,
		KeepXmin:  func(context.Context) (uint64, bool, error) { return horizon, true, nil },
		Keep: func(context.Context) (time.Time, bool, error) {
			// Asked after the run read the next transaction id: a transaction that commits now
			// has an id past it.
			insertAged(t, pool, 2, 2*time.Hour)
			return time.Time{}, false, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if left := count(t, pool, "SELECT count(*) FROM outbox_events"); n != 5 || left != 5 {
		t.Fatalf("deleted %d and left %d rows; want the 5 below the horizon deleted and the 5 from it on (2 of them committed during the run) kept", n, left)
	}
}
