package replication_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
)

// relayLikeStream runs a stream whose consumer treats sessions as the relay does (relay.go): the
// tracker starts over only on another timeline, so what earlier sessions handed over and
// confirmed stays known; keepalives move it forward while idle. It returns the stream's end.
func relayLikeStream(t *testing.T, cfg replication.Config) (ended <-chan error, stop func()) {
	t.Helper()
	ended, stop, _ = relayLikeStreamSessions(t, cfg)
	return ended, stop
}

// relayLikeStreamSessions is relayLikeStream that also receives (without blocking the stream) once
// for each session that began streaming: the stream sends its Session message after
// START_REPLICATION.
func relayLikeStreamSessions(t *testing.T, cfg replication.Config) (ended <-chan error, stop func(), sessions <-chan struct{}) {
	t.Helper()
	began := make(chan struct{}, 16)
	tracker := checkpoint.New(0)
	s := replication.New(cfg, tracker, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan replication.Message, s.Buffer())
	go func() {
		for msg := range out {
			switch msg.Kind {
			case replication.Session:
				if msg.Timeline != tracker.Timeline() {
					tracker.Reset(msg.WALEnd, msg.Timeline)
				}
				select {
				case began <- struct{}{}:
				default:
				}
			case replication.Keepalive:
				tracker.Idle(msg.WALEnd)
			case replication.Data:
				msg.Release()
			}
		}
	}()
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		err := s.Run(ctx, out)
		drained := make(chan struct{})
		close(drained)
		finishCtx, cancelFinish := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancelFinish()
		s.Finish(finishCtx, drained)
		done <- err
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-finished:
		case <-time.After(time.Minute):
			t.Error("the stream did not stop within a minute")
		}
	}
	t.Cleanup(stop)
	return done, stop, began
}

// slotPosition reads the slot's confirmed position and the server's WAL end.
func slotPosition(t *testing.T, ctx context.Context, conn *pgx.Conn, slot string) (confirmed, walEnd pglogrepl.LSN) {
	t.Helper()
	var c *string
	var w string
	if err := conn.QueryRow(ctx, `SELECT (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1),
		pg_current_wal_lsn()::text`, slot).Scan(&c, &w); err != nil {
		t.Fatal(err)
	}
	if c != nil {
		confirmed = must(pglogrepl.ParseLSN(*c))
	}
	return confirmed, must(pglogrepl.ParseLSN(w))
}

