package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestAPollerWaitsForTheStandbysOfSynchronizedStandbySlots: with the primary's
// synchronized_standby_slots naming its standby, a row committed while the standby receives
// nothing must not reach Kafka (a promotion of that standby would lose the transaction, and the
// poller would have invented its event); once the standby streams again, it is published. The
// walsender gives a logical slot that rule; a poller reads the table and must keep it itself.
// Found by the nemesis (seed 20261202, poll: three events of a transaction a synced failover lost
// were read by a consumer).
func TestAPollerWaitsForTheStandbysOfSynchronizedStandbySlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.SharedKafka(t).Brokers()
	c := newCluster(t, "18", true)
	env := map[string]string{"OUTBOX_PG_DSN": c.d.dsn, "OUTBOX_SOURCE": "poll"}
	if code, out := relayproc.Run(t, relayproc.Options{Subcommand: "migrate", Env: env}, time.Minute); code != 0 {
		t.Fatalf("migrate --source poll: exit %d, output:\n%s", code, out)
	}
	r := c.d.startRelay(brokers, "--source=poll", "--poll-interval=100ms")
	if _, ok := r.waitLog(0, `"msg":"polling"`, 90*time.Second); !ok {
		t.Fatalf("the poller did not start:\n%s", r.Output())
	}
	write := func(id string) {
		t.Helper()
		spec := harness.Spec{AggregateType: c.d.types[0], AggregateID: id}
		if err := c.d.outbox.WriteTx(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	write("before")
	deliver(t, brokers, c.d.outbox.Written(), time.Minute, r)
	before := len(c.d.outbox.Written())

	if err := c.standby.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	write("unreplicated")
	write("unreplicated")
	gap := c.d.outbox.Written()[before:]
	// The poller claims the unreplicated rows and then, inside the claim's transaction, waits for
	// the standby's slot to pass them: a transaction begun since the standby stopped and still open
	// on that query is such a claim, held back (a poller without the rule publishes the rows
	// within its interval, and never waits on the slot while it holds a claim).
	await.State(t, time.Minute, "the poller's claim of the unreplicated rows to wait for the standby", func() (bool, string) {
		var waiting int
		err := c.d.outbox.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND state <> 'idle' AND xact_start > $1
			AND query LIKE '%FROM pg_replication_slots%slot_type = ''physical''%'`, stopped).Scan(&waiting)
		if err != nil {
			return false, err.Error()
		}
		return waiting > 0, "no claim waits for the standby"
	})
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	recs, err := harness.Reread(rctx, brokers, harness.Topics(gap, nil)...)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		for _, w := range gap {
			if rec.Header("id") == w.ID {
				t.Fatalf("event %s reached Kafka while the standby of synchronized_standby_slots had not received its commit", w.ID)
			}
		}
	}

	if err := c.standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, brokers, c.d.outbox.Written(), 2*time.Minute, r)
	if rep.Missing != 0 || rep.OrderViolations != 0 {
		t.Fatalf("after the standby's return: %s", rep)
	}

	// The wait costs the standbys' round trip, not a pause per batch: on a quiet primary, the WAL
	// a claim inserts (its own row locks) is flushed by nothing until some transaction commits,
	// the next running-transactions record up to 15 s later, and a wait for it stalled every
	// batch that long (a backlog drained at about 34 rows/s). The bounds are a tenth of that
	// stall, and many times what the drain takes.
	published := func() float64 { return r.mustMetric("events_published_total", "") }
	waitPublished := func(what string, n float64, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for published() < n {
			if time.Since(start) > within {
				t.Fatalf("%s: %v published of %v after %v; a claimed batch waits for WAL that nothing flushes:\n%s", what, published(), n, within, r.Output())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Since(start)
	}
	for i := range 3 {
		want := published() + 1
		write(fmt.Sprintf("alone-%d", i))
		took := waitPublished("an event written alone on a quiet primary", want, 5*time.Second)
		t.Logf("an event written alone on a quiet primary published in %v", took)
	}
	// One transaction, so that the whole backlog is there before the first claim: claims that
	// interleave with the writers' commits have their WAL flushed by them.
	const backlog = 3000
	want := published() + backlog
	specs := make([]harness.Spec, backlog)
	for i := range specs {
		specs[i] = harness.Spec{AggregateType: c.d.types[i%len(c.d.types)], AggregateID: fmt.Sprintf("backlog-%d", i%50)}
	}
	if err := c.d.outbox.WriteTx(ctx, specs...); err != nil {
		t.Fatal(err)
	}
	took := waitPublished("a backlog on a quiet primary", want, 30*time.Second)
	t.Logf("a backlog of %d rows drained in %v", backlog, took)
	if rep := deliver(t, brokers, c.d.outbox.Written(), time.Minute, r); !rep.OK() {
		t.Fatalf("after the backlog: %s", rep)
	}
}
