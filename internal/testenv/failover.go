package testenv

import (
	"context"
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

// UseXIDs commits n transactions with an xid on database, so a standby's oldest safe catalog
// xmin moves past that of a slot created just before: its synchronised copy then starts
// temporary, as it does on a primary under load.
func UseXIDs(ctx context.Context, pg *devenv.Postgres, database string, n int) error {
	for range n {
		if err := pg.Exec(ctx, database, "SELECT txid_current()"); err != nil {
			return err
		}
	}
	return nil
}
