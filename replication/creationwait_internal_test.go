package replication

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// TestTheWatcherOfASlotCreationRepeatsItsLineWhileTheWaitLastsAndEndsWithIt: the watcher is given
// a backend that waits for another's transaction id, as CREATE_REPLICATION_SLOT waits for the
// running transactions (here a row lock wait, the same lock). It must name the holder, repeat
// the line while the wait lasts, keep the gauge up, and, once stopped, be gone with the gauge at 0.
// faults.TestASlotCreationHeldUpByATransactionSaysWhatItWaitsFor covers a real slot's creation.
func TestTheWatcherOfASlotCreationRepeatsItsLineWhileTheWaitLastsAndEndsWithIt(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	connect := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	holder, waiter := connect(), connect()
	if _, err := holder.Exec(ctx, "CREATE TABLE held (id int PRIMARY KEY); INSERT INTO held VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "UPDATE held SET id = 1"); err != nil {
		t.Fatal(err)
	}
	holderPID, waiterPID := int32(holder.PgConn().PID()), int32(waiter.PgConn().PID())
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "UPDATE held SET id = 1")
		waited <- err
	}()

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	core, logs := observer.New(zap.WarnLevel)
	s := &Stream{cfg: Config{DSN: dsn, Slot: "s"}, log: zap.New(core), m: m,
		creationWaitTimes: creationWaitTimes{first: 20 * time.Millisecond, poll: 20 * time.Millisecond, logEvery: 150 * time.Millisecond}}
	stop := s.watchSlotCreation(ctx, waiterPID)
	named := fmt.Sprintf("backend PID %d", holderPID)
	for deadline := time.Now().Add(20 * time.Second); logs.FilterMessageSnippet(named).Len() < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("the watcher logged %d lines naming %s in 20 s, want it to repeat: %v", logs.FilterMessageSnippet(named).Len(), named, logs.All())
		}
	}
	if v := creationWaitGauge(t, reg); v <= 0 {
		t.Errorf("outbox_relay_slot_creation_wait_seconds = %v while the creation waits, want above 0", v)
	}
	stop()
	if v := creationWaitGauge(t, reg); v != 0 {
		t.Errorf("outbox_relay_slot_creation_wait_seconds = %v once the creation returned, want 0", v)
	}
	e := logs.FilterMessageSnippet(named).All()[0]
	if f := e.ContextMap(); f["blocking_pid"] != int32(holderPID) && f["blocking_pid"] != int64(holderPID) {
		t.Errorf("the line's blocking_pid field is %v, want %d", f["blocking_pid"], holderPID)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
}

// creationWaitGauge reads outbox_relay_slot_creation_wait_seconds from reg.
func creationWaitGauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "outbox_relay_slot_creation_wait_seconds" {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no outbox_relay_slot_creation_wait_seconds")
	return 0
}
