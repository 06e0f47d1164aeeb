package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// FailoverStandbySlot is the physical slot FailoverStandby makes on the primary for its standby.
const FailoverStandbySlot = "failover_standby"

// FailoverStandby starts a standby of primary (17+) that synchronises failover slots itself, as
// docs/operations.md sets one up: a physical slot on the primary (FailoverStandbySlot) as its
// primary_slot_name, hot_standby_feedback and sync_replication_slots on (the devenv standby's
// primary_conninfo has the dbname this needs). It returns once the standby streams.
func FailoverStandby(t testing.TB, primary *devenv.Postgres) *devenv.Postgres {
	t.Helper()
	ctx := context.Background()
	if err := primary.Exec(ctx, "postgres", fmt.Sprintf("SELECT pg_create_physical_replication_slot('%s', true)", FailoverStandbySlot)); err != nil {
		t.Fatal(err)
	}
	standby := Standby(t, primary, devenv.PostgresOptions{Settings: map[string]string{
		"primary_slot_name": FailoverStandbySlot, "hot_standby_feedback": "on", "sync_replication_slots": "on",
	}})
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		var active bool
		err = conn.QueryRow(ctx, "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1", FailoverStandbySlot).Scan(&active)
		conn.Close(ctx)
		switch {
		case err != nil:
			t.Fatal(err)
		case active:
			return standby
		case time.Now().After(deadline):
			t.Fatalf("the standby does not stream from the primary's slot %s within a minute", FailoverStandbySlot)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NudgeSlotSync moves a failover slot of primary's database (nothing streaming it) to the end of
// WAL after a write, logs a running-transactions record there and asks standby to synchronise
// (an error of that, as when the standby's own worker is synchronising, is ignored): one round of
// what makes a standby's temporary copy persisted, which PostgreSQL does only once the primary's
// slot has passed the standby's catalog xmin and restart LSN.
func NudgeSlotSync(ctx context.Context, primary, standby *devenv.Postgres, database, slot string) error {
	if err := primary.Exec(ctx, database, fmt.Sprintf(`BEGIN; SELECT txid_current(); COMMIT;
		SELECT pg_log_standby_snapshot();
		SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn())`, slot)); err != nil {
		return fmt.Errorf("advance slot %s on the primary: %w", slot, err)
	}
	_ = standby.Exec(ctx, database, "SELECT pg_sync_replication_slots()")
	return nil
}

// TemporaryFailoverCopy creates a failover slot named after base on primary's database and
// returns its name once standby (FailoverStandby) holds a temporary copy of it, as a primary under
// load leaves one: a few transactions right after the creation move the standby's oldest safe
// catalog xmin past the slot's before the standby's worker copies it. Should the worker be quicker
// than those (its nap is 200ms at first), the copy may be persisted at once: that slot is dropped
// and another one tried, three at most.
func TemporaryFailoverCopy(t testing.TB, primary, standby *devenv.Postgres, database, base string) string {
	t.Helper()
	ctx := context.Background()
	for attempt := range 3 {
		slot := base
		if attempt > 0 {
			slot = fmt.Sprintf("%s_%d", base[:min(len(base), 60)], attempt)
		}
		if err := primary.Exec(ctx, database, fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput', false, false, true)", slot)); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if err := primary.Exec(ctx, database, "SELECT txid_current()"); err != nil {
				t.Fatal(err)
			}
		}
		state := ""
		deadline := time.Now().Add(time.Minute) // the worker's nap grows to 30s while nothing changes
		for state == "" {
			if time.Now().After(deadline) {
				t.Fatalf("the standby did not copy failover slot %s within a minute", slot)
			}
			time.Sleep(100 * time.Millisecond)
			// pg_replication_slots is the cluster's: read it in a database the standby surely has
			// (the slot's own may not be replayed there yet; a clean-clone run failed so).
			conn, err := pgx.Connect(ctx, standby.DSN("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			err = conn.QueryRow(ctx, "SELECT CASE WHEN temporary THEN 'temporary' ELSE 'persisted' END FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&state)
			conn.Close(ctx)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
		}
		if state == "temporary" {
			return slot
		}
		t.Logf("the standby's copy of slot %s was persisted at once; trying another slot", slot)
		if err := primary.Exec(ctx, database, fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", slot)); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("the standby persisted its copy of three new failover slots at once")
	return ""
}
