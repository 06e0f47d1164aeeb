package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/netproxy"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sink"
)

// running is a relay started by a test, with its metrics and warnings.
type running struct {
	r        *relay.Relay
	reg      *prometheus.Registry
	warns    *observer.ObservedLogs
	cancel   context.CancelFunc
	done     chan error    // Run's result, for the test
	finished chan struct{} // closed once Run returned, for the cleanup
}

func (f *fixture) launch(cfg relay.Config) *running {
	f.t.Helper()
	core, warns := observer.New(zap.WarnLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(f.t).Core(), core))
	reg := prometheus.NewRegistry()
	r, err := relay.New(cfg, log, metrics.New(reg))
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{r: r, reg: reg, warns: warns, cancel: cancel, done: make(chan error, 1), finished: make(chan struct{})}
	go func() {
		run.done <- r.Run(ctx)
		close(run.finished)
	}()
	f.t.Cleanup(func() {
		cancel()
		select {
		case <-run.finished:
		case <-time.After(time.Minute):
			f.t.Error("relay did not stop within a minute")
		}
	})
	return run
}

// stop cancels Run's context (SIGTERM) and returns Run's error and how long it took.
func (run *running) stop(t *testing.T, limit time.Duration) (error, time.Duration) {
	t.Helper()
	run.cancel()
	start := time.Now()
	select {
	case err := <-run.done:
		return err, time.Since(start)
	case <-time.After(limit):
		t.Fatalf("Run did not return within %s of the stop", limit)
	}
	return nil, 0
}

// warned reports whether a warning (or worse) containing text was logged.
func (run *running) warned(text string) bool {
	return run.warns.FilterMessageSnippet(text).Len() > 0
}

// TestStopWhileWaitingForKafkaBeforeStreamingIsPrompt: a SIGTERM while the relay waits for Kafka
// (before START_REPLICATION) has no copy stream to end: it must return at once, without a warning
// about a final position it could not report.
func TestStopWhileWaitingForKafkaBeforeStreamingIsPrompt(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), "127.0.0.1:1", 1)
	run := f.launch(f.config())
	await.True(t, time.Minute, "the slot to be created", func() bool {
		var n int
		f.outbox.Pool().QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&n)
		return n == 1
	})
	await.True(t, time.Minute, "the relay to wait for Kafka (WaitReady)", run.r.Sink().Starting)
	err, took := run.stop(t, time.Minute)
	if err != nil {
		t.Errorf("Run returned %v after a clean stop", err)
	}
	if run.warned("final position") {
		t.Errorf("the stop warned about the final position, but no copy stream had started: %v", run.warns.FilterMessageSnippet("final position").All())
	}
	// Without a copy stream to end there is nothing to wait for (the old code waited 5s for a
	// CopyDone that a connection not in copy mode never sends).
	if took > 3*time.Second {
		t.Errorf("Run took %s to return", took.Round(time.Millisecond))
	}
}

// TestStopWhileTheStreamIsCutInsideATransactionIsPrompt: the replication connection is cut in the
// middle of a large transaction and cannot come back (the database refuses connections), then
// SIGTERM. The transaction's Commit can never arrive in this session, so waiting for it would only
// burn shutdown_timeout: the relay must stop reconnecting, forget the open transaction (the next
// start replays it from its Begin) and return at once. Its events already sent are published
// again then: duplicates, never a loss.
func TestStopWhileTheStreamIsCutInsideATransactionIsPrompt(t *testing.T) {
	const (
		events          = 3000
		shutdownTimeout = 20 * time.Second
		maxStop         = 5 * time.Second
	)
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	cfg := f.config()
	cfg.Sink.MaxInFlight = 20 // the transaction takes a while
	cfg.ShutdownTimeout = shutdownTimeout
	run := f.launch(cfg)
	f.waitSlotActive()
	specs := make([]harness.Spec, events)
	for i := range specs {
		specs[i] = harness.Spec{AggregateType: f.types[0], AggregateID: fmt.Sprintf("agg-%d", i%7)}
	}
	ctx := context.Background()
	if err := f.outbox.WriteTx(ctx, specs...); err != nil {
		t.Fatal(err)
	}
	await.True(t, time.Minute, "the transaction's first events to be published", func() bool { return published(t, run.reg) > 0 })

	var db string
	if err := f.outbox.Pool().QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	pc, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	allow := func(on bool) {
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t", pgx.Identifier{db}.Sanitize(), on)); err != nil {
			t.Fatal(err)
		}
	}
	allow(false)
	defer allow(true)
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", f.slot); err != nil {
		t.Fatal(err)
	}
	await.True(t, time.Minute, "the relay to notice the cut", func() bool { return run.warned("replication interrupted") })
	at := published(t, run.reg)
	if at >= events {
		t.Fatalf("all %d events were published before the cut", events)
	}

	err, took := run.stop(t, shutdownTimeout+30*time.Second)
	t.Logf("%v of %d events published at the stop; Run returned %v after %s", at, events, err, took.Round(time.Millisecond))
	if err != nil {
		t.Errorf("Run returned %v after a clean stop", err)
	}
	if took > maxStop {
		t.Errorf("Run took %s to return, want at most %s (shutdown_timeout %s): it waited for a Commit that cannot come", took.Round(time.Millisecond), maxStop, shutdownTimeout)
	}
	if run.warned("shutdown timeout") {
		t.Error("the stop ran into the shutdown timeout")
	}

	// The next start replays the transaction from its Begin: everything arrives.
	allow(true)
	f.start(f.config())
	rep := f.verify(2*time.Minute, true)
	t.Logf("after the restart: %s", rep)
}

