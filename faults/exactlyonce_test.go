package faults

import (
	"context"

	"math/rand/v2"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The kill -9 scenario of exactly-once delivery, run in both modes side by side (each test is
// parallel, on the shared servers): the same crashes must leave a read_committed consumer with every
// event exactly once under delivery: exactly-once, and with duplicates under at-least-once, so the
// test tells the modes apart.

func TestKill9TwentyTimesExactlyOnceDeliversEveryEventOnce(t *testing.T) {
	t.Parallel()
	killScenario(t, true)
}

func TestKill9TwentyTimesAtLeastOnceDeliversDuplicates(t *testing.T) {
	t.Parallel()
	killScenario(t, false)
}

func killScenario(t *testing.T, exactlyOnce bool) {
	const (
		kills       = 20
		events      = 100_000
		bigTxEvents = 20_000
	)
	started := time.Now()
	d := newDB(t, testenv.SharedPostgres(t), 4)
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--status-interval=1s"}
	if exactlyOnce {
		args = append(args, "--delivery=exactly-once", "--transactional-id="+d.slot,
			"--positions-topic="+testenv.UniqueName(t, "positions"))
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))

	first := d.startRelay(brokers, true, args...)
	first.waitSessions(1, 90*time.Second)
	// Four writers, one of which writes the 20k-event transaction early on: with
	// transaction_max_events 10000 it spans several Kafka transactions, so kills land inside it and
	// the replay must skip the part of it Kafka committed.
	load := harness.StartLoad(d.outbox, harness.LoadConfig{
		Types: d.types, Writers: 4, Aggregates: 25, MaxPerTx: 10, TxPerSecond: 160,
		BigTxEvents: bigTxEvents, BigTxAfter: 3 * time.Second, Seed: seed,
	})
	loadStopped := false
	stopLoad := func() {
		if loadStopped {
			return
		}
		loadStopped = true
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stats, err := load.Stop(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("load: %s", stats)
	}
	defer stopLoad()

	streamed := 0
	for i := range kills {
		r := first
		cycle := time.Now()
		if i > 0 {
			r = d.startRelay(brokers, true, args...)
		}
		if i%5 == 4 {
			// Some kills land during start-up: reading the position, the slot busy with the last walsender.
			time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		} else {
			r.waitSessions(1, 90*time.Second)
			time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond)
		}
		if r.sessions() > 0 {
			streamed++
		}
		r.Kill()
		if testing.Verbose() {
			t.Logf("kill %2d after %s (streaming: %v); %d events written so far", i+1, time.Since(cycle).Round(time.Millisecond), r.sessions() > 0, load.Stats().Events)
		}
		if load.Stats().Events >= events {
			stopLoad()
		}
	}
	for !loadStopped && load.Stats().Events < events {
		time.Sleep(100 * time.Millisecond)
	}
	final := d.startRelay(brokers, true, args...)
	final.waitSessions(1, 90*time.Second)
	stopLoad()
	written := d.outbox.Written()
	t.Logf("%d kills (%d while streaming) and %d events written in %s", kills, streamed, len(written), time.Since(started).Round(time.Second))
	if streamed < kills/2 {
		t.Errorf("only %d of %d kills hit a streaming relay; the scenario did not test what it should", streamed, kills)
	}

	reading := time.Now()
	rep := deliverCommitted(t, brokers, written, 3*time.Minute, final)
	t.Logf("read_committed (%s): %s", time.Since(reading).Round(time.Millisecond), rep)
	if exactlyOnce {
		if rep.Duplicates != 0 {
			t.Errorf("exactly-once: a read_committed consumer saw %d duplicates, want 0", rep.Duplicates)
		}
		uncommitted := harness.Verify(written, readAll(t, brokers, written), nil)
		t.Logf("read_uncommitted sees what aborted transactions held too: %d duplicates", uncommitted.Duplicates)
	} else if rep.Duplicates == 0 {
		t.Errorf("at-least-once: %d kills caused no duplicate; the scenario cannot tell the modes apart", kills)
	}
	end := currentLSN(t, d.outbox.Pool())
	eventually(t, 60*time.Second, "the last instance to confirm everything", func() bool {
		return confirmedLSN(t, d.outbox.Pool(), d.slot) >= end
	})
	final.Terminate()
	if code, ok := final.Wait(30 * time.Second); !ok || code != 0 {
		t.Fatalf("last instance: exit code %d (exited: %v) after SIGTERM, want 0", code, ok)
	}
	t.Logf("scenario took %s", time.Since(started).Round(time.Second))
}

// deliverCommitted is deliver with a read_committed consumer: it reads until no event is missing
// (or timeout), lingers for late duplicates, and fails the test on loss, reordering or alteration.
func deliverCommitted(t *testing.T, brokers string, written []harness.Written, timeout time.Duration, relays ...*relay) harness.Report {
	t.Helper()
	c := harness.NewCommittedConsumer(brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := c.ReadUntil(ctx, 2*time.Second, func(recs []harness.Record) bool {
		return len(recs) >= len(written) && harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() {
		for _, r := range relays {
			published, perr := r.metric("events_published_total", "")
			t.Logf("relay pid %d: events_published_total %v (%v), exited %v", r.PID(), published, perr, r.Exited())
		}
		t.Fatalf("read_committed delivery check failed (read error: %v): %s", err, rep)
	}
	return rep
}

// readAll reads the written events' topics as a read_uncommitted consumer sees them.
func readAll(t *testing.T, brokers string, written []harness.Written) []harness.Record {
	t.Helper()
	c := harness.NewConsumer(brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.ReadUntil(ctx, 0, func([]harness.Record) bool { return true }); err != nil {
		t.Logf("read_uncommitted read: %v", err)
	}
	return c.Records()
}