// waitConfirmed waits until the slot is confirmed at the server's WAL end as it is now.
func waitConfirmed(t *testing.T, ctx context.Context, dsn, slot string) pglogrepl.LSN {
	t.Helper()
	conn := must(pgx.Connect(ctx, dsn))
	defer conn.Close(ctx)
	_, target := slotPosition(t, ctx, conn, slot)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if confirmed, _ := slotPosition(t, ctx, conn, slot); confirmed >= target {
			return confirmed
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("slot %s was not confirmed up to %s within a minute", slot, target)
	return 0
}

// A data directory restored in place (a cold copy, a volume snapshot) starts on the same timeline
// with an earlier end of WAL, and new commits reuse positions the relay has seen and confirmed.
// The relay must neither confirm beyond the server's end of WAL (PostgreSQL takes it, and every
// transaction below it is skipped for good) nor carry on as if nothing happened: it stops, naming
// the restore and the recovery.
func TestAServerRestoredFromAnEarlierCopyStopsTheStreamAndIsNeverConfirmedPastItsWALEnd(t *testing.T) {
	pg := testenv.Postgres(t)
	t.Run("while the stream reconnects", func(t *testing.T) { restoredWhileStreaming(t, pg) })
	t.Run("before a new term, with more WAL written since", func(t *testing.T) { restoredBeforeANewTerm(t, pg) })
}

func restoredWhileStreaming(t *testing.T, pg *devenv.Postgres) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, pg)
	slot := testenv.UniqueName(t, "slot")
	ended, stop := relayLikeStream(t, replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
		CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond})
	defer stop()
	walsenderPID(t, dsn, slot)
	waitConfirmed(t, ctx, dsn, slot)

	// The copy, taken while the server is stopped.
	copyDir := filepath.Join(t.TempDir(), "data-copy")
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.CopyData(ctx, copyDir); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Streamed and confirmed after the copy: history the restore takes back.
	insert := func(n int) {
		t.Helper()
		conn := must(pgx.Connect(ctx, dsn))
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'a', 'k' || i, 'e', ('{"pad": "'||repeat('x', 200)||'"}')::jsonb FROM generate_series(1, $1) i`, n); err != nil {
			t.Fatal(err)
		}
	}
	insert(2000)
	confirmed := waitConfirmed(t, ctx, dsn, slot)

	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.RestoreData(ctx, copyDir); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	insert(3)

	conn := must(pgx.Connect(ctx, dsn))
	defer conn.Close(ctx)
	deadline := time.Now().Add(90 * time.Second)
	for {
		slotAt, walEnd := slotPosition(t, ctx, conn, slot)
		if slotAt > walEnd {
			t.Fatalf("slot %s confirmed at %s, beyond the restored server's end of WAL %s (the relay had confirmed %s before the restore): everything committed below it is skipped for good",
				slot, slotAt, walEnd, confirmed)
		}
		select {
		case err := <-ended:
			if !replication.IsFatal(err) {
				t.Fatalf("the stream ended with %v, want a fatal error", err)
			}
			for _, want := range []string{slot, "restored", "forget-slot", "backfill"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("the stream's error does not mention %q: %v", want, err)
				}
			}
			t.Logf("stopped: %v", err)
			if slotAt, walEnd := slotPosition(t, ctx, conn, slot); slotAt > walEnd {
				t.Fatalf("slot %s confirmed at %s, beyond the server's end of WAL %s", slot, slotAt, walEnd)
			}
			return
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream went on streaming the restored server (slot at %s, relay had confirmed %s)", slotAt, confirmed)
		}
	}
}

// restoredBeforeANewTerm: the server is restored while the process is between two leadership terms,
// and the restored server has written more WAL than the relay saw before the next term starts, so
// its end of WAL no longer tells; its transaction ids do: it has not yet assigned ids the relay
// received commits of.
func restoredBeforeANewTerm(t *testing.T, pg *devenv.Postgres) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, pg)
	slot := testenv.UniqueName(t, "slot")
	process := replication.NewMemory()
	cfg := replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
		CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond, Memory: process}
	insert := func(transactions, rows int) {
		t.Helper()
		conn := must(pgx.Connect(ctx, dsn))
		defer conn.Close(ctx)
		for range transactions {
			if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'a', 'k' || i, 'e', ('{"pad": "'||repeat('x', 200)||'"}')::jsonb FROM generate_series(1, $1) i`, rows); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, stop := relayLikeStream(t, cfg)
	walsenderPID(t, dsn, slot)
	waitConfirmed(t, ctx, dsn, slot)
	copyDir := filepath.Join(t.TempDir(), "data-copy")
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.CopyData(ctx, copyDir); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	insert(20, 100) // 20 transaction ids the restore takes back
	waitConfirmed(t, ctx, dsn, slot)
	stop() // the term ends
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.RestoreData(ctx, copyDir); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	insert(1, 6000) // more WAL than the relay saw, in one transaction

	ended, stop := relayLikeStream(t, cfg) // the next term, same process
	defer stop()
	select {
	case err := <-ended:
		if !replication.IsFatal(err) || !strings.Contains(err.Error(), "next transaction id") || !strings.Contains(err.Error(), "forget-slot") {
			t.Fatalf("the next term ended with %v, want a fatal error naming the transaction ids and the recovery", err)
		}
		t.Logf("stopped: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the next term streams the restored server")
	}
	conn := must(pgx.Connect(ctx, dsn))
	defer conn.Close(ctx)
	if slotAt, walEnd := slotPosition(t, ctx, conn, slot); slotAt > walEnd {
		t.Fatalf("slot %s confirmed at %s, beyond the server's end of WAL %s", slot, slotAt, walEnd)
	}
}

