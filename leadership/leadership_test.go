package leadership_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/health"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/leadership"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// instance is one leadership.Run, as a process of the binary would run it.
type instance struct {
	m    *metrics.Metrics
	done chan error
	stop context.CancelFunc
}

func start(t *testing.T, cfg leadership.Config) *instance {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{m: metrics.New(prometheus.NewRegistry()), done: make(chan error, 1), stop: cancel}
	go func() { in.done <- leadership.Run(ctx, cfg, zaptest.NewLogger(t), in.m, &health.State{}) }()
	t.Cleanup(func() {
		in.stop()
		select {
		case <-in.done:
		case <-time.After(time.Minute):
			t.Error("leadership.Run did not return within a minute of its context's end")
		}
	})
	return in
}

// value reads a gauge's or a counter's value.
func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var out dto.Metric
	if err := (<-ch).Write(&out); err != nil {
		panic(err)
	}
	if g := out.GetGauge(); g != nil {
		return g.GetValue()
	}
	return out.GetCounter().GetValue()
}

// waitFor polls cond until it holds, failing the test with what after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// closedAddr is an address where nothing listens: a Kafka that is down. Each term's relay then
// creates the slot and waits for Kafka, which is all a term needs to be held.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestALeaderThatLosesItsLockFencesItsRelayAndTheStandbyTakesOver: two instances on one slot,
// run by the package alone (no binary): one leads, the other stands by. When the leader's lock
// connection is cut, its term is lost: it fences its relay (counted), stops reporting leadership
// and stands by, and the standby takes over. Both end cleanly when their context ends.
func TestALeaderThatLosesItsLockFencesItsRelayAndTheStandbyTakesOver(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	slot := testenv.UniqueName(t, "slot")
	cols := decoder.DefaultColumns()
	cfg := leadership.Config{
		Relay: relay.Config{
			Replication: replication.Config{
				DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
				Columns:    []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload, cols.Headers},
				CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond,
			},
			Decoder:         decoder.Config{Table: "outbox_events", Columns: cols},
			Sink:            sink.Config{Brokers: []string{closedAddr(t)}},
			ShutdownTimeout: 5 * time.Second,
		},
		Election:     &leader.Config{DSN: dsn, Slot: slot, RetryInterval: 200 * time.Millisecond},
		SlotBusyWait: time.Minute,
	}
	a := start(t, cfg)
	waitFor(t, 30*time.Second, "instance a leads", func() bool { return value(a.m.Leader) == 1 })
	b := start(t, cfg)

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var holder leader.Holder
	waitFor(t, 10*time.Second, "the leader lock is held", func() bool {
		h, held, err := leader.LockHolder(ctx, conn, slot)
		holder = h
		return err == nil && held
	})
	if value(b.m.Leader) != 0 {
		t.Fatal("instance b reports leadership while a holds the lock")
	}
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", holder.PID); err != nil {
		t.Fatal(err)
	}
	// The lock is free at once; a finds its term lost at its next check (every second) and fences.
	waitFor(t, 30*time.Second, "instance a fences its relay after its lock connection was cut", func() bool {
		return value(a.m.Fenced) == 1 && value(a.m.Leader) == 0
	})
	waitFor(t, 30*time.Second, "instance b leads after a's lock connection was cut", func() bool { return value(b.m.Leader) == 1 })
	if got := value(a.m.Fenced); got != 1 {
		t.Errorf("instance a counted %v fences, want 1 (its term was lost once)", got)
	}
	if value(a.m.Leader) != 0 {
		t.Error("instance a reports leadership again while b holds the lock")
	}
	for name, in := range map[string]*instance{"a": a, "b": b} {
		in.stop()
		select {
		case err := <-in.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("instance %s ended with %v, want a clean stop", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("instance %s did not stop within 30s of its context's end", name)
		}
		in.done <- nil // for the cleanup
	}
}
