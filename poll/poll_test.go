package poll_test

// Tests of the polling source against real PostgreSQL and Kafka (internal/testenv): pollers run in
// process, each a relay.Relay with source poll, so the stop and fence paths are the daemon's.
// Process-level faults (kill -9 of three pollers) are in faults/poll_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/poll"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// generous bounds for a loaded two-core machine
const (
	deliverTimeout = 90 * time.Second
	settleTimeout  = 60 * time.Second
)

// pollDB creates a database with the outbox table migrated for polling.
func pollDB(t *testing.T) (dsn string, ob *harness.Outbox) {
	t.Helper()
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := migrations.ApplyPoll(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
		t.Fatal(err)
	}
	ob, err = harness.NewOutbox(ctx, dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ob.Close)
	return dsn, ob
}

// poller is one relay with source poll, running in the test process.
type poller struct {
	t      *testing.T
	r      *relay.Relay
	m      *metrics.Metrics
	cancel context.CancelFunc
	done   chan error

	returned, fenced bool
	err              error
}

func startPoller(t *testing.T, dsn, brokers string, pc poll.Config, sc sink.Config) *poller {
	t.Helper()
	return startPollerLog(t, dsn, brokers, pc, sc, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
}

func startPollerLog(t *testing.T, dsn, brokers string, pc poll.Config, sc sink.Config, log *zap.Logger) *poller {
	t.Helper()
	pc.DSN = dsn
	if pc.Interval == 0 {
		pc.Interval = 200 * time.Millisecond
	}
	if pc.StatsInterval == 0 {
		pc.StatsInterval = 200 * time.Millisecond
	}
	sc.Brokers = strings.Split(brokers, ",")
	if sc.DeadLetterTopic == "" {
		sc.DeadLetterTopic = testenv.UniqueName(t, "dlq")
	}
	m := metrics.New(prometheus.NewRegistry())
	r, err := relay.New(relay.Config{Sink: sc, Poll: &pc, ShutdownTimeout: 10 * time.Second}, log, m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &poller{t: t, r: r, m: m, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- r.Run(ctx) }()
	t.Cleanup(func() { p.stop() })
	return p
}

// stop ends the relay with a graceful stop and requires a clean return; later calls do nothing.
func (p *poller) stop() {
	p.t.Helper()
	p.cancel()
	if err, ok := p.wait(20 * time.Second); !ok {
		p.t.Errorf("poller did not stop within 20s")
	} else if err != nil && !p.fenced {
		p.t.Errorf("poller stopped with %v", err)
	}
}

// wait returns what Run returned, waiting at most timeout for it.
func (p *poller) wait(timeout time.Duration) (error, bool) {
	if p.returned {
		return p.err, true
	}
	select {
	case p.err = <-p.done:
		p.returned = true
		return p.err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// deliver reads back every written event and fails on loss, reordering or alteration.
func deliver(t *testing.T, brokers string, written []harness.Written) harness.Report {
	t.Helper()
	c := harness.NewConsumer(brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), deliverTimeout)
	defer cancel()
	err := c.ReadUntil(ctx, time.Second, func(recs []harness.Record) bool {
		return harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() {
		again, why := harness.Recheck(written, brokers, rep)
		if !again.OK() {
			t.Fatalf("delivery check failed (read error: %v): %s; %s", err, rep, why)
		}
		rep = again
	}
	return rep
}

// pendingRows counts rows not processed.
func pendingRows(t *testing.T, ob *harness.Outbox) int {
	t.Helper()
	var n int
	if err := ob.Pool().QueryRow(context.Background(), "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestThreePollersOnOneTableKeepPerAggregateOrderLoseNothingAndPublishNoDuplicates(t *testing.T) {
	t.Parallel()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	types := []string{testenv.UniqueName(t, "a"), testenv.UniqueName(t, "b")}
	// Few aggregates, so the pollers contend for the same ones all the time; a backlog before they
	// start and small batches, so that consecutive batches of the queue, claimed at the same
	// moment, hold events of the same aggregates (plain SKIP LOCKED reorders them here).
	load := harness.StartLoad(ob, harness.LoadConfig{Types: types, Writers: 3, Aggregates: 4, MaxPerTx: 5, TxPerSecond: 60, Seed: 7})
	ob.AwaitMore(t, 1200, "before the pollers start (a backlog)")
	var pollers []*poller
	for range 3 {
		pollers = append(pollers, startPoller(t, dsn, brokers, poll.Config{BatchSize: 10, Workers: 2}, sink.Config{}))
	}
	ob.AwaitMore(t, 2000, "while three pollers contend")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, brokers, ob.Written())
	t.Logf("load %s; delivery %s", stats, rep)
	if rep.Duplicates != 0 {
		t.Errorf("three pollers without a fault published %d duplicates; each row must be claimed by one at a time", rep.Duplicates)
	}
	await.State(t, settleTimeout, "every row marked processed", func() (bool, string) {
		n := pendingRows(t, ob)
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	var claimed float64
	for i, p := range pollers {
		c := value(p.m.PollClaimedRows)
		claimed += c
		t.Logf("poller %d claimed %v rows in %v batches", i, c, value(p.m.PollClaims))
		if c == 0 {
			t.Errorf("poller %d claimed nothing: the test did not run three pollers at once", i)
		}
	}
	if int(claimed) != len(ob.Written()) {
		t.Errorf("%v rows claimed for %d written: a row was claimed twice", claimed, len(ob.Written()))
	}
}

// aggregateLock holds, on its own session, the advisory lock pollers take for an aggregate of the
// default table, keeping them off that aggregate until release.
func aggregateLock(t *testing.T, dsn, aggType, aggID string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext('outbox-relay:public.outbox_events'), hashtext($1 || '/' || $2))", aggType, aggID); err != nil {
		t.Fatal(err)
	}
	return func() { conn.Close(ctx) }
}

// TestARowCommittedAfterALaterRowOfItsAggregateIsPublishedAndBeforeTheRowsStillPending: seq is
// taken at insert, so a transaction that inserts first and commits last makes a row with a smaller
// seq visible after a larger one. It must still be published (no high-water mark skips it), and
// before every event of its aggregate not yet published; only what was already published before it
// became visible precedes it.
func TestARowCommittedAfterALaterRowOfItsAggregateIsPublishedAndBeforeTheRowsStillPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	typ := testenv.UniqueName(t, "late")
	pc := poll.Config{Workers: 2}
	p := startPoller(t, dsn, brokers, pc, sink.Config{})
	published := func(n int) []harness.Record {
		c := harness.NewConsumer(brokers, harness.TopicFor(typ))
		defer c.Close()
		rctx, cancel := context.WithTimeout(ctx, deliverTimeout)
		defer cancel()
		if err := c.ReadUntil(rctx, 0, func(recs []harness.Record) bool { return len(recs) >= n }); err != nil {
			t.Fatal(err)
		}
		return c.Records()
	}
	spec := func(id string) harness.Spec { return harness.Spec{AggregateType: typ, AggregateID: id, EventType: "E"} }

	// Late: inserted first (smaller seq, harness seq 1), committed last.
	late, err := ob.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx)
	commitLate, err := ob.WriteIn(ctx, late, spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	// Harness seq 2 of x, and y: committed while the late row is invisible; they go out at once.
	if err := ob.WriteTx(ctx, spec("x"), spec("y")); err != nil {
		t.Fatal(err)
	}
	published(2)
	// Keep the pollers off x, then let the late row commit and write x's next event: both are
	// pending together when the lock goes.
	release := aggregateLock(t, dsn, typ, "x")
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	commitLate()
	if err := ob.WriteTx(ctx, spec("x")); err != nil {
		t.Fatal(err)
	}
	// Polls that start after the write see both rows and must not take x while its lock is held:
	// a poll that claims nothing is counted, and one more than the workers ensures such a poll.
	empty := value(p.m.PollEmpty)
	await.State(t, settleTimeout, "polls that find x's rows held", func() (bool, string) {
		n := value(p.m.PollEmpty) - empty
		return n > float64(pc.Workers), fmt.Sprintf("%.0f empty polls", n)
	})
	release()
	recs := published(4)
	var xs []string
	for _, r := range recs {
		if string(r.Key) == "x" {
			xs = append(xs, r.Header("id"))
		}
	}
	w := ob.Written() // commit order: x#2, y, x#1 (late), x#3
	want := []string{w[0].ID, w[2].ID, w[3].ID}
	if fmt.Sprint(xs) != fmt.Sprint(want) {
		t.Fatalf("x's events in Kafka: %v, want the one published before the late row became visible, then the late row, then the later one: %v", xs, want)
	}
	if n := pendingRows(t, ob); n != 0 {
		t.Fatalf("%d rows still pending", n)
	}
}

// TestARowKafkaRefusesIsRetriedThenDeadLetteredWithoutHoldingUpOtherAggregates: two poison rows,
// one refused by the sink before sending (an aggregate type that is no valid topic name) and one by
// the broker (larger than its topic's max.message.bytes), count attempts with backoff, become dead
// letters after poll_max_attempts, go to the dead-letter topic, and hold up only the later events
// of their own aggregate, which follow them. retry makes the dead letters pending again.
func TestARowKafkaRefusesIsRetriedThenDeadLetteredWithoutHoldingUpOtherAggregates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	k := testenv.SharedKafka(t)
	brokers := k.Brokers()
	good := testenv.UniqueName(t, "good")
	small := testenv.UniqueName(t, "small")
	// A topic whose records may be 2 KB at most: the broker refuses a larger one for good.
	if err := createTopic(ctx, brokers, harness.TopicFor(small), map[string]string{"max.message.bytes": "2048"}); err != nil {
		t.Fatal(err)
	}
	dlq := testenv.UniqueName(t, "dlq")
	const maxAttempts = 3
	p := startPoller(t, dsn, brokers, poll.Config{MaxAttempts: maxAttempts, RetryBackoff: 100 * time.Millisecond},
		sink.Config{DeadLetterTopic: dlq})

	invalid := "not a topic " + testenv.UniqueName(t, "x")
	if err := ob.WriteTx(ctx, harness.Spec{AggregateType: invalid, AggregateID: "p1"}); err != nil {
		t.Fatal(err)
	}
	if err := ob.WriteTx(ctx, harness.Spec{AggregateType: small, AggregateID: "p2", PadBytes: 4000},
		harness.Spec{AggregateType: small, AggregateID: "p2"}); err != nil { // the second waits for the first
		t.Fatal(err)
	}
	for i := range 20 {
		if err := ob.WriteTx(ctx, harness.Spec{AggregateType: good, AggregateID: fmt.Sprint("g", i%3)}); err != nil {
			t.Fatal(err)
		}
	}
	w := ob.Written()
	poison := []harness.Written{w[0], w[1]}
	follower := w[2]
	rest := w[3:]
	// Good aggregates flow while the poison rows are retried.
	deliver(t, brokers, rest)

	await.State(t, settleTimeout, "both poison rows dead-lettered and the follower published", func() (bool, string) {
		var dead, pending int
		if err := ob.Pool().QueryRow(ctx, "SELECT (SELECT count(*) FROM outbox_dead_letters WHERE attempts = $1 AND last_error <> ''), count(*) FILTER (WHERE processed_at IS NULL) FROM outbox_events", maxAttempts).
			Scan(&dead, &pending); err != nil {
			t.Fatal(err)
		}
		return dead == 2 && pending == 0, fmt.Sprintf("%d dead letters with %d attempts, %d pending", dead, maxAttempts, pending)
	})
	if got := value(p.m.PollDeadLettered); got != 2 {
		t.Errorf("poll_dead_lettered_total %v, want 2", got)
	}
	if got := value(p.m.PollRefused.WithLabelValues(sink.ReasonInvalidTopic)); got != maxAttempts {
		t.Errorf("poll_refused_total{reason=invalid_topic} %v, want %d", got, maxAttempts)
	}
	if got := value(p.m.PollRefused.WithLabelValues(sink.ReasonTooLarge)); got != maxAttempts {
		t.Errorf("poll_refused_total{reason=message_too_large} %v, want %d", got, maxAttempts)
	}

	// The dead-letter topic has both, saying why; the follower is in its topic after them.
	c := harness.NewConsumer(brokers, dlq, harness.TopicFor(small))
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, deliverTimeout)
	defer cancel()
	if err := c.ReadUntil(rctx, 500*time.Millisecond, func(recs []harness.Record) bool { return len(recs) >= 3 }); err != nil {
		t.Fatal(err)
	}
	ids := map[string]harness.Record{}
	for _, r := range c.Records() {
		ids[r.Header("id")] = r
	}
	for _, pw := range poison {
		r, ok := ids[pw.ID]
		if !ok || r.Topic != dlq || r.Header(sink.HeaderDLQReason) != poll.ReasonMaxAttempts {
			t.Errorf("poison event %s: %+v, want it in the dead-letter topic with reason %s", pw.ID, r, poll.ReasonMaxAttempts)
		}
	}
	if r, ok := ids[follower.ID]; !ok || r.Topic != harness.TopicFor(small) {
		t.Errorf("the event after the poison row in its aggregate was not published to its topic: %+v", r)
	}

	// retry --dead-letters: pending again with a clean slate.
	p.stop()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	n, err := poll.Retry(ctx, conn, poll.Config{}, poll.Selection{DeadLetters: true})
	if err != nil || n != 2 {
		t.Fatalf("Retry of the dead letters reset %d rows (%v), want 2", n, err)
	}
	var clean int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND attempts = 0 AND retry_after IS NULL").Scan(&clean); err != nil || clean != 2 {
		t.Fatalf("%d rows pending with a clean slate after Retry (%v), want 2", clean, err)
	}
	if n, err := poll.Retry(ctx, conn, poll.Config{}, poll.Selection{IDs: []string{follower.ID}, Since: time.Now().Add(time.Hour)}); err != nil || n != 0 {
		t.Fatalf("Retry by id outside the time range reset %d rows (%v), want 0", n, err)
	}
}

// TestABrokerOutageBurnsNoAttempts: while Kafka is down the outbox grows and nothing is marked or
// counted against poll_max_attempts; once it is back the backlog drains in order.
func TestABrokerOutageBurnsNoAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	k := testenv.Kafka(t)
	types := []string{testenv.UniqueName(t, "a")}
	p := startPoller(t, dsn, k.Brokers(), poll.Config{MaxAttempts: 1, RetryBackoff: 10 * time.Millisecond},
		sink.Config{WriteTimeout: 2 * time.Second})
	if err := ob.WriteTx(ctx, harness.Spec{AggregateType: types[0], AggregateID: "warm"}); err != nil {
		t.Fatal(err)
	}
	deliver(t, k.Brokers(), ob.Written())
	if err := k.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	load := harness.StartLoad(ob, harness.LoadConfig{Types: types, Writers: 2, Aggregates: 5, MaxPerTx: 3, TxPerSecond: 20, Seed: 3})
	// Several failed writes (write timeouts of 2 s) while rows keep coming: each would burn an
	// attempt if an outage were counted against poll_max_attempts.
	await.True(t, time.Minute, "several writes to fail and be retried while the broker is down", func() bool {
		return value(p.m.KafkaRetries) >= 4
	})
	ob.AwaitMore(t, 300, "while the broker is down")
	var pending, attempts int
	if err := ob.Pool().QueryRow(ctx, "SELECT count(*), coalesce(sum(attempts), 0) FROM outbox_events WHERE processed_at IS NULL").Scan(&pending, &attempts); err != nil {
		t.Fatal(err)
	}
	if pending == 0 || attempts != 0 {
		t.Fatalf("during the outage: %d rows pending with %d attempts; want the outbox to grow with no attempt counted", pending, attempts)
	}
	await.State(t, 10*time.Second, "the pending gauge to show the backlog", func() (bool, string) {
		g := value(p.m.PollPendingRows)
		return g > 0, fmt.Sprintf("poll_pending_rows %v", g)
	})
	t.Logf("outage: %d rows pending, 0 attempts", pending)
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, k.Brokers(), ob.Written())
	t.Logf("load %s; delivery %s", stats, rep)
	await.State(t, settleTimeout, "the backlog to drain", func() (bool, string) {
		n := pendingRows(t, ob)
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	var dead, total int
	if err := ob.Pool().QueryRow(ctx, "SELECT count(*) FILTER (WHERE attempts > 0), count(*) FROM outbox_events").Scan(&dead, &total); err != nil || dead != 0 {
		t.Fatalf("%d of %d rows have attempts after an outage (%v), want none", dead, total, err)
	}
}

// TestAStopFinishesTheBatchAndAFenceRollsItBack: a graceful stop marks what Kafka acknowledged; a
// fence marks nothing, so whatever it had claimed is pending again at once (not after a lease).
func TestAStopFinishesTheBatchAndAFenceRollsItBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	types := []string{testenv.UniqueName(t, "a")}
	p := startPoller(t, dsn, brokers, poll.Config{}, sink.Config{})
	load := harness.StartLoad(ob, harness.LoadConfig{Types: types, Writers: 2, Aggregates: 5, MaxPerTx: 3, TxPerSecond: 100, Seed: 5})
	ob.AwaitMore(t, 600, "while the poller publishes")
	p.stop()
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever is processed must be in Kafka; pending rows are picked up by the next poller.
	q := startPoller(t, dsn, brokers, poll.Config{}, sink.Config{})
	rep := deliver(t, brokers, ob.Written())
	t.Logf("load %s; delivery %s", stats, rep)
	if rep.Duplicates != 0 {
		t.Errorf("a graceful stop left %d duplicates; it must mark every row Kafka acknowledged", rep.Duplicates)
	}
	await.State(t, settleTimeout, "every row processed", func() (bool, string) {
		n := pendingRows(t, ob)
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	q.fenced = true
	q.r.Fence()
	if err, ok := q.wait(10 * time.Second); !ok || !errors.Is(err, relay.ErrFenced) {
		t.Fatalf("a fenced poller returned %v (returned: %v), want ErrFenced within 10s", err, ok)
	}
}

// createTopic creates a one-partition topic with configs and waits until it has a leader.
func createTopic(ctx context.Context, brokers, topic string, configs map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var entries []kafka.ConfigEntry
	for k, v := range configs {
		entries = append(entries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
	}
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(brokers, ",")...)}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1, ConfigEntries: entries}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for {
		meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(meta.Topics) == 1 && len(meta.Topics[0].Partitions) == 1 && meta.Topics[0].Partitions[0].Leader.Host != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create topic %s: no leader: %w", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// value reads a counter or gauge, or a histogram's count of observations.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	if d.Histogram != nil {
		return float64(d.Histogram.GetSampleCount())
	}
	return d.Gauge.GetValue()
}

