package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

// The kill -9 scenario of exactly-once delivery: the crashes must leave a read_committed consumer
// with every event exactly once, while a read_uncommitted one sees the duplicates that the aborted
// transactions of the killed instances held, so the test tells the two apart in one run (it ran
// side by side with an at-least-once copy of itself before, which cost as much again; the kill -9
// scenarios of at-least-once are in faults_test.go).
func TestKill9TwelveTimesExactlyOnceDeliversEveryEventOnce(t *testing.T) {
	t.Parallel()
	const (
		kills       = 12 // at least 6: the sixth is killed inside the large transaction
		events      = 60_000
		bigTxEvents = 20_000
	)
	started := time.Now()
	d := newDB(t, testenv.SharedPostgres(t), 4)
	brokers := testenv.SharedKafka(t).Brokers()
	positions := sink.Config{Brokers: strings.Split(brokers, ","),
		Transactions: &sink.Transactions{ID: d.slot, PositionsTopic: testenv.UniqueName(t, "positions")}}
	args := []string{"--status-interval=1s", "--delivery=exactly-once", "--transactional-id=" + positions.Transactions.ID,
		"--positions-topic=" + positions.Transactions.PositionsTopic}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))

	var relays []*relay
	start := func(extra ...string) *relay {
		r := d.startRelay(brokers, append(slices.Clone(args), extra...)...)
		relays = append(relays, r)
		return r
	}
	start().waitSessions(1, 90*time.Second)
	// Four writers as fast as the database lets them, so the kills land while they write.
	load := harness.StartLoad(d.outbox, harness.LoadConfig{
		Types: d.types, Writers: 4, Aggregates: 25, MaxPerTx: 10, Seed: seed,
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
	// The writers stop once they have written their share; the kills go on meanwhile.
	watching := make(chan struct{})
	defer close(watching)
	go func() {
		for load.Stats().Events < events-bigTxEvents {
			select {
			case <-watching:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		load.Pause()
	}()
	// The large transaction is written by the test while no relay runs, after the fifth kill, so
	// its commit position is known and the next instance is killed while it publishes it: part of
	// it committed in Kafka, the rest not.
	var big marked
	bigKilled := false

	streamed := 0
	for i := 0; i < kills || !loadStopped && load.Stats().Events < events-bigTxEvents; i++ {
		r := relays[len(relays)-1]
		cycle := time.Now()
		switch {
		case i == 5:
			// The instance that publishes the large transaction is killed while the position in
			// Kafka lies inside it. Small Kafka transactions (1,000 events, so 20 or more for it)
			// keep that window open long enough to be found on a loaded machine.
			r = start("--transaction-max-events=1000")
		case i > 0:
			r = start()
		}
		switch {
		case i == 5:
			r.waitSessions(1, 90*time.Second)
			bigKilled = waitInsideBigTx(t, r, positions, big, bigTxEvents)
		case i == 4:
			// Before the large transaction is written, the writers pause and this instance
			// catches up, so the next one has the large transaction and little else to publish.
			r.waitSessions(1, 90*time.Second)
			load.Pause()
			caughtUp := currentLSN(t, d.outbox.Pool())
			await.True(t, 3*time.Minute, "an instance to catch up before the large transaction", func() bool {
				return r.Exited() || confirmedLSN(t, d.outbox.Pool(), d.slot) >= caughtUp
			})
		case i%5 == 4:
			// Some kills land during start-up: reading the position, the slot busy with the last walsender.
			time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		default:
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
		if i == 4 {
			specs := make([]harness.Spec, bigTxEvents)
			for i := range specs {
				specs[i] = harness.Spec{AggregateType: d.types[i%len(d.types)], AggregateID: fmt.Sprintf("groß-%d", i%40), EventType: "Bulk"}
			}
			big = d.writeMarked(specs...)
			load.Resume()
		}
		if load.Stats().Events >= events-bigTxEvents {
			stopLoad()
		}
	}
	final := start()
	final.waitSessions(1, 90*time.Second)
	stopLoad()
	written := d.outbox.Written()
	t.Logf("%d kills (%d while streaming, one inside the %d-event transaction: %v) and %d events written in %s",
		len(relays)-1, streamed, bigTxEvents, bigKilled, len(written), time.Since(started).Round(time.Second))
	if streamed < kills/2 {
		t.Errorf("only %d of %d kills hit a streaming relay; the scenario did not test what it should", streamed, kills)
	}
	if !bigKilled {
		t.Errorf("no kill landed inside the large transaction's publishing")
	}

	reading := time.Now()
	rep := deliverCommitted(t, brokers, written, 3*time.Minute, final)
	t.Logf("read_committed (%s): %s", time.Since(reading).Round(time.Millisecond), rep)
	if rep.Duplicates != 0 {
		t.Errorf("exactly-once: a read_committed consumer saw %d duplicates, want 0", rep.Duplicates)
	}
	if !resumedInside(relays, big, bigTxEvents) {
		t.Errorf("no instance resumed from a position inside the large transaction (commit LSN %s): the skip of a partly committed transaction was not exercised", lsnString(big.CommitStart))
	}
	// What at-least-once would have delivered twice is in the log, in aborted transactions.
	uncommitted := harness.Verify(written, readAll(t, brokers, written), nil)
	t.Logf("read_uncommitted sees what aborted transactions held too: %d duplicates", uncommitted.Duplicates)
	if uncommitted.Duplicates == 0 {
		t.Errorf("%d kills left no aborted record for a read_uncommitted consumer: the crashes replayed nothing, so the zero duplicates above prove nothing", len(relays)-1)
	}
	end := currentLSN(t, d.outbox.Pool())
	await.True(t, 60*time.Second, "the last instance to confirm everything", func() bool {
		return confirmedLSN(t, d.outbox.Pool(), d.slot) >= end
	})
	final.Terminate()
	if code, ok := final.Wait(30 * time.Second); !ok || code != 0 {
		t.Fatalf("last instance: exit code %d (exited: %v) after SIGTERM, want 0", code, ok)
	}
	t.Logf("scenario took %s", time.Since(started).Round(time.Second))
}

// waitInsideBigTx waits until r is in the middle of publishing the large transaction big, and
// reports whether it got there: until the position committed in Kafka lies inside it.
func waitInsideBigTx(t *testing.T, r *relay, positions sink.Config, big marked, bigTxEvents int) bool {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var last sink.Position
	for time.Now().Before(deadline) && !r.Exited() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		pos, ok, err := sink.ReadPosition(ctx, positions)
		cancel()
		if testing.Verbose() && (err != nil || pos != last) {
			t.Logf("position %+v (found %v, error %v); the large transaction commits at %s", pos, ok, err, lsnString(big.CommitStart))
			last = pos
		}
		if err == nil && ok && uint64(pos.CommitLSN) == big.CommitStart && pos.Events > 0 && pos.Events < bigTxEvents {
			return true
		}
		if err == nil && ok && uint64(pos.CommitLSN) > big.CommitStart {
			return false // past it already
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// resumedInside reports whether some instance started from a position inside big: part of it
// committed in Kafka, to be skipped, the rest to be published.
func resumedInside(relays []*relay, big marked, bigTxEvents int) bool {
	for _, r := range relays {
		for _, l := range relayproc.Logs(r.Output()) {
			if l["msg"] != resumeMsg || l["commit_lsn"] != lsnString(big.CommitStart) {
				continue
			}
			if n, _ := l["events_of_that_transaction"].(float64); n > 0 && int(n) < bigTxEvents {
				return true
			}
		}
	}
	return false
}

const resumeMsg = "exactly-once: resuming after the position committed in Kafka; PostgreSQL replays from the slot's confirmed position and what the position covers is not published again"

// deliverCommitted is deliver with a read_committed consumer: it reads until no event is missing
// (or timeout), lingers for late duplicates, and fails the test on loss, reordering or alteration.
func deliverCommitted(t *testing.T, brokers string, written []harness.Written, timeout time.Duration, relays ...*relay) harness.Report {
	t.Helper()
	c := harness.NewCommittedConsumer(brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Verify is slow under the race detector; done only counts the ids not seen yet.
	missing := make(map[string]bool, len(written))
	for _, w := range written {
		missing[w.ID] = true
	}
	seen := 0
	err := c.ReadUntil(ctx, 2*time.Second, func(recs []harness.Record) bool {
		for _, r := range recs[seen:] {
			delete(missing, r.Header("id"))
		}
		seen = len(recs)
		return len(missing) == 0
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
