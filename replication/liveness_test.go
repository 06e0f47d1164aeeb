package replication_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
)

// runStream runs a Stream on dsn with a consumer that does what the relay does with an idle
// outbox: take up each session's timeline and advance on keepalives. It returns the metrics and a
// stop function that returns Run's error.
func runStream(t *testing.T, dsn, slot string, receiveTimeout time.Duration) (*prometheus.Registry, func() error) {
	t.Helper()
	reg, stop, _ := runStreamConfig(t, replication.Config{
		DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
		CreateSlot: true, CreatePublication: true, ReceiveTimeout: receiveTimeout,
	}, zaptest.NewLogger(t))
	return reg, stop
}

// runStreamConfig is runStream with the whole configuration and logger; ended is closed when Run
// returns by itself (a fatal error), after which stop returns that error at once.
func runStreamConfig(t *testing.T, cfg replication.Config, log *zap.Logger) (reg *prometheus.Registry, stop func() error, ended <-chan struct{}) {
	t.Helper()
	reg = prometheus.NewRegistry()
	m := metrics.New(reg)
	tracker := checkpoint.New(0)
	s := replication.New(cfg, tracker, log, m)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan replication.Message, s.Buffer())
	go func() {
		for msg := range out {
			switch msg.Kind {
			case replication.Session:
				tracker.Reset(msg.WALEnd, msg.Timeline)
			case replication.Keepalive:
				tracker.Idle(msg.WALEnd)
			}
		}
	}()
	done := make(chan error, 1)
	runEnded := make(chan struct{})
	go func() {
		err := s.Run(ctx, out)
		close(runEnded)
		if err == nil {
			// Finish belongs to a clean end: without it the publication checks would outlive the
			// test and log after it.
			drained := make(chan struct{})
			close(drained)
			if ferr := s.Finish(context.Background(), drained); ferr != nil {
				t.Logf("Finish: %v", ferr)
			}
		}
		done <- err
	}()
	var runErr error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				t.Fatal("stream did not stop within a minute")
			}
			// Finish stops the publication checks, which outlive Run for it: none may log after
			// the test.
			drained := make(chan struct{})
			close(drained)
			finishCtx, cancelFinish := context.WithTimeout(context.Background(), time.Minute)
			defer cancelFinish()
			s.Finish(finishCtx, drained)
		}
		return runErr
	}
	t.Cleanup(func() { stop() })
	return reg, stop, runEnded
}

