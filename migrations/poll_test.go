package migrations_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// TestThePollMigrationIsAppliedOnlyForThePollingMode: Apply leaves the table as the WAL mode needs
// it; ApplyPoll adds the columns, the view and the trigger, once, and the trigger notifies once per
// INSERT statement, at commit.
func TestThePollMigrationIsAppliedOnlyForThePollingMode(t *testing.T) {
	ctx := context.Background()
	conn, dsn := newConn(t)
	target := migrations.Target{Schema: "public", Table: "outbox_events"}
	if _, err := migrations.Apply(ctx, conn, target); err != nil {
		t.Fatal(err)
	}
	pollColumns := func() []string {
		rows, _ := conn.Query(ctx, `SELECT column_name::text FROM information_schema.columns WHERE table_name = 'outbox_events'
			AND column_name IN ('attempts', 'processed_at', 'retry_after', 'last_error') ORDER BY 1`)
		cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return cols
	}
	if cols := pollColumns(); len(cols) > 0 {
		t.Fatalf("Apply (the WAL mode's migrate) added the polling columns %v", cols)
	}
	applied, err := migrations.ApplyPoll(ctx, conn, target)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(applied, []string{"1001_poll_mode.sql"}) {
		t.Fatalf("ApplyPoll after Apply applied %v, want only the polling migration", applied)
	}
	if again, err := migrations.ApplyPoll(ctx, conn, target); err != nil || len(again) > 0 {
		t.Fatalf("ApplyPoll again: applied %v (%v), want nothing", again, err)
	}
	if cols := pollColumns(); !slices.Equal(cols, []string{"attempts", "last_error", "processed_at", "retry_after"}) {
		t.Fatalf("columns after ApplyPoll: %v", cols)
	}

	listener, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{migrations.Channel("outbox_events")}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // two statements of three rows each: one notification, delivered at commit
		if _, err := tx.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type)
			SELECT 'a', 'x', 'e' FROM generate_series(1, 3)`); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if n, err := listener.WaitForNotification(wctx); err == nil {
		t.Fatalf("notified before the commit: %+v", n)
	}
	cancel()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := listener.WaitForNotification(wctx); err != nil {
		t.Fatalf("no notification after the commit: %v", err)
	}
	wctx2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if n, err := listener.WaitForNotification(wctx2); err == nil {
		t.Fatalf("a second notification for one transaction: %+v", n)
	}

	var pending, dead int
	if err := conn.QueryRow(ctx, "SELECT count(*) FILTER (WHERE processed_at IS NULL AND attempts = 0), (SELECT count(*) FROM outbox_dead_letters) FROM outbox_events").
		Scan(&pending, &dead); err != nil {
		t.Fatal(err)
	}
	if pending != 6 || dead != 0 {
		t.Fatalf("pending %d, dead letters %d; want 6 new rows pending and no dead letter", pending, dead)
	}
}
