package migrations_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestSeqIsAddedToTablesWithRowsInCreationOrder runs the migrations over outbox tables made before
// the seq column existed, plain and partitioned, whose rows sit on disk in another order than they
// were created: the old rows get seq in created_at order, and new rows, written by the outbox
// package, continue after them.
func TestSeqIsAddedToTablesWithRowsInCreationOrder(t *testing.T) {
	for _, tc := range []struct {
		name, create string
	}{
		{"plain table", `CREATE TABLE outbox_events (
			id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
			event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`},
		{"partitioned table", `CREATE TABLE outbox_events (
			id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
			event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
			CREATE TABLE outbox_events_old PARTITION OF outbox_events FOR VALUES FROM (MINVALUE) TO ('2020-01-01');
			CREATE TABLE outbox_events_new PARTITION OF outbox_events FOR VALUES FROM ('2020-01-01') TO (MAXVALUE)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
			if err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, tc.create); err != nil {
				t.Fatal(err)
			}
			// Written newest first, so physical order is the reverse of creation order; the last
			// two share a transaction (and so a created_at).
			base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for _, r := range []struct {
				name string
				at   time.Time
			}{{"fourth", base.Add(3 * time.Hour)}, {"third", base.Add(2 * time.Hour)}, {"second", base.Add(time.Hour)}, {"first", base.AddDate(-10, 0, 0)}} {
				if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, created_at)
					VALUES ('a', 'x', $1, $2)`, r.name, r.at); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, created_at)
				VALUES ('a', 'x', 'fifth', $1), ('a', 'x', 'sixth', $1)`, base.Add(4*time.Hour)); err != nil {
				t.Fatal(err)
			}
			if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
				t.Fatalf("migrate a table with rows: %v", err)
			}
			if _, err := outbox.Write(ctx, conn, outbox.Event{AggregateType: "a", AggregateID: "x", EventType: "seventh"},
				outbox.Event{AggregateType: "a", AggregateID: "x", EventType: "eighth"}); err != nil {
				t.Fatalf("outbox.Write after the migration: %v", err)
			}
			rows, err := conn.Query(ctx, "SELECT event_type, seq FROM outbox_events ORDER BY seq")
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
				var name string
				var seq int64
				err := r.Scan(&name, &seq)
				return name, err
			})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"}
			if len(got) != len(want) {
				t.Fatalf("rows by seq %v, want %v", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("rows by seq %v, want %v", got, want)
				}
			}
			if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, seq)
				VALUES ('a', 'x', 'forged', 1)`); err == nil {
				t.Fatal("a writer could set seq; it must be GENERATED ALWAYS")
			}
		})
	}
}

func newConn(t *testing.T) (*pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn, dsn
}

// TestATableThatAlreadyHasSeqIsMigrated: the README told owners of their own tables to add the seq
// identity column themselves; migrate then keeps it (and its numbers) and adds only the index.
func TestATableThatAlreadyHasSeqIsMigrated(t *testing.T) {
	ctx := context.Background()
	conn, _ := newConn(t)
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now());
		ALTER TABLE outbox_events ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY (START WITH 100);
		INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type) VALUES ('a', 'x', 'first'), ('a', 'x', 'second')`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
		t.Fatalf("migrate a table that has seq already: %v", err)
	}
	rows, _ := conn.Query(ctx, "SELECT seq FROM outbox_events ORDER BY seq")
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(seqs) != 2 || seqs[0] != 100 || seqs[1] != 101 {
		t.Fatalf("seq after the migration %v (%v), want the table's own numbers [100 101]", seqs, err)
	}
	requireSeqIndex(t, conn)
}

// TestATextSeqColumnIsRefused: a seq column that cannot be an insertion sequence is an error that
// says what to do, not something the backfill would order by.
func TestATextSeqColumnIsRefused(t *testing.T) {
	ctx := context.Background()
	conn, _ := newConn(t)
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(), seq text)`); err != nil {
		t.Fatal(err)
	}
	_, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"})
	if err == nil || !strings.Contains(err.Error(), "seq") || !strings.Contains(err.Error(), "rename") {
		t.Fatalf("migrate a table with a text seq column: %v, want an error that says to rename it", err)
	}
}

// requireSeqIndex fails unless an index of the outbox table leads with seq, so the backfill's
// ORDER BY seq reads the index instead of sorting the whole table.
func requireSeqIndex(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_index i JOIN pg_attribute a
		ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = 'outbox_events'::regclass AND a.attname = 'seq'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no index on outbox_events leads with seq: the backfill sorts the whole table")
	}
}

// TestTheSeqMigrationGivesUpOnABusyTableInsteadOfStallingWriters: adding seq needs an exclusive lock;
// queued behind an open transaction that read the table it would stall every insert behind it. It
// must give up within seconds with an error that says to retry, and leave the table as it was.
func TestTheSeqMigrationGivesUpOnABusyTableInsteadOfStallingWriters(t *testing.T) {
	ctx := context.Background()
	conn, dsn := newConn(t)
	target := migrations.Target{Schema: "public", Table: "outbox_events"}
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	reader, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(ctx)
	tx, err := reader.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM outbox_events"); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = migrations.Apply(mctx, conn, target)
	took := time.Since(start)
	if err == nil || mctx.Err() != nil {
		t.Fatalf("migrate behind an open reader: %v after %s, want it to give up on its own", err, took.Round(time.Millisecond))
	}
	if !strings.Contains(err.Error(), "retry") {
		t.Fatalf("the error does not say to retry: %v", err)
	}
	t.Logf("gave up after %s: %v", took.Round(time.Millisecond), err)
	tx.Rollback(ctx)
	if _, err := migrations.Apply(ctx, conn, target); err != nil {
		t.Fatalf("migrate again once the reader is gone: %v", err)
	}
	requireSeqIndex(t, conn)
}

// TestNoTableCreatesTheLedgerOnlyAndATableRunAddsTheRest: an outbox of logical decoding messages
// needs the relay's slot ledger but no outbox table; switching to the table later applies the
// table's migrations then.
func TestNoTableCreatesTheLedgerOnlyAndATableRunAddsTheRest(t *testing.T) {
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	exists := func(name string) bool {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	applied, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events", NoTable: true})
	if err != nil {
		t.Fatal(err)
	}
	if !exists("public.outbox_relay_slots") || exists("public.outbox_events") {
		t.Fatalf("after %v: ledger %t, outbox table %t; want the ledger only", applied, exists("public.outbox_relay_slots"), exists("public.outbox_events"))
	}
	var cols int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.outbox_relay_slots'::regclass
		AND attname IN ('system_identifier', 'timeline')`).Scan(&cols); err != nil || cols != 2 {
		t.Fatalf("the ledger lacks its identity columns (%d, %v)", cols, err)
	}
	if again, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events", NoTable: true}); err != nil || len(again) != 0 {
		t.Fatalf("a second run applied %v (%v), want nothing", again, err)
	}
	rest, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"})
	if err != nil {
		t.Fatal(err)
	}
	if !exists("public.outbox_events") || len(rest) != 2 {
		t.Fatalf("a table run applied %v; want the table's two migrations", rest)
	}
	if _, err := outbox.Write(ctx, conn, outbox.Event{AggregateType: "a", AggregateID: "x", EventType: "E"}); err != nil {
		t.Fatalf("the table is not usable after the late migrations: %v", err)
	}
}
