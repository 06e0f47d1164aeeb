package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// killRecord is what one SIGKILL may have cost in duplicates, with the numbers behind the bound.
type killRecord struct {
	at        time.Duration // after the instance started
	streaming bool
	acked     int // events Kafka acknowledged in ackWindow before the kill
	bigTx     int // events of the large transaction replayed because it was not yet confirmed
	bound     int
}

// kill9 SIGKILLs d's relay kills times at random moments while three writers keep committing,
// then lets a last instance drain. Every event must arrive, in order per aggregate, and the
// duplicates must fit the window of docs/guarantees.md: per crash, at most max_in_flight_events +
// the events acknowledged since the last status update + the rest of a transaction that was only
// partly acknowledged. The version matrix runs it on the oldest supported version; the nemesis
// (internal/chaos) kills relays of every mode on the newest.
func kill9(t *testing.T, d *db, brokers string, kills int) {
	const (
		maxInFlight    = 500
		statusInterval = 200 * time.Millisecond
		maxPerTx       = 5
		bigTxEvents    = 1500
		samplePeriod   = 50 * time.Millisecond
	)
	// "Acknowledged since the last status update": the update before the kill went out at most one
	// interval earlier; allow one more interval for a late timer on a loaded machine, and the
	// sampling period.
	ackWindow := 2*statusInterval + samplePeriod

	args := []string{fmt.Sprintf("--max-in-flight-events=%d", maxInFlight), "--status-interval=" + statusInterval.String()}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))

	// The first instance creates the slot; only transactions committed after that are streamed.
	first := d.startRelay(brokers, args...)
	first.waitSessions(1, 90*time.Second)
	load := harness.StartLoad(d.outbox, harness.LoadConfig{
		Types: d.types, Writers: 3, Aggregates: 12, MaxPerTx: maxPerTx, TxPerSecond: 50,
		LargeEvery: 300, LargeBytes: 400 << 10, Seed: seed,
	})
	// The large transaction is written by the test so its commit position is known: a crash before
	// it is confirmed republishes all of it, which the window allows for.
	var big marked
	var bigMu sync.Mutex
	bigDone := make(chan struct{})
	bigGo := make(chan struct{}) // closed by the kill loop: the large transaction lands among the kills
	go func() {
		defer close(bigDone)
		select {
		case <-bigGo:
		case <-t.Context().Done():
			return
		}
		specs := make([]harness.Spec, bigTxEvents)
		for i := range specs {
			specs[i] = harness.Spec{AggregateType: d.types[i%len(d.types)], AggregateID: fmt.Sprintf("groß-%d", i%25), EventType: "Bulk"}
		}
		m := d.writeMarked(specs...)
		bigMu.Lock()
		big = m
		bigMu.Unlock()
	}()

	var records []killRecord
	window := 0
	for i := range kills {
		r := first
		if i > 0 {
			r = d.startRelay(brokers, args...)
		}
		started := time.Now()
		acks := logAcks(r, samplePeriod)
		if i%4 == 3 {
			// Some kills land during start-up: checks, slot busy with the last walsender, catching up.
			time.Sleep(time.Duration(100+rng.IntN(900)) * time.Millisecond)
		} else {
			r.waitSessions(1, 90*time.Second)
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
		}
		acks.Stop()
		r.Kill()
		killed := time.Now()
		if i == kills/3 {
			close(bigGo)
		}

		rec := killRecord{at: killed.Sub(started), streaming: r.sessions() > 0, acked: acks.Since(killed.Add(-ackWindow))}
		bigMu.Lock()
		if big.CommitEnd != 0 && confirmedLSN(t, d.outbox.Pool(), d.slot) < big.CommitEnd {
			rec.bigTx = bigTxEvents
		}
		bigMu.Unlock()
		rec.bound = maxInFlight + maxPerTx + rec.acked + rec.bigTx
		window += rec.bound
		records = append(records, rec)
	}
	<-bigDone

	final := d.startRelay(brokers, args...)
	final.waitSessions(1, 90*time.Second)
	d.outbox.AwaitMore(t, 300, "while the last instance drains")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, brokers, d.outbox.Written(), 3*time.Minute, final)

	streamed := 0
	for i, rec := range records {
		t.Logf("kill %2d after %5s streaming=%-5v acked_in_window=%4d big_tx=%4d bound=%d",
			i+1, rec.at.Round(time.Millisecond), rec.streaming, rec.acked, rec.bigTx, rec.bound)
		if rec.streaming {
			streamed++
		}
	}
	t.Logf("load: %s", stats)
	t.Logf("delivery: %s; duplicate window %d", rep, window)
	if streamed < kills/2 {
		t.Errorf("only %d of %d kills hit a streaming relay; the scenario did not test what it should", streamed, kills)
	}
	if err := rep.DuplicatesWithin(window); err != nil {
		t.Error(err)
	}

	end := currentLSN(t, d.outbox.Pool())
	await.True(t, 30*time.Second, "the last instance to confirm everything", func() bool {
		return confirmedLSN(t, d.outbox.Pool(), d.slot) >= end
	})
	final.Terminate()
	if code, ok := final.Wait(30 * time.Second); !ok || code != 0 {
		t.Fatalf("last instance: exit code %d (exited: %v) after SIGTERM, want 0", code, ok)
	}
}

