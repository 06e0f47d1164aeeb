package relay_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fixture is one test's database with the outbox table, its own slot, and unique aggregate types
// (so topics do not collide on a shared broker).
type fixture struct {
	t       *testing.T
	dsn     string
	brokers string
	slot    string
	outbox  *harness.Outbox
	types   []string
}

func newFixture(t *testing.T, pg *devenv.Postgres, brokers string, nTypes int) *fixture {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, pg)
	ob, err := harness.NewOutbox(ctx, dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ob.Close)
	f := &fixture{t: t, dsn: dsn, brokers: brokers, slot: testenv.UniqueName(t, "slot"), outbox: ob}
	for i := range nTypes {
		f.types = append(f.types, testenv.UniqueName(t, fmt.Sprintf("agg%d", i)))
	}
	return f
}

func (f *fixture) config() relay.Config {
	cols := decoder.DefaultColumns()
	return relay.Config{
		Replication: replication.Config{
			DSN: f.dsn, Slot: f.slot, Publication: f.slot, Table: "outbox_events",
			Columns:    []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload, cols.Headers},
			CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond,
		},
		Decoder:         decoder.Config{Table: "outbox_events", Columns: cols},
		Sink:            sink.Config{Brokers: []string{f.brokers}},
		ShutdownTimeout: 10 * time.Second,
	}
}

// start runs a relay until the test ends or stop is called; stop returns Run's error.
func (f *fixture) start(cfg relay.Config) (stop func() error) {
	f.t.Helper()
	r, err := relay.New(cfg, zaptest.NewLogger(f.t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	var runErr error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				f.t.Fatal("relay did not stop within a minute")
			}
		}
		return runErr
	}
	f.t.Cleanup(func() { stop() })
	f.waitSlotActive()
	return stop
}

// waitSlotActive waits until the relay streams, so writes made afterwards are after the slot's start.
// A slot being created is active too, and from its consistent point on has a confirmed position,
// but its walsender streams (pg_stat_replication's state catchup or streaming) only once
// START_REPLICATION has begun: a relay stopped before that may not have finished creating it.
func (f *fixture) waitSlotActive() {
	f.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var active bool
		err := f.outbox.Pool().QueryRow(ctx, `SELECT s.active AND s.confirmed_flush_lsn IS NOT NULL AND r.state IN ('catchup', 'streaming')
			FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, f.slot).Scan(&active)
		if err == nil && active {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	rows, _ := f.outbox.Pool().Query(ctx, "SELECT s.active::text, coalesce(s.active_pid::text,'-'), coalesce(s.confirmed_flush_lsn::text,'-'), coalesce(r.state,'-') FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1", f.slot)
	vals, _ := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
	f.t.Fatalf("slot %s never became active: %v", f.slot, vals)
}

// writeMany writes n transactions of 1..maxPerTx events over aggregates of all the fixture's types.
func (f *fixture) writeMany(ctx context.Context, rng *rand.Rand, n, maxPerTx, aggregates int) {
	f.t.Helper()
	for range n {
		specs := make([]harness.Spec, 1+rng.IntN(maxPerTx))
		for i := range specs {
			typ := f.types[rng.IntN(len(f.types))]
			specs[i] = harness.Spec{AggregateType: typ, AggregateID: fmt.Sprintf("agg-%d", rng.IntN(aggregates))}
			if rng.IntN(4) == 0 {
				specs[i].Headers = map[string]string{"tenant": "t-" + fmt.Sprint(rng.IntN(3)), "traceparent": "00-abc-def-01"}
			}
		}
		if err := f.outbox.WriteTx(ctx, specs...); err != nil {
			f.t.Fatal(err)
		}
	}
}

// verify reads every topic until each written event arrived (or timeout) and checks the result.
func (f *fixture) verify(timeout time.Duration, allowDuplicates bool) harness.Report {
	f.t.Helper()
	written := f.outbox.Written()
	c := harness.NewConsumer(f.brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := c.ReadUntil(ctx, time.Second, func(recs []harness.Record) bool {
		return harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() {
		again, why := harness.Recheck(written, f.brokers, rep)
		if !again.OK() {
			f.t.Fatalf("delivery check failed (read error: %v): %s; %s", err, rep, why)
		}
		f.t.Log(why)
		rep = again
	}
	if !allowDuplicates && rep.Duplicates > 0 {
		f.t.Fatalf("delivery check failed: %s", rep)
	}
	return rep
}

func (f *fixture) confirmedLSN() uint64 {
	f.t.Helper()
	lsn, err := harness.ConfirmedFlushLSN(context.Background(), f.outbox.Pool(), f.slot)
	if err != nil {
		f.t.Fatal(err)
	}
	return lsn
}

// statusSentAfter reports whether the walsender of the fixture's slot has received a standby
// status update the relay sent after at (pg_stat_replication.reply_time).
func (f *fixture) statusSentAfter(at time.Time) bool {
	f.t.Helper()
	var reply *time.Time
	err := f.outbox.Pool().QueryRow(context.Background(), `SELECT r.reply_time FROM pg_stat_replication r
		JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, f.slot).Scan(&reply)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		f.t.Fatal(err)
	}
	return reply != nil && reply.After(at)
}

func (f *fixture) currentLSN() uint64 {
	f.t.Helper()
	lsn, err := harness.CurrentLSN(context.Background(), f.outbox.Pool())
	if err != nil {
		f.t.Fatal(err)
	}
	return lsn
}