// TestAPostgresRestartDuringLoadLosesNothing restarts PostgreSQL (fast shutdown) under load: the
// workers' transactions die with it, the pollers reconnect by themselves, and every event arrives in
// order; duplicates are at most the batches that were in flight.
func TestAPostgresRestartDuringLoadLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	dsn, err := pg.CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPoll(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	ob, err := harness.NewOutbox(ctx, dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	brokers := testenv.SharedKafka(t).Brokers()
	types := []string{testenv.UniqueName(t, "a")}
	const workers, batch = 2, 50
	p := startPoller(t, dsn, brokers, poll.Config{Workers: workers, BatchSize: batch}, sink.Config{})
	load := harness.StartLoad(ob, harness.LoadConfig{Types: types, Writers: 2, Aggregates: 6, MaxPerTx: 4, TxPerSecond: 40, Seed: 9})
	ob.AwaitMore(t, 300, "before the restart")
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	ob.AwaitMore(t, 400, "after the restart")
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, brokers, ob.Written())
	t.Logf("load %s; delivery %s", stats, rep)
	if err := rep.DuplicatesWithin(workers * batch); err != nil {
		t.Error(err)
	}
	await.State(t, settleTimeout, "every row processed", func() (bool, string) {
		n := pendingRows(t, ob)
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	if got := value(p.m.Reconnects.WithLabelValues("poll")) + value(p.m.Reconnects.WithLabelValues("poll_listen")); got == 0 {
		t.Error("no reconnect counted: did the restart happen while the pollers were connected?")
	}
}

// TestUnderTheHaltPolicyADeadLetterHaltsEveryPollerAndStaysPending: on_failure halt applies to a
// row refused poll_max_attempts times exactly as in the WAL mode: the relay that claims it halts
// without acknowledging it, and the row stays pending at the head of its aggregate, so a second
// relay halts on it too; the dead-letter view shows it.
func TestUnderTheHaltPolicyADeadLetterHaltsEveryPollerAndStaysPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	pc := poll.Config{MaxAttempts: 2, RetryBackoff: 50 * time.Millisecond}
	sc := sink.Config{Policy: sink.Halt}
	first := startPoller(t, dsn, brokers, pc, sc)
	if err := ob.WriteTx(ctx, harness.Spec{AggregateType: "not a topic " + testenv.UniqueName(t, "x"), AggregateID: "p"}); err != nil {
		t.Fatal(err)
	}
	halted := func(p *poller) func() (bool, string) {
		return func() (bool, string) {
			_, reason, _, h := p.r.Sink().Halted()
			return h && reason == poll.ReasonMaxAttempts, fmt.Sprintf("halted %v, reason %q", h, reason)
		}
	}
	await.State(t, settleTimeout, "the first poller to halt on the dead letter", halted(first))
	second := startPoller(t, dsn, brokers, pc, sc)
	await.State(t, settleTimeout, "the second poller to halt on it too", halted(second))
	var attempts int
	var pending bool
	if err := ob.Pool().QueryRow(ctx, "SELECT attempts, processed_at IS NULL FROM outbox_dead_letters").Scan(&attempts, &pending); err != nil {
		t.Fatalf("the dead-letter view: %v", err)
	}
	if attempts != 2 || !pending {
		t.Fatalf("dead letter with %d attempts, pending %v; want 2 attempts and still pending", attempts, pending)
	}
}

// TestAPolledRowIsTheRecordTheWALModeGives: the poller reads rows as the backfill and the WAL
// mode do (decoder.FromRow), so the optional columns travel too: the aggregate version as its
// header, the record timestamp from columns.timestamp, extra columns by their placement; a row
// whose timestamp no record can carry goes to the failure policy with reason invalid_timestamp,
// without holding up the rest.
func TestAPolledRowIsTheRecordTheWALModeGives(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	if _, err := ob.Pool().Exec(ctx, `ALTER TABLE outbox_events ADD COLUMN aggregate_version bigint,
		ADD COLUMN occurred_at timestamptz, ADD COLUMN tenant text`); err != nil {
		t.Fatal(err)
	}
	typ := testenv.UniqueName(t, "order")
	dlq := testenv.UniqueName(t, "dlq")
	cols := decoder.DefaultColumns()
	cols.AggregateVersion, cols.Timestamp = "aggregate_version", "occurred_at"
	startPoller(t, dsn, brokers, poll.Config{Columns: cols, Extra: []string{"tenant"}},
		sink.Config{DeadLetterTopic: dlq, Record: record.Options{ExtraHeaders: []string{"tenant"}}})
	occurred := time.Date(2026, 11, 30, 12, 0, 0, 250e6, time.UTC)
	for i, ts := range []string{occurred.Format(time.RFC3339Nano), "infinity", ""} {
		var at any = ts
		if ts == "" {
			at = nil // no timestamp: the commit time, as in the WAL mode
		}
		if _, err := ob.Pool().Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, aggregate_version, occurred_at, tenant)
			VALUES ($1, 'o-1', 'E', '{}', $2, $3::timestamptz, 'acme')`, typ, i+1, at); err != nil {
			t.Fatal(err)
		}
	}
	c := harness.NewConsumer(brokers, harness.TopicFor(typ), dlq)
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, deliverTimeout)
	defer cancel()
	if err := c.ReadUntil(rctx, 500*time.Millisecond, func(recs []harness.Record) bool { return len(recs) >= 3 }); err != nil {
		t.Fatal(err)
	}
	byVersion := map[string]harness.Record{}
	for _, r := range c.Records() {
		byVersion[r.Header("aggregate_version")] = r
	}
	if r := byVersion["1"]; r.Topic != harness.TopicFor(typ) || !r.Time.Equal(occurred) || r.Header("tenant") != "acme" {
		t.Errorf("version 1: topic %s, time %v, tenant %q; want %s, %v, acme", r.Topic, r.Time, r.Header("tenant"), harness.TopicFor(typ), occurred)
	}
	if r := byVersion["2"]; r.Topic != dlq || r.Header(sink.HeaderDLQReason) != sink.ReasonInvalidTimestamp {
		t.Errorf("version 2 (occurred_at infinity): topic %s, reason %q; want %s, %s", r.Topic, r.Header(sink.HeaderDLQReason), dlq, sink.ReasonInvalidTimestamp)
	}
	if r := byVersion["3"]; r.Topic != harness.TopicFor(typ) || time.Since(r.Time) > time.Hour {
		t.Errorf("version 3 (no occurred_at): topic %s, time %v; want %s and about now", r.Topic, r.Time, harness.TopicFor(typ))
	}
	await.State(t, settleTimeout, "every row processed", func() (bool, string) {
		n := pendingRows(t, ob)
		return n == 0, fmt.Sprintf("%d pending", n)
	})
}

// TestAPolledRowReadsItsTimestampsWhateverTheDatabasesDateStyle: the poller reads timestamps in
// text form, as the WAL mode does; a database whose DateStyle (or TimeZone) is not the default must
// change neither the record timestamp (columns.timestamp, or the row's creation) nor where the
// event goes. The replication connection sets DateStyle ISO itself; the poller's must too.
func TestAPolledRowReadsItsTimestampsWhateverTheDatabasesDateStyle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	if _, err := ob.Pool().Exec(ctx, `ALTER TABLE outbox_events ADD COLUMN occurred_at timestamptz`); err != nil {
		t.Fatal(err)
	}
	var db string
	if err := ob.Pool().QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	// New sessions (the poller's) get them; a DBA's choice for a database whose clients want it.
	if _, err := ob.Pool().Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET DateStyle = 'SQL, DMY'`, pgx.Identifier{db}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Pool().Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET TimeZone = 'Asia/Kolkata'`, pgx.Identifier{db}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	typ := testenv.UniqueName(t, "order")
	dlq := testenv.UniqueName(t, "dlq")
	cols := decoder.DefaultColumns()
	cols.Timestamp = "occurred_at"
	occurred := time.Date(2026, 11, 30, 12, 0, 0, 250e6, time.UTC)
	created := time.Date(2026, 11, 29, 8, 30, 0, 0, time.UTC)
	for i, at := range []any{occurred, nil} {
		if _, err := ob.Pool().Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, occurred_at, created_at)
			VALUES ($1, 'o-1', $2, '{}', $3::timestamptz, $4)`, typ, fmt.Sprint(i+1), at, created); err != nil {
			t.Fatal(err)
		}
	}
	startPoller(t, dsn, brokers, poll.Config{Columns: cols, CreatedColumn: "created_at"}, sink.Config{DeadLetterTopic: dlq})
	c := harness.NewConsumer(brokers, harness.TopicFor(typ), dlq)
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, deliverTimeout)
	defer cancel()
	if err := c.ReadUntil(rctx, 500*time.Millisecond, func(recs []harness.Record) bool { return len(recs) >= 2 }); err != nil {
		t.Fatal(err)
	}
	for _, r := range c.Records() {
		want := map[string]time.Time{"1": occurred, "2": created}[r.Header("event_type")]
		if r.Topic != harness.TopicFor(typ) || !r.Time.Equal(want) {
			t.Errorf("event %s: topic %s (reason %q), time %v; want %s and %v", r.Header("event_type"), r.Topic,
				r.Header(sink.HeaderDLQReason), r.Time.UTC(), harness.TopicFor(typ), want)
		}
	}
}

// TestABatchDoesNotWaitForTheLinger: a worker waits for Kafka to acknowledge its batch before it
// claims again, so nothing joins the batch while it lingers: the poller sends it at once. With a
// linger of an hour, rows still go out and are marked within seconds.
func TestABatchDoesNotWaitForTheLinger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	typ := testenv.UniqueName(t, "nolinger")
	startPoller(t, dsn, brokers, poll.Config{}, sink.Config{Linger: time.Hour})
	for i := range 20 {
		if err := ob.WriteTx(ctx, harness.Spec{AggregateType: typ, AggregateID: fmt.Sprint("a", i%4), EventType: "E"}); err != nil {
			t.Fatal(err)
		}
	}
	await.State(t, 30*time.Second, "every row published and marked", func() (bool, string) {
		n := pendingRows(t, ob)
		return n == 0, fmt.Sprintf("%d rows pending", n)
	})
	deliver(t, brokers, ob.Written())
}