// reconnects reads the stream's reconnect counter.
func reconnects(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if !strings.HasSuffix(f.GetName(), "reconnects_total") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == "postgres" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// walsenderPID waits until slot is streamed and returns its walsender's PID.
func walsenderPID(t *testing.T, dsn, slot string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var pid *int32
		err := conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if pid != nil {
			return int(*pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("slot %s never became active", slot)
	return 0
}

// repliedAfter waits until the walsender with pid has received a status update the stream sent
// after at (pg_stat_replication.reply_time), and fails at once if that walsender is gone.
func repliedAfter(t *testing.T, dsn string, pid int, at time.Time) {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	await.State(t, time.Minute, "a status update sent after "+at.Format(time.TimeOnly), func() (bool, string) {
		var reply *time.Time
		err := conn.QueryRow(ctx, "SELECT reply_time FROM pg_stat_replication WHERE pid = $1", pid).Scan(&reply)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			t.Fatalf("walsender %d is gone before %s: the stream replaced its connection", pid, at.Format(time.TimeOnly))
		case err != nil:
			t.Fatal(err)
		case reply == nil:
			return false, "no reply yet"
		}
		return reply.After(at), "the last reply sent at " + reply.Format(time.TimeOnly+".000")
	})
}

func withOption(t *testing.T, dsn, option string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", option)
	u.RawQuery = q.Encode()
	return u.String()
}

// On an idle database the walsender sends nothing while the relay's status updates keep arriving
// (with wal_sender_timeout 0, never): the stream must not take that silence for a dead connection,
// yet must still notice one that is, within the receive timeout (here longer than
// wal_sender_timeout and two status intervals, which would otherwise extend it).
func TestIdleStreamKeepsItsConnectionAndDetectsAFrozenOne(t *testing.T) {
	const receiveTimeout = 3 * time.Second
	pg := testenv.Postgres(t)
	tests := []struct {
		name   string
		option string // for the connections' startup
	}{
		{"with a wal_sender_timeout shorter than the receive timeout", "--wal_sender_timeout=2s"},
		{"with wal_sender_timeout 0", "--wal_sender_timeout=0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dsn := testenv.OutboxDatabase(t, pg)
			if tt.option != "" {
				dsn = withOption(t, dsn, tt.option)
			}
			slot := testenv.UniqueName(t, "slot")
			m, stop := runStream(t, dsn, slot, receiveTimeout)
			pid := walsenderPID(t, dsn, slot)

			// Time is the subject (silence from the server for longer than the receive timeout),
			// and the server's own record marks it: the walsender keeps getting the stream's status
			// updates, on the same connection, until one sent two receive timeouts after it began.
			repliedAfter(t, dsn, pid, time.Now().Add(2*receiveTimeout))
			if n := reconnects(t, m); n != 0 {
				t.Fatalf("%v reconnects on an idle, healthy connection within %s (receive timeout %s)", n, 2*receiveTimeout, receiveTimeout)
			}
			if now := walsenderPID(t, dsn, slot); now != pid {
				t.Fatalf("the walsender changed from PID %d to %d: the connection was replaced", pid, now)
			}

			// The server stops answering without closing the connection.
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
			frozen := time.Now()
			for reconnects(t, m) == 0 {
				if time.Since(frozen) > 3*receiveTimeout {
					t.Fatalf("a frozen connection was not given up within %s (receive timeout %s)", 3*receiveTimeout, receiveTimeout)
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("a frozen connection was given up after %s", time.Since(frozen).Round(100*time.Millisecond))
			syscall.Kill(pid, syscall.SIGCONT)
			if err := stop(); err != nil {
				t.Fatalf("Run = %v", err)
			}
		})
	}
}

// A healthy walsender decoding one large transaction (here of a table outside the publication, so
// it sends nothing meanwhile) reads the relay's messages only when it has not heard from it for
// half its wal_sender_timeout, so it may not answer a request for a reply for up to about
// wal_sender_timeout: the stream must wait that long before presuming it dead, whatever its own
// receive timeout, or it reconnects and the server starts the decode over, for ever. With
// wal_sender_timeout 0 the walsender reads them at every progress update, and answers at once.
func TestBusyWalsenderIsNotTakenForADeadOne(t *testing.T) {
	// Shorter than the large transaction's decoding (about 20 s here), so the probes are what keeps
	// the session; 1s was too tight for a walsender starved of CPU by a loaded 2-core machine (seen
	// at load 14), and so was 2s once in a clean-clone run: a walsender reading WAL as fast as the
	// insert writes it reads no replies, and with wal_sender_timeout 0 sends nothing, for seconds.
	// (The default is 2 minutes.)
	const receiveTimeout = 4 * time.Second
	pg := testenv.Postgres(t)
	for _, senderTimeout := range []string{"4s", "0"} {
		t.Run("wal_sender_timeout "+senderTimeout, func(t *testing.T) {
			dsn := withOption(t, testenv.OutboxDatabase(t, pg), "--wal_sender_timeout="+senderTimeout)
			slot := testenv.UniqueName(t, "slot")
			m, stop := runStream(t, dsn, slot, receiveTimeout)
			walsenderPID(t, dsn, slot)
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "CREATE TABLE other (id int)"); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := conn.Exec(ctx, "INSERT INTO other SELECT g FROM generate_series(1, 3000000) g"); err != nil {
				t.Fatal(err)
			}
			var target string
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target); err != nil {
				t.Fatal(err)
			}
			t.Logf("the large transaction took %s", time.Since(start).Round(100*time.Millisecond))
			start = time.Now()
			for {
				var passed bool
				err := conn.QueryRow(ctx, "SELECT coalesce(bool_or(sent_lsn >= $1::pg_lsn), false) FROM pg_stat_replication WHERE application_name = 'outbox-relay'", target).Scan(&passed)
				if err != nil {
					t.Fatal(err)
				}
				if passed {
					break
				}
				if time.Since(start) > 2*time.Minute {
					t.Fatalf("the walsender did not pass the large transaction within 2 minutes (%v reconnects)", reconnects(t, m))
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("the walsender passed it after %s", time.Since(start).Round(100*time.Millisecond))
			if n := reconnects(t, m); n != 0 {
				t.Fatalf("%v reconnects while a healthy walsender decoded a large transaction", n)
			}
			if err := stop(); err != nil {
				t.Fatalf("Run = %v", err)
			}
		})
	}
}