// TestStopWhileHaltedIsPrompt: under the halt policy an event that cannot be published stops the
// sink for good; nothing after it will be acknowledged. A SIGTERM then has nothing to wait for: it
// must exit at once (not after shutdown_timeout, not logging a timeout), with the slot still
// before the halted event.
func TestStopWhileHaltedIsPrompt(t *testing.T) {
	const (
		shutdownTimeout = 20 * time.Second
		maxStop         = 5 * time.Second
	)
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	cfg := f.config()
	cfg.Sink.Policy = sink.Halt
	cfg.ShutdownTimeout = shutdownTimeout
	run := f.launch(cfg)
	f.waitSlotActive()
	ctx := context.Background()
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "a"}); err != nil {
		t.Fatal(err)
	}
	await.True(t, time.Minute, "the first event to be published", func() bool { return published(t, run.reg) == 1 })

	// "bad type!" makes a topic name Kafka refuses: the sink halts on it.
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: "bad type!", AggregateID: "b"}); err != nil {
		t.Fatal(err)
	}
	haltedEnd := f.currentLSN()
	// A transaction after it: its event waits in front of the halted sink.
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "a"}); err != nil {
		t.Fatal(err)
	}
	var haltedID string
	await.True(t, time.Minute, "the sink to halt", func() bool {
		id, _, _, halted := run.r.Sink().Halted()
		haltedID = id
		return halted
	})
	// Everything at or past haltedEnd is the next transaction (received_lsn is where a message
	// starts: the halted transaction's own messages all start before its end).
	await.True(t, time.Minute, "the relay to receive the next transaction", func() bool {
		return receivedLSN(t, run.reg) >= float64(haltedEnd)
	})

	err, took := run.stop(t, shutdownTimeout+30*time.Second)
	if err != nil {
		t.Errorf("Run returned %v after a stop while halted", err)
	}
	if took > maxStop {
		t.Errorf("Run took %s to return, want at most %s (shutdown_timeout %s)", took.Round(time.Millisecond), maxStop, shutdownTimeout)
	}
	if run.warned("shutdown timeout") {
		t.Error("the stop ran into the shutdown timeout")
	}
	if lines := run.warns.FilterMessageSnippet("halted").FilterField(zap.String("event_id", haltedID)).Len(); lines < 1 {
		t.Errorf("the stop did not say the relay is halted on event %s (%d lines)", haltedID, lines)
	}
	if got := f.confirmedLSN(); got >= haltedEnd {
		t.Fatalf("the slot was confirmed to %X, past the halted event's transaction (ends by %X)", got, haltedEnd)
	}
	if got := published(t, run.reg); got != 1 {
		t.Errorf("%v events published, want 1: nothing after the halted event", got)
	}
}

// TestAFenceDoesNotWaitForASilentServer: a fenced relay must let go at once, even when PostgreSQL
// no longer answers (the typical reason for the fence): the final position is sent without waiting
// for the server to read it, and the connection is closed without a goodbye.
func TestAFenceDoesNotWaitForASilentServer(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := netproxy.New(t, u.Host)
	u.Host = proxy.Addr
	cfg := f.config()
	cfg.Replication.DSN = u.String()
	run := f.launch(cfg)
	f.waitSlotActive()
	if err := f.outbox.WriteTx(context.Background(), harness.Spec{AggregateType: f.types[0], AggregateID: "a"}); err != nil {
		t.Fatal(err)
	}
	await.True(t, time.Minute, "the event to be published", func() bool { return published(t, run.reg) == 1 })

	proxy.Freeze()
	// The walsender behind the frozen proxy would hold the slot until wal_sender_timeout, and the
	// database could not be dropped before.
	t.Cleanup(func() {
		f.outbox.Pool().Exec(context.Background(), "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", f.slot)
	})
	run.r.Fence()
	start := time.Now()
	select {
	case err := <-run.done:
		if !errors.Is(err, relay.ErrFenced) {
			t.Errorf("Run returned %v, want ErrFenced", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of the fence")
	}
	// The old code waited 5s for the server's CopyDone, then up to 5s more to close.
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Run took %s to return after the fence", took.Round(time.Millisecond))
	}
}
