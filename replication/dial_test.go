package replication_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
)

// TestAStartThatFailsItsChecksLeavesNoReplicationConnection: the replication connection is dialled
// while the checks run; when they fail, what was dialled is closed, not left to the server's
// timeouts (a relay retrying a failing start would pile up walsenders, each one of
// max_wal_senders).
func TestAStartThatFailsItsChecksLeavesNoReplicationConnection(t *testing.T) {
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	app := testenv.UniqueName(t, "app")
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	slot := testenv.UniqueName(t, "slot")
	_, stop, ended := runStreamConfig(t, replication.Config{
		DSN: dsn + sep + "application_name=" + app, Slot: slot, Publication: slot + "_missing", Table: "outbox_events",
		CreateSlot: true, // CreatePublication off: a missing publication fails the checks for good
	}, zaptest.NewLogger(t))
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("a start with a missing publication did not end")
	}
	if err := stop(); err == nil || !replication.IsFatal(err) {
		t.Fatalf("Run = %v, want a fatal error", err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(2 * time.Second) // a connection left open would be closed only by a GC finalizer, or never
	for {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections of the failed start are still open", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
