package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newDB creates a database with the relay's outbox table and returns its DSN and a pool.
func newDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return dsn, pool
}

type row struct {
	ID, AggregateType, AggregateID, EventType string
	Payload, Headers                          *string
}

func readRows(t *testing.T, pool *pgxpool.Pool, query string) []row {
	t.Helper()
	rows, err := pool.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

const selectAll = `SELECT id::text, aggregate_type, aggregate_id, event_type, payload::text, headers::text
	FROM outbox_events ORDER BY seq`

func TestWriteCommitsAndRollsBackWithTheCallersTransaction(t *testing.T) {
	type order struct {
		ID    string  `json:"id"`
		Total float64 `json:"total"`
	}
	events := []outbox.Event{
		{AggregateType: "order", AggregateID: "o-1", EventType: "OrderCreated", Payload: order{"o-1", 42.5},
			Headers: map[string]string{outbox.HeaderTenant: "acme", outbox.HeaderSchemaVersion: "2"}},
		{ID: "5f0c7c1e-7d1a-4c39-9a53-2b1f4c8e9d10", AggregateType: "order", AggregateID: "o-1", EventType: "OrderPaid"},
	}
	// Each way of writing runs the same business transaction: an order row and its events.
	writers := []struct {
		name  string
		write func(t *testing.T, dsn string, pool *pgxpool.Pool, commit bool) []string
	}{
		{"pgx.Tx", func(t *testing.T, _ string, pool *pgxpool.Pool, commit bool) []string {
			ctx := context.Background()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES ('o-1')"); err != nil {
				t.Fatal(err)
			}
			ids, err := outbox.Write(ctx, tx, events...)
			if err != nil {
				t.Fatal(err)
			}
			if commit {
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			return ids
		}},
		{"*sql.Tx", func(t *testing.T, dsn string, _ *pgxpool.Pool, commit bool) []string {
			ctx := context.Background()
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, "INSERT INTO orders VALUES ('o-1')"); err != nil {
				t.Fatal(err)
			}
			ids, err := outbox.WriteSQL(ctx, tx, events...)
			if err != nil {
				t.Fatal(err)
			}
			if commit {
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			return ids
		}},
	}
	for _, w := range writers {
		for _, commit := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s commit=%v", w.name, commit), func(t *testing.T) {
				dsn, pool := newDB(t)
				if _, err := pool.Exec(context.Background(), "CREATE TABLE orders (id text PRIMARY KEY)"); err != nil {
					t.Fatal(err)
				}
				ids := w.write(t, dsn, pool, commit)
				if len(ids) != 2 || ids[1] != events[1].ID || len(ids[0]) != 36 || ids[0][14] != '4' {
					t.Fatalf("ids = %q, want a generated v4 UUID and the given id", ids)
				}
				got := readRows(t, pool, selectAll)
				var orders int
				if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM orders").Scan(&orders); err != nil {
					t.Fatal(err)
				}
				if !commit {
					if len(got) != 0 || orders != 0 {
						t.Fatalf("after rollback: %d events and %d orders remain", len(got), orders)
					}
					return
				}
				if len(got) != 2 || orders != 1 {
					t.Fatalf("after commit: %d events and %d orders, want 2 and 1", len(got), orders)
				}
				first, second := got[0], got[1]
				if first.ID != ids[0] || first.AggregateType != "order" || first.AggregateID != "o-1" || first.EventType != "OrderCreated" ||
					*first.Payload != `{"id": "o-1", "total": 42.5}` || *first.Headers != `{"tenant": "acme", "schema_version": "2"}` {
					t.Errorf("first row = %+v payload=%s headers=%s", first, *first.Payload, *first.Headers)
				}
				if second.ID != events[1].ID || second.EventType != "OrderPaid" || second.Payload != nil || second.Headers != nil {
					t.Errorf("second row = %+v, want NULL payload and headers", second)
				}
			})
		}
	}
}

func TestBatchesBeyondOneStatementKeepTheSliceOrder(t *testing.T) {
	_, pool := newDB(t)
	ctx := context.Background()
	n := 2*outbox.MaxBatch + 345
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(i % 7), EventType: "Step",
			Payload: map[string]int{"seq": i}}
	}
	var ids []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.Write(ctx, tx, events...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got := readRows(t, pool, selectAll)
	if len(got) != n || len(ids) != n {
		t.Fatalf("%d rows and %d ids, want %d", len(got), len(ids), n)
	}
	for i, r := range got {
		if want := fmt.Sprintf(`{"seq": %d}`, i); *r.Payload != want || r.ID != ids[i] {
			t.Fatalf("row %d (insertion order) = %s %s, want %s %s", i, r.ID, *r.Payload, ids[i], want)
		}
	}
}

