package prune_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/prune"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// WAL-based relaying never reads the rows: pruning every transaction's rows right after its commit,
// and deleting some in the very transaction that inserted them, must not cost a single event.
func TestTheRelayDeliversEverythingWhenRowsArePrunedRightAfterCommit(t *testing.T) {
	dsn, pool := newDB(t)
	kafkaSvc := testenv.SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	aggType := testenv.UniqueName(t, "order")
	// Created up front: the relay retries with backoff while a topic is auto-created.
	if err := kafkaSvc.CreateTopic(ctx, harness.TopicFor(aggType), 3); err != nil {
		t.Fatal(err)
	}

	slot := testenv.UniqueName(t, "slot")
	cols := decoder.DefaultColumns()
	r, err := relay.New(relay.Config{
		Replication: replication.Config{
			DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
			Columns:    []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload, cols.Headers},
			CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond,
		},
		Decoder:         decoder.Config{Table: "outbox_events", Columns: cols},
		Sink:            sink.Config{Brokers: []string{kafkaSvc.Brokers()}},
		ShutdownTimeout: 10 * time.Second,
	}, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(rctx) }()
	defer func() {
		stopRelay()
		select {
		case <-relayDone:
		case <-time.After(time.Minute):
			t.Error("relay did not stop within a minute")
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for count(t, pool, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active", slot) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the relay never started streaming")
		}
		time.Sleep(100 * time.Millisecond)
	}

	var pruned int64
	pruneNow := func() {
		n, err := prune.Prune(ctx, pool, prune.Options{BatchSize: 3})
		if err != nil {
			t.Fatal(err)
		}
		pruned += n
	}

	ob, err := harness.NewOutbox(ctx, dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		specs := make([]harness.Spec, 1+rng.IntN(4))
		for j := range specs {
			specs[j] = harness.Spec{AggregateType: aggType, AggregateID: fmt.Sprintf("o-%d", rng.IntN(10))}
		}
		if i%5 == 0 {
			// Insert and delete in one transaction: the table stays empty, the events still go.
			tx, err := ob.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			commit, err := ob.WriteIn(ctx, tx, specs...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "DELETE FROM outbox_events"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			commit()
			continue
		}
		if err := ob.WriteTx(ctx, specs...); err != nil {
			t.Fatal(err)
		}
		// Delete the rows at once, most likely before the relay has even decoded the transaction.
		pruneNow()
	}

	written := ob.Written()
	c := harness.NewConsumer(kafkaSvc.Brokers(), harness.TopicFor(aggType))
	defer c.Close()
	vctx, vcancel := context.WithTimeout(ctx, 90*time.Second)
	defer vcancel()
	err = c.ReadUntil(vctx, time.Second, func(recs []harness.Record) bool {
		return harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() || rep.Duplicates > 0 {
		t.Fatalf("delivery with pruning (read error: %v): %s", err, rep)
	}
	if left := count(t, pool, "SELECT count(*) FROM outbox_events"); pruned == 0 || left != 0 {
		t.Fatalf("%d rows pruned and %d left: the rows were not deleted, so the test proved nothing", pruned, left)
	}
	t.Logf("%d events delivered while %d rows were pruned", len(written), pruned)
}
