package slotmon_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/slotmon"
)

// PostgreSQL takes a confirmed position beyond its end of WAL as it is: that is what a relay that
// streamed another history (a data directory restored from an earlier copy) leaves, and every
// transaction below it is then skipped. The monitor reports how far ahead the slot is instead of
// showing a lag of 0.
func TestASlotConfirmedBeyondTheServersEndOfWALIsReportedNotShownAsNoLag(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	slot := testenv.UniqueName(t, "slot")
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{slot}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", slot)
	})

	// A client that confirms 1 MiB beyond the server's end of WAL.
	rconf, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	rconf.RuntimeParams["replication"] = "database"
	repl, err := pgconn.ConnectConfig(ctx, rconf)
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close(context.Background())
	sys, err := pglogrepl.IdentifySystem(ctx, repl)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, repl, pgx.Identifier{slot}.Sanitize(), 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + slot + "'"}}); err != nil {
		t.Fatal(err)
	}
	beyond := sys.XLogPos + 1<<20
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, repl, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: beyond, WALFlushPosition: beyond, WALApplyPosition: beyond, ClientTime: time.Now()}); err != nil {
		t.Fatal(err)
	}

	var st slotmon.State
	for {
		if st, err = slotmon.Read(ctx, conn, slot); err != nil {
			t.Fatal(err)
		}
		if st.ConfirmedFlush == beyond {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the slot was not confirmed at %s (at %s)", beyond, st.ConfirmedFlush)
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := int64(st.ConfirmedFlush - st.CurrentLSN)
	if st.LagBytes != 0 || want <= 0 || st.AheadOfWALBytes != want {
		t.Fatalf("slot confirmed at %s, server at %s: lag %d, ahead %d; want lag 0 and ahead %d", st.ConfirmedFlush, st.CurrentLSN, st.LagBytes, st.AheadOfWALBytes, want)
	}
	m := metrics.New(prometheus.NewRegistry())
	slotmon.Publish(m, st)
	if got := value(m.SlotAheadOfWALBytes); got != float64(want) {
		t.Fatalf("slot_confirmed_ahead_of_wal_bytes = %v, want %d", got, want)
	}
	slotmon.Publish(m, slotmon.State{Slot: slot})
	if got := value(m.SlotAheadOfWALBytes); got != 0 {
		t.Fatalf("slot_confirmed_ahead_of_wal_bytes = %v for a missing slot, want 0", got)
	}
}
