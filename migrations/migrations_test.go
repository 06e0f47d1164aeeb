package migrations_test

import (
	"context"
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
