package sink_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestSinkWithABrokerThatGoesAway stops a dedicated broker for 20s while a sink publishes
// continuously, and meanwhile calls WaitReady on fresh sinks: one with a context that ends while
// the broker is down, one that must outlast the outage. One outage serves all of them because
// starting a broker is the slow part. The idempotent producer (on by default) keeps the requests
// the broker wrote just before it stopped, and answered no more, from being written twice.
func TestSinkWithABrokerThatGoesAway(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "restart")
	if err := k.CreateTopic(context.Background(), topic, 3); err != nil {
		t.Fatal(err)
	}
	s := readySink(t, k.Brokers(), sink.Config{
		Record:          record.Options{TopicTemplate: topic},
		DeadLetterTopic: testenv.UniqueName(t, "dlq"),
		MaxInFlight:     2000,
		WriteTimeout:    3 * time.Second,
	})
	// A second sink with exactly-once delivery rides out the same outage: its Kafka transaction
	// outlives the 20s (timeout 60s), the broker keeps it across the restart, and it commits.
	txTopic := testenv.UniqueName(t, "restart_tx")
	if err := k.CreateTopic(context.Background(), txTopic, 3); err != nil {
		t.Fatal(err)
	}
	tx := readySink(t, k.Brokers(), sink.Config{
		Record: record.Options{TopicTemplate: txTopic}, DeadLetterTopic: testenv.UniqueName(t, "dlq"), MaxInFlight: 2000, WriteTimeout: 3 * time.Second,
		Transactions: &sink.Transactions{ID: testenv.UniqueName(t, "txn"), PositionsTopic: testenv.UniqueName(t, "pos")},
	})
	log, txLog := newSent(), newSent()
	var acked, published, txAcked, txPublished atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	publish := func(s *testSink, log *sent, acked, published *atomic.Int64) {
		for i := 0; ctx.Err() == nil; i++ {
			key := fmt.Sprintf("order-%02d", i%20)
			ev := newEvent(fmt.Sprintf("r-%06d", i), []byte("Order"), key, "Changed", fmt.Appendf(nil, `{"seq":%d}`, i))
			a := &acker{total: acked}
			log.add(ev, a, nil)
			if err := s.Publish(ctx, ev, a); err != nil {
				log.remove(ev) // never handed over: the limiter was full when the context ended
				return
			}
			published.Add(1)
			time.Sleep(time.Millisecond)
		}
	}
	wg.Go(func() { publish(s, log, &acked, &published) })
	wg.Go(func() { publish(tx, txLog, &txAcked, &txPublished) })
	defer func() { cancel(); wg.Wait() }()
	eventually(t, 60*time.Second, "acks flowing before the outage", func() bool { return acked.Load() > 500 && txAcked.Load() > 500 })

	// The outage.
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer stopCancel()
	stoppedAt := time.Now()
	if err := k.Stop(stopCtx); err != nil {
		t.Fatalf("stop broker: %v", err)
	}
	// Acks of responses that were already on the wire come before each partition's next request
	// fails: once every partition has been retried since the broker was gone, none is left.
	down := time.Now()
	await.State(t, 60*time.Second, "every partition retried since the broker stopped", func() (bool, string) {
		retried := retriedSince(s, topic, down)
		return len(retried) == 3, fmt.Sprintf("partitions %v", retried)
	})
	ackedAtStop, publishedAtStop := acked.Load(), published.Load()

	late := newSink(t, k.Brokers(), sink.Config{DeadLetterTopic: "dlq"})
	lateCtx, lateCancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer lateCancel()
	lateDone := make(chan error, 1)
	lateStart := time.Now()
	go func() { lateDone <- late.WaitReady(lateCtx) }()

	type cancelResult struct {
		name    string
		err     error
		want    error
		elapsed time.Duration
	}
	var cancelled []cancelResult
	for _, tt := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(700*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"past its deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 700*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		c := newSink(t, k.Brokers(), sink.Config{DeadLetterTopic: "dlq"})
		ctx, cancel := tt.ctx()
		start := time.Now()
		err := c.WaitReady(ctx)
		cancel()
		cancelled = append(cancelled, cancelResult{tt.name, err, tt.want, time.Since(start)})
		c.mustClose(t)
	}

	// The outage's length is the subject: longer than the transport's metadata TTL and than a few
	// of WaitReady's retries, shorter than the Kafka transaction's timeout.
	await.Window(t, time.Until(stoppedAt.Add(20*time.Second)), "the broker stays down for 20s")
	ackedWhileDown := acked.Load() - ackedAtStop
	select {
	case err := <-lateDone:
		t.Fatalf("WaitReady returned %v while the broker was down", err)
	default:
	}
	warningsWhileDown := late.logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("kafka unreachable").Len()
	t.Logf("down %v: %d acked before, %d more published (the limiter holds 2000)",
		time.Since(stoppedAt).Round(time.Millisecond), ackedAtStop, published.Load()-publishedAtStop)
	startCtx, startCancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer startCancel()
	if err := k.Start(startCtx); err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Logf("broker up again after %v", time.Since(stoppedAt).Round(time.Millisecond))
	eventually(t, 60*time.Second, "acks flowing after the restart", func() bool { return acked.Load() > ackedAtStop+500 })
	eventually(t, 60*time.Second, "the exactly-once sink committing after the restart", func() bool { return txAcked.Load() > ackedAtStop+500 })
	cancel()
	wg.Wait()
	s.mustClose(t)
	tx.mustClose(t)
	lateErr := <-lateDone
	t.Logf("the late WaitReady returned after %v", time.Since(lateStart).Round(time.Millisecond))
	late.mustClose(t)

	t.Run("WaitReady returns the context error when the context ends while the broker is down", func(t *testing.T) {
		for _, r := range cancelled {
			if !errors.Is(r.err, r.want) {
				t.Errorf("%s: WaitReady = %v, want %v", r.name, r.err, r.want)
			}
			if r.elapsed < 600*time.Millisecond || r.elapsed > 10*time.Second {
				t.Errorf("%s: WaitReady returned after %v, want it to wait for the context (700ms)", r.name, r.elapsed)
			}
		}
	})
	t.Run("WaitReady warns while the broker is down and returns once it is up", func(t *testing.T) {
		if warningsWhileDown < 2 {
			t.Errorf("%d warnings while the broker was down, want one per retry", warningsWhileDown)
		}
		if lateErr != nil {
			t.Errorf("WaitReady = %v after the broker started", lateErr)
		}
		if late.logs.FilterMessageSnippet("kafka reachable").Len() != 1 {
			t.Error("no log line says kafka is reachable again")
		}
	})
	t.Run("nothing is acked while the broker is down", func(t *testing.T) {
		if ackedWhileDown != 0 {
			t.Errorf("%d events acked while the broker was down", ackedWhileDown)
		}
	})
	t.Run("every event is acked once after the restart and none is dead-lettered", func(t *testing.T) {
		if total := published.Load(); acked.Load() != total {
			t.Fatalf("%d acks for %d published events", acked.Load(), total)
		}
		log.checkAcked(t)
		if got := s.metric(t, "outbox_relay_events_dead_lettered_total"); got != 0 {
			t.Errorf("events_dead_lettered_total = %v", got)
		}
		if got := s.metric(t, "outbox_relay_events_failed_total"); got != 0 {
			t.Errorf("events_failed_total = %v", got)
		}
		if _, _, _, halted := s.Halted(); halted {
			t.Error("the sink halted")
		}
	})
	t.Run("Kafka holds every event once, in key order", func(t *testing.T) {
		total := int(published.Load())
		records := readBack(t, k.Brokers(), 60*time.Second, atLeast(total), topic)
		dups := log.verify(t, topic, records)
		t.Logf("%d events, %d duplicate deliveries, %v retries", total, dups, s.metric(t, "outbox_relay_kafka_retries_total"))
		if dups != 0 {
			t.Errorf("%d duplicates with the idempotent producer", dups)
		}
	})
	t.Run("exactly-once: a read_committed reader sees every event once, in key order", func(t *testing.T) {
		if err := tx.Err(); err != nil {
			t.Fatalf("the exactly-once sink failed: %v", err)
		}
		total := int(txPublished.Load())
		if txAcked.Load() != int64(total) {
			t.Fatalf("%d acks for %d published events", txAcked.Load(), total)
		}
		txLog.checkAcked(t)
		records := readCommitted(t, k.Brokers(), 60*time.Second, atLeast(total), txTopic)
		if dups := txLog.verify(t, txTopic, records); dups != 0 {
			t.Errorf("%d duplicates", dups)
		}
		t.Logf("%d events in %v Kafka transactions", total, tx.metric(t, "outbox_relay_kafka_transactions_total", "outcome", "committed"))
	})
}

// retriedSince returns the partitions of topic whose retry s logged at or after since.
func retriedSince(s *testSink, topic string, since time.Time) []int64 {
	var parts []int64
	for _, e := range s.logs.FilterMessage("kafka unavailable; retrying in place").All() {
		if e.Time.Before(since) {
			continue
		}
		fields := e.ContextMap()
		if fields["topic"] != topic {
			continue
		}
		if p, ok := fields["partition"].(int64); ok && !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	return parts
}
