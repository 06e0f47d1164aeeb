package replication_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
)

// TestOnWalsenderNamesTheWalsenderBeforeItUsesTheSlot: each session hands OnWalsender its
// walsender's PID before it creates or streams the slot (the leader publishes it there, so the next
// leader can end it whenever the slot shows it active); the slot then streams from exactly that
// backend. An error from the hook ends the session before the slot is touched, and the next one
// calls it again.
func TestOnWalsenderNamesTheWalsenderBeforeItUsesTheSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, slot := testenv.OutboxDatabase(t, testenv.SharedPostgres(t)), testenv.UniqueName(t, "slot")
	conn := connectTo(t, dsn)

	type call struct {
		pid         int32
		backendType string
		slotExists  bool
		slotActive  *int32 // the slot's walsender while the hook runs
	}
	calls := make(chan call, 16)
	failFirst := true
	cfg := replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events", CreateSlot: true, CreatePublication: true,
		OnWalsender: func(ctx context.Context, pid int32) error {
			c := call{pid: pid}
			conn, err := pgx.Connect(ctx, dsn) // the test's own is used on its goroutine
			if err != nil {
				t.Errorf("OnWalsender(%d): %v", pid, err)
				return err
			}
			defer conn.Close(context.Background())
			err = conn.QueryRow(ctx, `SELECT (SELECT backend_type FROM pg_stat_activity WHERE pid = $1),
				EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $2),
				(SELECT active_pid FROM pg_replication_slots WHERE slot_name = $2)`, pid, slot).Scan(&c.backendType, &c.slotExists, &c.slotActive)
			if err != nil {
				t.Errorf("OnWalsender(%d): %v", pid, err)
			}
			calls <- c
			if failFirst {
				failFirst = false
				return errors.New("the term was lost")
			}
			return nil
		}}
	log, logs := observed(t)
	_, stop, ended := runStreamConfig(t, cfg, log)
	defer stop()

	next := func() call {
		t.Helper()
		select {
		case c := <-calls:
			if c.backendType != "walsender" {
				t.Fatalf("OnWalsender(%d): that backend is a %q, not the walsender", c.pid, c.backendType)
			}
			if c.slotActive != nil {
				t.Fatalf("OnWalsender(%d) ran while the slot streamed from %d", c.pid, *c.slotActive)
			}
			return c
		case <-ended:
			t.Fatalf("the stream ended: %v", stop())
			return call{}
		case <-time.After(time.Minute):
			t.Fatal("OnWalsender was not called within a minute")
			return call{}
		}
	}
	if c := next(); c.slotExists {
		t.Fatal("the slot existed before the first session's hook, which creates it")
	}
	c := next()
	if c.slotExists {
		t.Fatal("a session whose hook failed went on to create the slot")
	}
	if got := walsenderPID(t, dsn, slot); int32(got) != c.pid {
		t.Fatalf("the slot streams from %d, OnWalsender was given %d", got, c.pid)
	}

	// A reconnection's walsender is named too, before it streams. Ended once it streams (ended
	// while it creates the slot, the next session would create it) and by its PID: the slot shows
	// none for a moment between its creation and START_REPLICATION.
	for deadline := time.Now().Add(time.Minute); logs.FilterMessage("streaming").Len() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream does not stream within a minute")
		}
	}
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1, 10000)", c.pid); err != nil {
		t.Fatal(err)
	}
	c = next()
	if !c.slotExists {
		t.Fatal("the slot is gone after a reconnection")
	}
	deadline := time.Now().Add(time.Minute)
	for got := walsenderPID(t, dsn, slot); int32(got) != c.pid; got = walsenderPID(t, dsn, slot) {
		if time.Now().After(deadline) {
			t.Fatalf("the slot streams from %d after the reconnection, OnWalsender was given %d", got, c.pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
