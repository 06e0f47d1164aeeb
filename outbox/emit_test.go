package outbox_test

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// decoded is one change a test_decoding slot reports: a message's prefix and content, or another
// change's text (BEGIN, COMMIT, table rows).
type decoded struct {
	prefix, content, other string
}

// messageSlot creates a test_decoding slot in a fresh database; changes reads what it decoded
// since the last call.
func messageSlot(t *testing.T) (dsn string, pool *pgxpool.Pool, changes func() []decoded) {
	t.Helper()
	ctx := context.Background()
	dsn = testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	slot := testenv.UniqueName(t, "slot")
	if _, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })
	return dsn, pool, func() []decoded {
		rows, err := pool.Query(ctx, "SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL)", slot)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		var out []decoded
		for _, l := range lines {
			// message: transactional: 1 prefix: outbox, sz: 12 content:{...}
			rest, ok := strings.CutPrefix(l, "message: transactional: 1 prefix: ")
			if !ok {
				out = append(out, decoded{other: l})
				continue
			}
			prefix, rest, _ := strings.Cut(rest, ", sz: ")
			_, content, _ := strings.Cut(rest, " content:")
			out = append(out, decoded{prefix: prefix, content: content})
		}
		return out
	}
}

func TestEmitCommitsAndRollsBackWithTheCallersTransaction(t *testing.T) {
	type order struct {
		ID    string  `json:"id"`
		Total float64 `json:"total"`
	}
	events := []outbox.Event{
		{AggregateType: "order", AggregateID: "o-1", EventType: "OrderCreated", Payload: order{"o-1", 42.5},
			Headers: map[string]string{outbox.HeaderTenant: "acme"}},
		{ID: "evt-2", AggregateType: "order", AggregateID: "o-1", EventType: "OrderPaid"},
	}
	emitters := []struct {
		name string
		emit func(t *testing.T, dsn string, pool *pgxpool.Pool, commit bool) []string
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
			ids, err := outbox.Emit(ctx, tx, events...)
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
			ids, err := outbox.EmitSQL(ctx, tx, events...)
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
	for _, e := range emitters {
		for _, commit := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s commit=%v", e.name, commit), func(t *testing.T) {
				dsn, pool, changes := messageSlot(t)
				if _, err := pool.Exec(context.Background(), "CREATE TABLE orders (id text PRIMARY KEY)"); err != nil {
					t.Fatal(err)
				}
				changes() // the DDL's empty transaction
				ids := e.emit(t, dsn, pool, commit)
				if len(ids) != 2 || ids[1] != "evt-2" || len(ids[0]) != 36 || ids[0][14] != '4' {
					t.Fatalf("ids = %q, want a generated v4 UUID and the given id", ids)
				}
				var got []decoded
				for _, c := range changes() {
					if c.prefix != "" {
						got = append(got, c)
					}
				}
				var rows int
				if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_events").Scan(&rows); err != nil || rows != 0 {
					t.Fatalf("%d outbox rows (%v): Emit must store nothing", rows, err)
				}
				if !commit {
					if len(got) != 0 {
						t.Fatalf("after rollback %d messages were decoded", len(got))
					}
					return
				}
				if len(got) != 2 {
					t.Fatalf("%d messages decoded, want 2: %+v", len(got), got)
				}
				want := []string{
					`{"id":"` + ids[0] + `","aggregate_type":"order","aggregate_id":"o-1","event_type":"OrderCreated","payload":{"id":"o-1","total":42.5},"headers":{"tenant":"acme"}}`,
					`{"id":"evt-2","aggregate_type":"order","aggregate_id":"o-1","event_type":"OrderPaid"}`,
				}
				for i, m := range got {
					if m.prefix != "outbox" || m.content != want[i] {
						t.Errorf("message %d: prefix %q content %s, want outbox %s", i, m.prefix, m.content, want[i])
					}
				}
			})
		}
	}
}