func TestRelayDeliversEveryEventOnceInCommitOrder(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 3)
	stop := f.start(f.config())
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))

	f.writeMany(ctx, rng, 300, 5, 40)
	// One large transaction, interleaved with nothing: its events must all arrive, in order.
	big := make([]harness.Spec, 5000)
	for i := range big {
		big[i] = harness.Spec{AggregateType: f.types[i%len(f.types)], AggregateID: fmt.Sprintf("agg-%d", i%40)}
	}
	if err := f.outbox.WriteTx(ctx, big...); err != nil {
		t.Fatal(err)
	}
	f.writeMany(ctx, rng, 50, 5, 40)
	rep := f.verify(2*time.Minute, false)
	t.Logf("delivered: %s", rep)

	end := f.currentLSN()
	await.True(t, 30*time.Second, "the slot to be confirmed past the last transaction", func() bool {
		return f.confirmedLSN() >= end
	})
	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
}

func TestConfirmedLSNDoesNotPassUnacknowledgedEvents(t *testing.T) {
	k := testenv.Kafka(t)
	f := newFixture(t, testenv.SharedPostgres(t), k.Brokers(), 2)
	cfg := f.config()
	cfg.Sink.WriteTimeout = 2 * time.Second
	f.start(cfg)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))

	f.writeMany(ctx, rng, 20, 3, 10) // topics exist and the relay is warm
	f.verify(time.Minute, false)

	if err := k.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	await.True(t, time.Minute, "a status update sent after the broker stopped", func() bool { return f.statusSentAfter(stopped) })
	before := f.currentLSN()
	f.writeMany(ctx, rng, 50, 3, 10)
	after := f.currentLSN()

	// The slot must stay before the first unacknowledged transaction while the relay keeps
	// reporting its position: until PostgreSQL has a status update sent two write timeouts after
	// the writes (the produce requests have failed and been retried by then).
	written := time.Now()
	await.True(t, time.Minute, "status updates over two write timeouts while Kafka is down", func() bool {
		if got := f.confirmedLSN(); got > before {
			t.Fatalf("confirmed_flush_lsn %X moved past %X while Kafka was down and events were unacknowledged", got, before)
		}
		return f.statusSentAfter(written.Add(2 * cfg.Sink.WriteTimeout))
	})

	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.verify(2*time.Minute, true)
	await.True(t, time.Minute, "the slot to be confirmed past the outage's transactions", func() bool {
		return f.confirmedLSN() >= after
	})
}

func TestIdleOutboxDoesNotPinWAL(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	if _, err := f.outbox.Pool().Exec(ctx, "CREATE TABLE other (id bigserial PRIMARY KEY, note text)"); err != nil {
		t.Fatal(err)
	}
	f.start(f.config())
	start := f.confirmedLSN()
	var target uint64
	for range 50 {
		if _, err := f.outbox.Pool().Exec(ctx, "INSERT INTO other (note) SELECT repeat('x', 200) FROM generate_series(1, 100)"); err != nil {
			t.Fatal(err)
		}
	}
	target = f.currentLSN()
	if target <= start {
		t.Fatalf("no WAL written: %X <= %X", target, start)
	}
	// The outbox is idle; other tables keep changing. Keep them changing while waiting, like a
	// busy database would.
	await.True(t, 30*time.Second, "confirmed_flush_lsn to pass the other tables' writes", func() bool {
		f.outbox.Pool().Exec(ctx, "INSERT INTO other (note) VALUES ('tick')")
		return f.confirmedLSN() >= target
	})
}

func TestRelayResumesWithoutLossAfterStop(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))

	stop := f.start(f.config())
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		f.writeMany(ctx, rng, 400, 4, 30)
	}()
	time.Sleep(300 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	n := f.outbox.Count()
	await.True(t, time.Minute, "events written while no relay runs", func() bool {
		select {
		case <-writerDone:
			return true
		default:
			return f.outbox.Count() >= n+20
		}
	})
	f.start(f.config())
	<-writerDone
	rep := f.verify(2*time.Minute, true)
	t.Logf("after a restart mid-stream: %s", rep)
}

func TestRelayExitsWithClearErrorOnMissingColumn(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	cfg := f.config()
	cfg.Decoder.Columns.Payload = "body"
	cfg.Replication.Columns = append(cfg.Replication.Columns, "body")
	r, err := relay.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	if err == nil || !replication.IsFatal(err) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v, want a fatal error naming the column", err)
	}
	if want := `"body"`; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the missing column %s", err, want)
	}
}

func TestRelayRefusesToRecreateALostSlot(t *testing.T) {
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	stop := f.start(f.config())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	await.True(t, 10*time.Second, "the walsender to release the slot", func() bool {
		var active bool
		f.outbox.Pool().QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&active)
		return !active
	})
	if _, err := f.outbox.Pool().Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.slot); err != nil {
		t.Fatal(err)
	}

	r, err := relay.New(f.config(), zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = r.Run(runCtx)
	if !errors.Is(err, replication.ErrSlotLost) || !strings.Contains(err.Error(), "forget-slot") {
		t.Fatalf("Run = %v, want ErrSlotLost telling the operator how to recover", err)
	}
	var exists bool
	f.outbox.Pool().QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", f.slot).Scan(&exists)
	if exists {
		t.Fatal("the relay recreated a lost slot")
	}

	// Once the operator has recovered and forgotten the slot, a new one is created.
	if forgot, err := replication.NewLedger("public").Forget(ctx, f.outbox.Pool(), f.slot); err != nil || !forgot {
		t.Fatalf("Forget = %v, %v", forgot, err)
	}
	f.start(f.config())
}
