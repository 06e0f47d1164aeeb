package replication

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestANewSlotIsRecordedEvenWhenTheRelayIsStoppingMeanwhile: a relay told to stop while it creates
// its slot (a rolling restart right after a first start) leaves the slot behind; if the ledger
// misses it, losing that slot later cannot be told from a first start, and a new slot silently
// skips what was committed in between. The record is written even though the caller's context
// has ended.
func TestANewSlotIsRecordedEvenWhenTheRelayIsStoppingMeanwhile(t *testing.T) {
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	slot := testenv.UniqueName(t, "slot")
	s := &Stream{cfg: Config{DSN: dsn, Slot: slot}, log: zaptest.NewLogger(t), ledger: NewLedger("public")}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.recordSlot(ctx, 0x1234)

	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	e, ok, err := s.ledger.Lookup(context.Background(), conn, slot)
	if err != nil || !ok || e.ConsistentLSN != 0x1234 {
		t.Fatalf("ledger entry %+v (found %v, %v), want the slot recorded at 0/1234", e, ok, err)
	}
}

// TestAStoppingStreamDoesNotBlameTheLedger: recording the server's identity is retried by every
// session; a stream already stopping skips it, instead of failing to connect and warning the
// operator to run migrate and grant rights, which nothing is wrong with.
func TestAStoppingStreamDoesNotBlameTheLedger(t *testing.T) {
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	core, logs := observer.New(zap.DebugLevel)
	s := &Stream{cfg: Config{DSN: dsn, Slot: testenv.UniqueName(t, "slot")}, log: zap.New(core), ledger: NewLedger("public"),
		identity: Identity{SystemID: "1", Timeline: 1}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.recordIdentity(ctx)
	if logs.Len() != 0 {
		t.Fatalf("a stopping stream logged %q", logs.All()[0].Message)
	}
}
