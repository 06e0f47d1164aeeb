package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// versionColumns is the default table with the aggregate version column the tests add.
var versionColumns = func() outbox.Columns {
	c := outbox.DefaultColumns
	c.AggregateVersion = "aggregate_version"
	return c
}()

// newVersionedDB is newDB with an aggregate_version column in the outbox table.
func newVersionedDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	_, pool := newDB(t)
	if _, err := pool.Exec(context.Background(), "ALTER TABLE outbox_events ADD COLUMN aggregate_version bigint"); err != nil {
		t.Fatal(err)
	}
	return pool
}

// versions returns the aggregate versions of one aggregate's rows in insertion order (0 for NULL).
func versions(t *testing.T, pool *pgxpool.Pool, aggregateID string) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT coalesce(aggregate_version, 0) FROM outbox_events WHERE aggregate_id = $1 ORDER BY seq", aggregateID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTheCallersVersionAndSchemaVersionAreWritten(t *testing.T) {
	pool := newVersionedDB(t)
	ctx := context.Background()
	w, err := outbox.New(outbox.Config{Columns: versionColumns})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx,
			outbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "OrderCreated", AggregateVersion: 7, SchemaVersion: 2},
			outbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "Unversioned"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := versions(t, pool, "o-1"); fmt.Sprint(got) != "[7 0]" {
		t.Fatalf("versions = %v, want [7 0] (0: NULL for an event without a version)", got)
	}
	var sv string
	if err := pool.QueryRow(ctx, "SELECT headers->>'schema_version' FROM outbox_events WHERE event_type = 'OrderCreated'").Scan(&sv); err != nil || sv != "2" {
		t.Fatalf("schema_version header = %q (%v), want 2", sv, err)
	}
}

func TestTheVersionTableNumbersEachAggregateFromOneInSliceOrderAndARollbackGivesItsVersionsBack(t *testing.T) {
	pool := newVersionedDB(t)
	ctx := context.Background()
	w, err := outbox.New(outbox.Config{Columns: versionColumns, VersionTable: "aggregate_versions"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.CreateVersionTable(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ev := func(id string) outbox.Event {
		return outbox.Event{AggregateType: "order", AggregateID: id, EventType: "E"}
	}
	write := func(commit bool, events ...outbox.Event) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := w.Write(ctx, tx, events...); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(true, ev("a"), ev("b"), ev("a"))
	write(false, ev("a"), ev("a")) // rolled back: 3 and 4 are given out again
	write(true, ev("b"), ev("a"))
	// Another type with the same id counts on its own.
	write(true, outbox.Event{AggregateType: "invoice", AggregateID: "a", EventType: "E"})

	rows, err := pool.Query(ctx, "SELECT aggregate_type || '/' || aggregate_id || '=' || aggregate_version FROM outbox_events ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"order/a=1", "order/b=1", "order/a=2", "order/b=2", "order/a=3", "invoice/a=1"}
	if !slices.Equal(got, want) {
		t.Fatalf("rows = %v, want %v", got, want)
	}

	// The caller cannot also pass a version: one of the two owns the numbering.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	bad := ev("a")
	bad.AggregateVersion = 9
	if _, err := w.Write(ctx, tx, bad); err == nil {
		t.Fatal("Write accepted an event with its own version while the Writer assigns them")
	}
}

// Writers of one aggregate, racing: each version is given out once, without a gap, and the
// aggregate's rows carry them in commit order. Overlapping aggregates in another order in each
// writer would deadlock if the counters were locked in slice order.
func TestConcurrentWritersOfOneAggregateGetDistinctGaplessVersions(t *testing.T) {
	pool := newVersionedDB(t)
	ctx := context.Background()
	w, err := outbox.New(outbox.Config{Columns: versionColumns, VersionTable: "public.aggregate_versions"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.CreateVersionTable(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const writers, txs = 4, 15
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for n := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range txs {
				// Writer n touches "x" and "y" in an order of its own.
				ids := []string{"x", "y"}
				if n%2 == 1 {
					ids = []string{"y", "x"}
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := w.Write(ctx, tx,
						outbox.Event{AggregateType: "acct", AggregateID: ids[0], EventType: "E"},
						outbox.Event{AggregateType: "acct", AggregateID: ids[1], EventType: "E"})
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, id := range []string{"x", "y"} {
		got := versions(t, pool, id)
		want := make([]int64, writers*txs)
		for i := range want {
			want[i] = int64(i + 1)
		}
		// seq is assigned at insert, which happens after the counter lock is taken: the rows of
		// one aggregate are inserted in version order.
		if !slices.Equal(got, want) {
			t.Fatalf("versions of %s in insertion order = %v, want 1..%d", id, got, writers*txs)
		}
	}
}

func TestTheVersionTableWorksThroughDatabaseSQLToo(t *testing.T) {
	pool := newVersionedDB(t)
	ctx := context.Background()
	db, err := sql.Open("pgx", pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	w, err := outbox.New(outbox.Config{Columns: versionColumns, VersionTable: "aggregate_versions"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.CreateVersionTableSQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteSQL(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "s", EventType: "E"},
			outbox.Event{AggregateType: "order", AggregateID: "s", EventType: "E"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if got := versions(t, pool, "s"); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("versions = %v, want 1..4", got)
	}
}
