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

// TestASlotCreationCutShortIsRetriedNotTakenForALostSlot: a first start whose session ends while
// CREATE_REPLICATION_SLOT waits for an open transaction (here its walsender is ended; a network cut
// or a restart does the same) never had a slot. The next session creates it and streams; taking
// the slot it never created for a lost one (the process's memory counted any session past
// IDENTIFY_SYSTEM as streamed) stopped the relay with a fatal "slot no longer exists" error.
func TestASlotCreationCutShortIsRetriedNotTakenForALostSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, slot := testenv.OutboxDatabase(t, testenv.SharedPostgres(t)), testenv.UniqueName(t, "slot")
	admin := connectTo(t, dsn)
	// An open transaction with an id: creating a logical slot waits for it to end.
	blocker := connectTo(t, dsn)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}

	cfg := replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events", CreateSlot: true, CreatePublication: true}
	log, logs := observed(t)
	_, stop, ended := runStreamConfig(t, cfg, log)
	defer stop()
	var creating int32
	deadline := time.Now().Add(time.Minute)
	for creating == 0 {
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender' AND datname = current_database()
			AND state = 'active' AND query LIKE 'CREATE_REPLICATION_SLOT%'`).Scan(&creating)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no walsender waits to create the slot within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1, 10000)", creating); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, logs, "replication interrupted; reconnecting")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-ended:
			t.Fatalf("the stream ended after its slot's creation was cut short: %v", stop())
		default:
		}
		var pid *int32
		err := admin.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if pid != nil && *pid != creating {
			return // streams from the next session's walsender
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot does not stream a minute after its creation was cut short")
		}
	}
}

// TestASlotCreatedButNeverStreamedIsLostWhenItVanishes: a session that created the slot and ended
// before it streamed (BeforeStream failed: Kafka down, say) owns it all the same. Should the slot
// vanish before the next session, that session must take it for lost, even without a ledger to
// ask, not for a first start: a new slot would skip what was committed in between.
func TestASlotCreatedButNeverStreamedIsLostWhenItVanishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, slot := testenv.OutboxDatabase(t, testenv.SharedPostgres(t)), testenv.UniqueName(t, "slot")
	admin := connectTo(t, dsn)
	if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS public."+replication.LedgerTable); err != nil { // no ledger to ask
		t.Fatal(err)
	}
	calls := 0
	cfg := replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events", CreateSlot: true, CreatePublication: true,
		BeforeStream: func(ctx context.Context, _ string) error {
			calls++
			if calls > 1 {
				return nil
			}
			// The slot vanishes while the session that created it waits (dropped by hand, say).
			if _, err := admin.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
				t.Errorf("drop the slot: %v", err)
			}
			return errors.New("kafka is down")
		}}
	log, logs := observed(t)
	_, stop, ended := runStreamConfig(t, cfg, log)
	defer stop()
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the stream went on after the slot it created vanished")
	}
	if err := stop(); !errors.Is(err, replication.ErrSlotLost) {
		t.Fatalf("Run = %v, want ErrSlotLost", err)
	}
	if n := logs.FilterMessage("created replication slot").Len(); n != 1 {
		t.Fatalf("the slot was created %d times, want once", n)
	}
}

// connectTo opens an ordinary connection to dsn, closed when the test ends.
func connectTo(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