func TestRawPayloadsAreStoredWithoutReencoding(t *testing.T) {
	_, pool := newDB(t)
	ctx := context.Background()
	// A number beyond float64 precision survives only if the bytes are passed through untouched.
	raw := `{"amount": 12345678901234567890.123456789, "note": "grüße"}`
	events := []outbox.Event{
		{AggregateType: "a", AggregateID: "1", EventType: "Raw", Payload: json.RawMessage(raw)},
		{AggregateType: "a", AggregateID: "1", EventType: "Bytes", Payload: []byte(raw)},
		{AggregateType: "a", AggregateID: "1", EventType: "String", Payload: "just a string"},
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Write(ctx, tx, events...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	got := readRows(t, pool, selectAll)
	// jsonb orders keys (shorter first) but keeps every digit.
	stored := `{"note": "grüße", "amount": 12345678901234567890.123456789}`
	for i, want := range []string{stored, stored, `"just a string"`} {
		if *got[i].Payload != want {
			t.Errorf("%s payload = %s, want %s", got[i].EventType, *got[i].Payload, want)
		}
	}
}

func TestTraceparentFromTheContextIsAddedToEveryEvent(t *testing.T) {
	_, pool := newDB(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	ctx := outbox.ContextWithTraceparent(context.Background(), tp)
	events := []outbox.Event{
		{AggregateType: "a", AggregateID: "1", EventType: "NoHeaders"},
		{AggregateType: "a", AggregateID: "1", EventType: "OwnTrace", Headers: map[string]string{outbox.HeaderTraceparent: own}},
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Write(ctx, tx, events...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	got := readRows(t, pool, selectAll)
	if *got[0].Headers != `{"traceparent": "`+tp+`"}` || *got[1].Headers != `{"traceparent": "`+own+`"}` {
		t.Errorf("headers = %s and %s", *got[0].Headers, *got[1].Headers)
	}
	if _, ok := outbox.TraceparentFrom(outbox.ContextWithTraceparent(context.Background(), "00-xyz")); ok {
		t.Error("a malformed traceparent was stored in the context")
	}
}

func TestACustomTableWithDebeziumColumnsAndNamesThatNeedQuoting(t *testing.T) {
	_, pool := newDB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "Sales";
		CREATE TABLE "Sales"."Outbox Events" (id text PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
			aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload json)`); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(outbox.Config{Table: "Sales.Outbox Events", Columns: outbox.DebeziumColumns, IDType: "text", PayloadType: "json"})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, outbox.Event{ID: "evt-1", AggregateType: "Order", AggregateID: "1", EventType: "OrderCreated",
			Payload: json.RawMessage(`{"b": 1,   "a": 2}`)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var id, payload string
	if err := pool.QueryRow(ctx, `SELECT id, payload::text FROM "Sales"."Outbox Events"`).Scan(&id, &payload); err != nil {
		t.Fatal(err)
	}
	if id != "evt-1" || payload != `{"b": 1,   "a": 2}` { // json (unlike jsonb) keeps the text as written
		t.Errorf("row = %s %s", id, payload)
	}
	// Headers have nowhere to go in this table: an error, never a silent drop.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, outbox.Event{AggregateType: "Order", AggregateID: "1", EventType: "X",
			Headers: map[string]string{"tenant": "acme"}})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "no headers column") {
		t.Errorf("headers without a headers column: err = %v", err)
	}
}

func TestBadEventsAreRejectedBeforeAnythingIsSent(t *testing.T) {
	ok := outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "E"}
	with := func(f func(e *outbox.Event)) outbox.Event { e := ok; f(&e); return e }
	cases := []struct {
		name  string
		event outbox.Event
		want  string
	}{
		{"a missing aggregate type", with(func(e *outbox.Event) { e.AggregateType = "" }), "required"},
		{"a missing aggregate id", with(func(e *outbox.Event) { e.AggregateID = "" }), "required"},
		{"a missing event type", with(func(e *outbox.Event) { e.EventType = "" }), "required"},
		{"an id that is not a UUID", with(func(e *outbox.Event) { e.ID = "evt-1" }), "not a UUID"},
		{"raw bytes that are not JSON", with(func(e *outbox.Event) { e.Payload = []byte("{oops") }), "not valid JSON"},
		{"a payload encoding/json cannot encode", with(func(e *outbox.Event) { e.Payload = func() {} }), "encode payload"},
		{"a version for a table without a version column", with(func(e *outbox.Event) { e.AggregateVersion = 3 }), "Columns.AggregateVersion"},
		{"a schema version that disagrees with the header", with(func(e *outbox.Event) {
			e.SchemaVersion = 2
			e.Headers = map[string]string{outbox.HeaderSchemaVersion: "1"}
		}), "disagree"},
		{"a header the relay sets itself", with(func(e *outbox.Event) { e.Headers = map[string]string{"id": "correlation-42"} }), "sets itself"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// An Execer that fails the test if called: nothing may reach the database.
			_, err := outbox.Write(context.Background(), failExec{t}, ok, c.event)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
}

func TestConfigMistakesAreReportedByNew(t *testing.T) {
	cases := []struct {
		name string
		cfg  outbox.Config
	}{
		{"a table with three parts", outbox.Config{Table: "a.b.c"}},
		{"an empty schema", outbox.Config{Table: ".events"}},
		{"a type that is not a plain name", outbox.Config{IDType: "uuid); DROP TABLE x; --"}},
		{"a column left empty", outbox.Config{Columns: outbox.Columns{ID: "id"}}},
		{"a version table without a version column", outbox.Config{VersionTable: "versions"}},
		{"a version table with three parts", outbox.Config{VersionTable: "a.b.c", Columns: versionColumns}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := outbox.New(c.cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}

func TestValidTraceparentFollowsTheW3CFormat(t *testing.T) {
	cases := map[string]bool{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": true,
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01": false, // upper case
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": false, // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01": false, // zero parent id
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": false, // unknown version
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7":    false,
		"": false,
	}
	for tp, want := range cases {
		if got := outbox.ValidTraceparent(tp); got != want {
			t.Errorf("ValidTraceparent(%q) = %v, want %v", tp, got, want)
		}
	}
}

type failExec struct{ t *testing.T }

func (f failExec) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	f.t.Fatal("the statement was sent")
	return pgconn.CommandTag{}, nil
}
