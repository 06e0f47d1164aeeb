package replication_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
)

// TestAReplacementWhoseRecoveryDidNotCompleteIsNotStreamedWithOnSlotLostStop: a recovery that
// stopped part way (a fatal line about its gap, a crash) leaves the replacement slot, healthy, and
// the recovery under way in the ledger. Started with on_slot_lost: stop (an operator who wanted
// it to stop trying), the relay streamed the replacement from its consistent point, skipping the
// rest of the gap without a word; it must stop and say how to finish the recovery.
func TestAReplacementWhoseRecoveryDidNotCompleteIsNotStreamedWithOnSlotLostStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, slot := testenv.OutboxDatabase(t, testenv.SharedPostgres(t)), testenv.UniqueName(t, "slot")
	admin := connectTo(t, dsn)
	if _, err := admin.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })
	if _, err := admin.Exec(ctx, `INSERT INTO outbox_relay_slots (slot, consistent_lsn, recovery_since)
		SELECT $1::text, confirmed_flush_lsn, now() - interval '1 minute' FROM pg_replication_slots WHERE slot_name = $1::text`, slot); err != nil {
		t.Fatal(err)
	}
	cfg := replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events", CreateSlot: true, CreatePublication: true,
		OnSlotLost: replication.SlotLostStop}
	log, _ := observed(t)
	_, stop, ended := runStreamConfig(t, cfg, log)
	defer stop()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream went on with the replacement of a lost slot whose gap was not all published")
	}
	err := stop()
	if !replication.IsFatal(err) || !strings.Contains(err.Error(), "on_slot_lost: recover") {
		t.Fatalf("Run = %v; want a fatal error saying to finish the recovery", err)
	}
}