func TestEmitKeepsTheSliceOrderAcrossStatementsAndTheTransactionsOrder(t *testing.T) {
	_, pool, changes := messageSlot(t)
	ctx := context.Background()
	n := 2*outbox.MaxBatch + 17
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{AggregateType: "a", AggregateID: "x", EventType: "E", Payload: map[string]int{"n": i}}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := outbox.Emit(ctx, tx, events[:10]...); err != nil {
			return err
		}
		// A table row between messages keeps its place in the transaction's stream.
		if _, err := tx.Exec(ctx, "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type) VALUES ('a', 'x', 'Row')"); err != nil {
			return err
		}
		_, err := outbox.Emit(ctx, tx, events[10:]...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	next, rowAt := 0, -1
	for _, c := range changes() {
		switch {
		case c.prefix != "":
			var p struct {
				Payload struct{ N int } `json:"payload"`
			}
			if err := json.Unmarshal([]byte(c.content), &p); err != nil {
				t.Fatal(err)
			}
			if p.Payload.N != next {
				t.Fatalf("message %d carries n=%d: out of order", next, p.Payload.N)
			}
			next++
		case strings.Contains(c.other, "table public.outbox_events: INSERT"):
			rowAt = next
		}
	}
	if next != n || rowAt != 10 {
		t.Fatalf("%d messages (want %d), the row after message %d (want 10)", next, n, rowAt)
	}
}

func TestEmitterOptions(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	binary := []byte{0, 1, 0xff, 'x'}
	tests := []struct {
		name  string
		cfg   outbox.EmitterConfig
		ctx   context.Context
		event outbox.Event
		want  string
	}{
		{"another prefix and the Debezium member names", outbox.EmitterConfig{Prefix: "orders.outbox", Columns: outbox.DebeziumColumns}, context.Background(),
			outbox.Event{ID: "i", AggregateType: "order", AggregateID: "o-1", EventType: "Created", Payload: json.RawMessage(`{"a": 1}`)},
			`orders.outbox {"id":"i","aggregatetype":"order","aggregateid":"o-1","type":"Created","payload":{"a": 1}}`},
		{"a binary payload as base64", outbox.EmitterConfig{PayloadBase64: true}, context.Background(),
			outbox.Event{ID: "i", AggregateType: "t", AggregateID: "a", EventType: "E", Payload: binary},
			`outbox {"id":"i","aggregate_type":"t","aggregate_id":"a","event_type":"E","payload":"` + base64.StdEncoding.EncodeToString(binary) + `"}`},
		{"the context's traceparent becomes a header", outbox.EmitterConfig{}, outbox.ContextWithTraceparent(context.Background(), tp),
			outbox.Event{ID: "i", AggregateType: "t", AggregateID: "a", EventType: "E"},
			`outbox {"id":"i","aggregate_type":"t","aggregate_id":"a","event_type":"E","headers":{"traceparent":"` + tp + `"}}`},
		{"the aggregate version", outbox.EmitterConfig{Columns: func() outbox.Columns { c := outbox.DefaultColumns; c.AggregateVersion = "aggregate_version"; return c }()}, context.Background(),
			outbox.Event{ID: "i", AggregateType: "t", AggregateID: "a", EventType: "E", AggregateVersion: 42},
			`outbox {"id":"i","aggregate_type":"t","aggregate_id":"a","event_type":"E","aggregate_version":42}`},
		{"strings that need escaping", outbox.EmitterConfig{}, context.Background(),
			outbox.Event{ID: "i", AggregateType: "t", AggregateID: `k"ü\`, EventType: "E", Payload: "text <&>"},
			`outbox {"id":"i","aggregate_type":"t","aggregate_id":"k\"ü\\","event_type":"E","payload":"text \u003c\u0026\u003e"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, pool, changes := messageSlot(t)
			em, err := outbox.NewEmitter(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := pgx.BeginFunc(tt.ctx, pool, func(tx pgx.Tx) error {
				_, err := em.Emit(tt.ctx, tx, tt.event)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range changes() {
				if c.prefix != "" {
					got = append(got, c.prefix+" "+c.content)
				}
			}
			if len(got) != 1 || got[0] != tt.want {
				t.Errorf("messages %q, want %q", got, tt.want)
			}
			_, content, err := em.Content(tt.ctx, tt.event)
			if err != nil || !strings.HasSuffix(tt.want, content) {
				t.Errorf("Content = %s (%v), want what Emit wrote", content, err)
			}
		})
	}
}

func TestBadEventsAreNotEmitted(t *testing.T) {
	ok := outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "E"}
	with := func(f func(e *outbox.Event)) outbox.Event { e := ok; f(&e); return e }
	b64, _ := outbox.NewEmitter(outbox.EmitterConfig{PayloadBase64: true})
	dbz, _ := outbox.NewEmitter(outbox.EmitterConfig{Columns: outbox.DebeziumColumns})
	cases := []struct {
		name  string
		em    *outbox.Emitter
		event outbox.Event
		want  string
	}{
		{"a missing aggregate type", nil, with(func(e *outbox.Event) { e.AggregateType = "" }), "required"},
		{"a missing aggregate id", nil, with(func(e *outbox.Event) { e.AggregateID = "" }), "required"},
		{"a missing event type", nil, with(func(e *outbox.Event) { e.EventType = "" }), "required"},
		{"raw bytes that are not JSON", nil, with(func(e *outbox.Event) { e.Payload = []byte("{oops") }), "not valid JSON"},
		{"a base64 payload that is not bytes", b64, with(func(e *outbox.Event) { e.Payload = 42 }), "must be []byte or string"},
		{"an aggregate version without its member", nil, with(func(e *outbox.Event) { e.AggregateVersion = 3 }), "Columns.AggregateVersion"},
		{"headers without a headers member", dbz, with(func(e *outbox.Event) { e.Headers = map[string]string{"a": "b"} }), "no headers column or member"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			emit := outbox.Emit
			if c.em != nil {
				emit = c.em.Emit
			}
			_, err := emit(context.Background(), failExec{t}, ok, c.event)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
	if _, err := outbox.NewEmitter(outbox.EmitterConfig{Columns: outbox.Columns{ID: "id"}}); err == nil {
		t.Error("NewEmitter accepted columns without an aggregate type")
	}
}