// Between two sessions of one process (the walsender ended, the relay reconnecting), someone
// advances the slot or drops and recreates it: its confirmed position is then beyond anything the
// relay confirmed, and the outbox rows committed in between were never streamed. The relay must
// not adopt that position: it stops, naming the slot, both positions and the recovery, and
// confirms nothing.
func TestASlotMovedAheadBetweenTwoSessionsStopsTheStream(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	tests := []struct {
		name string
		move []string // SQL run while the relay cannot reconnect; $1 is the slot
	}{
		{"advanced by someone", []string{"SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())"}},
		{"dropped and recreated", []string{"SELECT pg_drop_replication_slot($1)", "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := testenv.OutboxDatabase(t, pg)
			slot := testenv.UniqueName(t, "slot")
			ended, stop, sessions := relayLikeStreamSessions(t, replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
				CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond})
			defer stop()
			// Once the first session streams: a walsender ended while it still creates the slot
			// (active then too) ends a session that never streamed, and the next session's stream
			// rightly cannot tell whether another relay moved the slot (a CI run under load).
			select {
			case <-sessions:
			case err := <-ended:
				t.Fatalf("the stream ended before it streamed: %v", err)
			case <-time.After(time.Minute):
				t.Fatal("the stream did not stream within a minute")
			}
			pid := walsenderPID(t, dsn, slot)
			confirmed := waitConfirmed(t, ctx, dsn, slot)

			conn := must(pgx.Connect(ctx, dsn))
			defer conn.Close(ctx)
			var db string
			if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
				t.Fatal(err)
			}
			// Keep the relay out while the slot is moved (this connection stays).
			allow := func(on bool) {
				t.Helper()
				if err := pg.Exec(ctx, "postgres", "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" WITH ALLOW_CONNECTIONS "+map[bool]string{true: "true", false: "false"}[on]); err != nil {
					t.Fatal(err)
				}
			}
			allow(false)
			defer allow(true)
			var gone bool
			if err := conn.QueryRow(ctx, "SELECT pg_terminate_backend($1, 10000)", pid).Scan(&gone); err != nil || !gone {
				t.Fatalf("terminate the walsender: %v %v", gone, err)
			}
			if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'a', 'k' || i, 'never streamed', '{}' FROM generate_series(1, 10) i`); err != nil {
				t.Fatal(err)
			}
			for _, sql := range tt.move {
				if _, err := conn.Exec(ctx, sql, slot); err != nil {
					t.Fatal(err)
				}
			}
			moved, _ := slotPosition(t, ctx, conn, slot)
			if moved <= confirmed {
				t.Fatalf("the slot is at %s, not beyond what the relay confirmed (%s): the test moves nothing", moved, confirmed)
			}
			allow(true)

			select {
			case err := <-ended:
				if !replication.IsFatal(err) {
					t.Fatalf("the stream ended with %v, want a fatal error", err)
				}
				for _, want := range []string{slot, "confirmed it only up to", moved.String(), "forget-slot"} {
					if !strings.Contains(err.Error(), want) {
						t.Fatalf("the stream's error does not mention %q: %v", want, err)
					}
				}
				t.Logf("stopped: %v", err)
			case <-time.After(time.Minute):
				slotAt, _ := slotPosition(t, ctx, conn, slot)
				t.Fatalf("the stream adopted the slot moved from %s to %s (now at %s) and goes on", confirmed, moved, slotAt)
			}
			if slotAt, _ := slotPosition(t, ctx, conn, slot); slotAt != moved {
				t.Fatalf("the slot is at %s, want %s: the stopping relay confirmed something", slotAt, moved)
			}
		})
	}
}

// The legitimate case next to the one above: another relay process led in between (a takeover)
// and confirmed the slot further; this process's next term finds the slot beyond what it confirmed
// itself, and the ledger names the other relay as the last to stream it: it goes on.
func TestANewTermGoesOnFromWhereAnotherRelayConfirmedTheSlot(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	slot := testenv.UniqueName(t, "slot")
	processA, processB := replication.NewMemory(), replication.NewMemory()
	term := func(mem *replication.Memory) (<-chan error, func()) {
		return relayLikeStream(t, replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
			CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond, Memory: mem})
	}
	conn := must(pgx.Connect(ctx, dsn))
	defer conn.Close(ctx)
	lead := func(name string, mem *replication.Memory) {
		t.Helper()
		ended, stop := term(mem)
		walsenderPID(t, dsn, slot)
		if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'a', 'k' || i, 'e', '{}' FROM generate_series(1, 50) i`); err != nil {
			t.Fatal(err)
		}
		waitConfirmed(t, ctx, dsn, slot)
		select {
		case err := <-ended:
			t.Fatalf("%s: the stream ended: %v", name, err)
		default:
		}
		stop()
		waitFor := time.Now().Add(30 * time.Second)
		for {
			var active bool
			if err := conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active); err != nil {
				t.Fatal(err)
			}
			if !active {
				break
			}
			if time.Now().After(waitFor) {
				t.Fatalf("%s: the slot is still active after the stop", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	lead("process A, first term", processA)
	lead("process B", processB)
	lead("process A, next term", processA)
}

// A publication altered between one leadership term of a process and its next (publish switched
// off and on while the lock changed hands back to it, or during the new term's first moments) is
// caught as between two checks of one term: rows inserted meanwhile are not in the stream. The
// process's memory carries the last check's read to the next term's first.
func TestAPublicationAlteredBetweenTwoTermsOfOneProcessStopsTheStream(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	slot := testenv.UniqueName(t, "slot")
	process := replication.NewMemory()
	term := func() (<-chan error, func()) {
		return relayLikeStream(t, replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
			CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond, Memory: process})
	}
	conn := must(pgx.Connect(ctx, dsn))
	defer conn.Close(ctx)
	insert := func(n int) {
		t.Helper()
		if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'a', 'k' || i, 'e', '{}' FROM generate_series(1, $1::int) i`, n); err != nil {
			t.Fatal(err)
		}
	}
	ended, stop := term()
	walsenderPID(t, dsn, slot)
	insert(20)
	waitConfirmed(t, ctx, dsn, slot)
	stop()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("first term: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("first term did not end")
	}

	// Between the terms: publish leaves out inserts, rows are written, publish is set back.
	pub := pgx.Identifier{slot}.Sanitize()
	if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+pub+" SET (publish = 'update')"); err != nil {
		t.Fatal(err)
	}
	_, before := slotPosition(t, ctx, conn, slot)
	insert(5)
	if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+pub+" SET (publish = 'insert')"); err != nil {
		t.Fatal(err)
	}

	ended, stop = term()
	defer stop()
	select {
	case err := <-ended:
		if err == nil || !strings.Contains(err.Error(), "was altered") || !replication.IsFatal(err) {
			t.Fatalf("next term ended with %v, want the fatal error that the publication was altered", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the next term streams on although the publication left out the rows inserted between the terms")
	}
	if confirmed, _ := slotPosition(t, ctx, conn, slot); confirmed > before {
		t.Errorf("slot confirmed at %s, past %s where the rows the publication left out begin", confirmed, before)
	}
}