// TestPostgresFastRestartDuringLoadIsReconnectedWithoutLoss restarts PostgreSQL (fast shutdown)
// under load. The relay process must reconnect and resume on its own; writers reconcile commits
// whose outcome the restart made unknown. See postgresRestart for the duplicates. It runs without
// leader election: with it, the shutdown ends the leader's lock session, and the fence that follows
// closes the stream, which hides a stream that holds the shutdown up (TestEveryPostgresVersion
// restarts the other versions with the election on).
func TestPostgresFastRestartDuringLoadIsReconnectedWithoutLoss(t *testing.T) {
	t.Parallel()
	postgresRestart(t, testenv.Postgres(t, devenv.PostgresOptions{}), testenv.SharedKafka(t).Brokers(), "--leader-election=false")
}

// postgresRestart is the PostgreSQL restart scenario on a database of its own on pg, which it
// restarts. It also measures what the restart costs in duplicates. PostgreSQL 17 and later save a
// logical slot's confirmed position at a clean shutdown, so there the slot must come back where it
// was confirmed before the stop, and the duplicates must fit the in-flight window: what Kafka
// acknowledged from 2 x status_interval (plus the sampling period) before the stop until the stop
// ended, max_in_flight_events (handed to Kafka, acknowledged later), the rest of a partly acknowledged transaction, and the
// large transaction if it was not confirmed before the stop. Before 17 the slot comes back at its
// last saved position, which lags by up to the events since the last checkpoint or xmin advance:
// the test logs how far it went back and the duplicates, and asserts no loss only.
func postgresRestart(t *testing.T, pg *devenv.Postgres, brokers string, args ...string) {
	const (
		maxFastStop    = 10 * time.Second
		maxInFlight    = 300
		statusInterval = 200 * time.Millisecond
		maxPerTx       = 4
		bigTxEvents    = 1000
		samplePeriod   = 50 * time.Millisecond
	)
	ackWindow := 2*statusInterval + samplePeriod
	d := newDB(t, pg, 2)
	r := d.startRelay(brokers, append([]string{"--status-interval=" + statusInterval.String(), fmt.Sprintf("--max-in-flight-events=%d", maxInFlight)}, args...)...)
	r.waitSessions(1, 90*time.Second)

	load := harness.StartLoad(d.outbox, harness.LoadConfig{
		Types: d.types, Writers: 3, Aggregates: 10, MaxPerTx: maxPerTx, TxPerSecond: 40, Seed: 3,
	})
	acks := logAcks(r, samplePeriod)
	defer acks.Stop()
	d.outbox.AwaitMore(t, 200, "before the large transaction")
	specs := make([]harness.Spec, bigTxEvents)
	for i := range specs {
		specs[i] = harness.Spec{AggregateType: d.types[i%len(d.types)], AggregateID: fmt.Sprintf("groß-%d", i%25), EventType: "Bulk"}
	}
	big := d.writeMarked(specs...)
	// The stop comes once the large transaction is in the relay's hands (received whole, perhaps
	// not yet confirmed), the case the window allows for. received_lsn is where a message starts:
	// at or past CommitEnd is a later transaction of the load.
	await.True(t, time.Minute, "the relay to receive the large transaction whole", func() bool {
		return r.mustMetric("received_lsn", "") >= float64(big.CommitEnd)
	})

	ctx := context.Background()
	before := confirmedLSN(t, d.outbox.Pool(), d.slot)
	bigPending := before < big.CommitEnd
	stopping := time.Now()
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// A walsender leaves a fast shutdown only once its client has confirmed all it was sent, or
	// has gone: a relay that neither confirms (its publication checks are refused meanwhile) nor
	// leaves held PostgreSQL's stop for minutes, and a Kubernetes grace period would end it with
	// SIGKILL and crash recovery. Without a relay the stop takes a fraction of a second.
	if took := time.Since(stopping); took > maxFastStop {
		t.Errorf("PostgreSQL %d: the fast shutdown took %s with the relay streaming under load, want under %s: the relay must leave the stream when the server shuts down",
			d.major, took.Round(time.Millisecond), maxFastStop)
	} else {
		t.Logf("PostgreSQL %d: the fast shutdown took %s with the relay streaming under load", d.major, took.Round(time.Millisecond))
	}
	// The stop ended the relay's term (its leader lock connection is gone), or, without leader
	// election, its session (it left the stream): from here it only completes what it had handed
	// to Kafka (max_in_flight_events), and replays begin only once PostgreSQL is back.
	acks.Stop()
	acked := acks.Since(stopping.Add(-ackWindow))
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Read before the relay is back (it reconnects with a backoff; if it is faster, the slot can
	// only be further on).
	saved := savedConfirmedLSN(t, d)
	r.waitSessions(2, 60*time.Second)
	t.Logf("PostgreSQL %d restart took %s until the relay streamed again", d.major, time.Since(stopping).Round(time.Millisecond))
	d.outbox.AwaitMore(t, 400, "after the restart too")

	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stats, err := load.Stop(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Failures == 0 {
		t.Fatalf("no write failed during the restart (%s): the restart did not happen under load", stats)
	}
	rep := deliver(t, brokers, d.outbox.Written(), 2*time.Minute, r)
	window := maxInFlight + maxPerTx + acked
	if bigPending {
		window += bigTxEvents
	}
	back := "the relay had already confirmed further"
	if saved <= before {
		back = fmt.Sprintf("%d bytes back", before-saved)
	}
	t.Logf("PostgreSQL %d: slot confirmed at %s before the stop, %s after the restart (%s); acknowledged from %s before the stop until it ended: %d; large transaction unconfirmed at the stop: %v; load: %s; delivery: %s; in-flight window %d",
		d.major, lsnString(before), lsnString(saved), back, ackWindow, int(acked), bigPending, stats, rep, window)
	if r.Exited() {
		t.Fatal("the relay exited; it must reconnect on its own")
	}
	if d.major >= 17 {
		if saved < before {
			t.Errorf("PostgreSQL %d brought the slot back at %s after a clean restart, behind the %s confirmed before the stop: it should save the confirmed position at shutdown",
				d.major, lsnString(saved), lsnString(before))
		}
		if err := rep.DuplicatesWithin(window); err != nil {
			t.Errorf("PostgreSQL %d: %v", d.major, err)
		}
	}
	end := currentLSN(t, d.outbox.Pool())
	await.True(t, 30*time.Second, "the slot to be confirmed past the load", func() bool {
		return confirmedLSN(t, d.outbox.Pool(), d.slot) >= end
	})
}

// savedConfirmedLSN reads the slot's confirmed position on a new connection (the pool's are
// broken by a restart).
func savedConfirmedLSN(t *testing.T, d *db) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	return confirmedLSN(t, conn, d.slot)
}
