package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestARecoveryHasOneOwnerForItsWholeLength: a lost slot's recovery replaces the slot and then
// publishes the gap over an ordinary connection, the replacement inactive all the while. Whoever
// recovers must own the recovery until it is recorded as ended: nobody else may drop the
// replacement, publish a second copy of the gap or end the recovery meanwhile. The gap goes out
// through a slowed broker, so that the recovery lasts seconds.
func TestARecoveryHasOneOwnerForItsWholeLength(t *testing.T) {
	t.Parallel()
	fb := newFaultBroker(t)
	pg := testenv.SharedPostgres(t)
	for _, sc := range []struct {
		name string
		run  func(*testing.T, *faultBroker, *devenv.Postgres)
	}{
		{"a leader paused mid-gap past its lease keeps the recovery: the next leader waits for it, nothing of the gap is lost and every aggregate ends at its latest event", testPausedRecoveryOwner},
		{"two instances without leader election find the slot lost at once: one recovers, the other waits saying so; the gap is published once", testTwoRecoveriesAtOnce},
		{"an exactly-once leader cut off from PostgreSQL and Kafka while its gap waits for Kafka steps down at once: outbox_relay_leader 0 and its run ended within seconds of the fence, nothing of the gap lost", testFencedWhileTheGapWaitsForKafka},
	} {
		fb.heal(t)
		t.Run(sc.name, func(t *testing.T) { sc.run(t, fb, pg) })
	}
}

// recoveryArgs are the flags of the relays of TestARecoveryHasOneOwnerForItsWholeLength: small
// produce requests, so that the throttled gap goes out request by request.
var recoveryArgs = []string{"--on-slot-lost=recover", "--slot-recovery-margin=1s", "--status-interval=200ms",
	"--kafka.batch-size=5", "--kafka.linger=5ms"}

// gapThrottle slows each connection to the broker while a gap is published: about 8 s for
// gapEvents events of gapPad bytes.
const (
	gapThrottle = 16 << 10
	gapEvents   = 60
	gapPad      = 2 << 10
)

// loseSlotWithGap runs a relay until it streams and Kafka holds a first event, stops it, writes
// the gap and drops the slot: the next start finds it lost (the ledger records its creation).
func loseSlotWithGap(t *testing.T, d *db, brokers string, args ...string) (gap []harness.Written) {
	t.Helper()
	ctx := context.Background()
	startStreamingThenStop(t, d, brokers, args, func() {
		if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "before"}); err != nil {
			t.Fatal(err)
		}
	})
	before := len(d.outbox.Written())
	for i := range gapEvents {
		spec := harness.Spec{AggregateType: d.types[i%len(d.types)], AggregateID: fmt.Sprintf("gap-%d", i%5), PadBytes: gapPad}
		if err := d.outbox.WriteTx(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.outbox.Pool().Exec(ctx, "SELECT pg_drop_replication_slot($1)", d.slot); err != nil {
		t.Fatal(err)
	}
	return d.outbox.Written()[before:]
}

// lastCopyOrder returns the aggregates whose events, each counted where its last copy arrived,
// are not in the order they were written: a consumer that applies every record ends such an
// aggregate on an older event (e3 then e1).
func lastCopyOrder(records []harness.Record, written []harness.Written) []string {
	byID := make(map[string]harness.Written, len(written))
	for _, w := range written {
		byID[w.ID] = w
	}
	last := make(map[string]map[int]int) // aggregate -> seq -> index of its last copy
	for i, r := range records {
		w, ok := byID[r.Header("id")]
		if !ok {
			continue
		}
		agg := w.AggregateType + "/" + w.AggregateID
		if last[agg] == nil {
			last[agg] = make(map[int]int)
		}
		last[agg][w.Seq] = i
	}
	var bad []string
	for agg, at := range last {
		seqs := make([]int, 0, len(at))
		for seq := range at {
			seqs = append(seqs, seq)
		}
		sort.Slice(seqs, func(i, j int) bool { return at[seqs[i]] < at[seqs[j]] })
		if !sort.IntsAreSorted(seqs) {
			bad = append(bad, fmt.Sprintf("%s: last copies in the order %v", agg, seqs))
		}
	}
	sort.Strings(bad)
	return bad
}

// testPausedRecoveryOwner: the leader is paused (SIGSTOP) while it publishes the gap, for longer
// than its lease; the standby takes the leader lock. The standby must not drop the paused
// leader's replacement nor publish the gap itself: it waits, saying so, until the paused
// leader resumes and gives the recovery up (it is fenced) or ends it. Then every event arrives,
// and every aggregate's last copies are in order.
func testPausedRecoveryOwner(t *testing.T, fb *faultBroker, pg *devenv.Postgres) {
	ctx := context.Background()
	d := newDB(t, pg, 2)
	pool := d.outbox.Pool()
	args := append([]string{"--leader-retry-interval=200ms", "--leader-check-timeout=2s"}, recoveryArgs...)
	loseSlotWithGap(t, d, fb.brokers, args...)

	fb.proxy.Throttle(gapThrottle)
	a := d.startRelay(fb.brokers, args...)
	if !a.WaitFor(ctx, "recovering a lost slot's gap from the outbox table", 2*time.Minute) {
		t.Fatalf("the relay did not begin the recovery:\n%s", a.Output())
	}
	if err := syscall.Kill(a.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := true
	resume := func() {
		if paused {
			paused = false
			if err := syscall.Kill(a.PID(), syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer resume()
	var replacement string
	if err := pool.QueryRow(ctx, "SELECT consistent_lsn::text || ' ' || created_at::text FROM outbox_relay_slots WHERE slot = $1 AND recovery_since IS NOT NULL", d.slot).Scan(&replacement); err != nil {
		t.Fatalf("the paused leader's recovery is not under way in the ledger (did it end before the pause? the gap must be larger): %v\n%s", err, a.Output())
	}

	b := d.startRelay(fb.brokers, args...)
	const waits, beganAgain = "another process owns the recovery of the lost slot's gap", "starting it again with a new slot"
	await.True(t, 2*time.Minute, "the standby to take the leader lock and find the recovery under way", func() bool {
		out := b.Output()
		return strings.Contains(out, waits) || strings.Contains(out, beganAgain)
	})
	if strings.Contains(b.Output(), beganAgain) {
		t.Errorf("the next leader began the recovery again while its owner was paused, dropping the owner's replacement slot")
		// What that costs: the paused leader, resumed after the other's copy, publishes the
		// rest of its own behind it.
		if !b.WaitFor(ctx, "recovered the lost slot's gap", 2*time.Minute) {
			t.Fatalf("the next leader did not finish its recovery:\n%s", b.Output())
		}
	}
	var now string
	if err := pool.QueryRow(ctx, "SELECT consistent_lsn::text || ' ' || created_at::text FROM outbox_relay_slots WHERE slot = $1", d.slot).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if now != replacement {
		t.Errorf("while its owner was paused, the ledger's replacement slot changed from %s to %s", replacement, now)
	}
	resume()

	// The resumed leader finds its term lost and stops (or ends its recovery first); the new
	// leader then finishes what is left and streams.
	b.waitSessions(1, 2*time.Minute)
	fb.proxy.Throttle(0)
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "after"}); err != nil {
		t.Fatal(err)
	}
	written := d.outbox.Written()
	rep := deliver(t, fb.brokers, written, 2*time.Minute, a, b)
	if rep.Missing != 0 {
		t.Fatalf("after the pause: %s", rep)
	}
	if bad := lastCopyOrder(readAll(t, fb.brokers, written), written); len(bad) > 0 {
		t.Errorf("aggregates whose last copies are out of order (a consumer ends them on an older event):\n%s", strings.Join(bad, "\n"))
	}
	t.Logf("%d events, %d duplicates", rep.Expected, rep.Duplicates)
}

// testTwoRecoveriesAtOnce: two relays without leader election start at once on a lost slot. One
// owns the recovery; the other must wait for it, saying so, then find the slot replaced and
// healthy, and publish nothing of the gap: every gap event arrives exactly once, every event
// arrives, and every aggregate's last copies are in order.
func testTwoRecoveriesAtOnce(t *testing.T, fb *faultBroker, pg *devenv.Postgres) {
	ctx := context.Background()
	d := newDB(t, pg, 2)
	args := append([]string{"--leader-election=false"}, recoveryArgs...)
	gap := loseSlotWithGap(t, d, fb.brokers, args...)

	fb.proxy.Throttle(gapThrottle)
	relays := []*relay{d.startRelay(fb.brokers, args...), d.startRelay(fb.brokers, args...)}
	const recovering, waits = "recovering a lost slot's gap from the outbox table", "another process owns the recovery of the lost slot's gap"
	await.True(t, 2*time.Minute, "the recovery to be published and streamed from", func() bool {
		return strings.Contains(relays[0].Output()+relays[1].Output(), `"msg":"streaming"`)
	})
	fb.proxy.Throttle(0)
	recovered := 0
	for _, r := range relays {
		if strings.Contains(r.Output(), recovering) {
			recovered++
		}
	}
	if recovered != 1 {
		t.Errorf("%d relays published the gap; want 1, the other waiting for it", recovered)
	}
	if !strings.Contains(relays[0].Output()+relays[1].Output(), waits) {
		t.Errorf("no relay said it waited for the other's recovery (%q)", waits)
	}
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "after"}); err != nil {
		t.Fatal(err)
	}
	written := d.outbox.Written()
	rep := deliver(t, fb.brokers, written, 2*time.Minute, relays...)
	if rep.Missing != 0 {
		t.Fatalf("after the recovery: %s", rep)
	}
	records := readAll(t, fb.brokers, written)
	if bad := lastCopyOrder(records, written); len(bad) > 0 {
		t.Errorf("aggregates whose last copies are out of order (a consumer ends them on an older event):\n%s", strings.Join(bad, "\n"))
	}
	counts := make(map[string]int)
	for _, rec := range records {
		counts[rec.Header("id")]++
	}
	twice := 0
	for _, w := range gap {
		if counts[w.ID] != 1 {
			twice++
		}
	}
	if twice > 0 {
		t.Errorf("%d of the gap's %d events arrived other than once: the gap was published more than once", twice, len(gap))
	}
	t.Logf("%d events, %d duplicates", rep.Expected, rep.Duplicates)
}

// fencedStepDown bounds how long a leader fenced while its gap waits for Kafka takes to end its
// run: closing the sink, whose abort of the open Kafka transaction a silent broker answers only
// after its 2 s grace, with room for a loaded machine. The leader gauge drops at the fence itself.
const fencedStepDown = 5 * time.Second

// testFencedWhileTheGapWaitsForKafka is the nemesis's finding 8: an exactly-once leader owns a
// lost slot's recovery whose gap has all been handed to Kafka and waits for its commit, then its
// network to PostgreSQL and to Kafka goes silent (no FIN, no RST). Its lock check fences it; the
// fence must end the gap's publication and the run at once, as it ends streaming, and
// outbox_relay_leader must read 0 from the fence on (the two-leaders rule of the nemesis reads
// it). Before, the run waited for PostgreSQL to answer the ROLLBACK of the gap's read, until the
// network healed, reporting leadership all the while. Once the network is back, the relay leads
// again, publishes the gap again and every event reaches a read_committed consumer.
func testFencedWhileTheGapWaitsForKafka(t *testing.T, fb *faultBroker, pg *devenv.Postgres) {
	ctx := context.Background()
	d := newDB(t, pg, 1) // the gap's one topic exists: no metadata to wait for once Kafka is cut off
	args := append([]string{"--delivery=exactly-once", "--leader-retry-interval=200ms", "--leader-check-timeout=1s"}, recoveryArgs...)
	loseSlotWithGap(t, d, fb.brokers, args...)

	u, err := url.Parse(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pgProxy := newProxy(t, "127.0.0.1:0", u.Host)
	defer pgProxy.Resume()
	u.Host = pgProxy.addr
	fb.proxy.Throttle(gapThrottle) // the gap takes seconds to commit
	a := d.startRelay(fb.brokers, append(args, "--pg-dsn="+u.String())...)
	if !a.WaitFor(ctx, "recovering a lost slot's gap from the outbox table", 2*time.Minute) {
		t.Fatalf("the relay did not begin the recovery:\n%s", a.Output())
	}
	fb.proxy.Stall()
	defer fb.proxy.Resume()
	// Every event of the gap handed to the sink (read from the table whole), none of the last
	// ones acknowledged: the recovery waits for Kafka alone.
	await.True(t, time.Minute, "the whole gap to be handed to Kafka", func() bool {
		inFlight, err1 := a.metric("in_flight_events", "")
		published, err2 := a.metric("events_published_total", "")
		return err1 == nil && err2 == nil && inFlight > 0 && inFlight+published >= gapEvents
	})
	if strings.Contains(a.Output(), "recovered the lost slot's gap") {
		t.Fatalf("the gap was published before Kafka was cut off (the gap must be larger):\n%s", a.Output())
	}
	offset := len(a.Output())
	pgProxy.Stall()
	const fenced = "lost the leader lock connection; fencing"
	if _, ok := a.waitLog(offset, fenced, 30*time.Second); !ok {
		t.Fatalf("the relay cut off from PostgreSQL was not fenced:\n%s", a.Output())
	}
	at := time.Now()
	// What Kafka had committed of the gap by the fence: the next term publishes the whole gap
	// again, so only these may reach a read_committed consumer twice. The fenced producer's open
	// transaction, the rest of the gap, must never commit, not even once the network is back.
	committed := a.mustMetric("events_published_total", "")
	leading := func() float64 {
		v, err := a.metric("leader", "")
		if err != nil {
			t.Fatalf("scrape outbox_relay_leader: %v", err)
		}
		return v
	}
	if v := leading(); v != 0 {
		t.Errorf("outbox_relay_leader is %v once the relay logged its fence; want 0 from the fence on", v)
	}
	const stopped = "the fenced relay stopped"
	took, ok := a.waitLog(offset, stopped, fencedStepDown)
	if !ok {
		t.Errorf("the fenced relay's run did not end within %s of the fence (%q not logged, outbox_relay_leader %v); the network is still cut off",
			fencedStepDown, stopped, leading())
	} else {
		t.Logf("the fenced relay's run ended %s after the fence line was seen", took.Round(time.Millisecond))
	}
	if v := leading(); v != 0 {
		t.Errorf("outbox_relay_leader is %v %s after the fence; want 0", v, time.Since(at).Round(time.Millisecond))
	}
	if strings.Contains(a.Output(), "recovered the lost slot's gap") {
		t.Errorf("the fenced relay recorded the gap as recovered")
	}

	pgProxy.Resume()
	fb.proxy.Resume()
	fb.proxy.Throttle(0)
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "after"}); err != nil {
		t.Fatal(err)
	}
	rep := deliverCommitted(t, fb.brokers, d.outbox.Written(), 2*time.Minute, a)
	// The recovery the relay begins again once it leads anew publishes, at least once, the rows
	// the gap's rule chooses that Kafka held before the loss (may_be_duplicates): those may come
	// twice too, the fenced transaction's never.
	again := recoveredMayBeDuplicates(a.Output()[offset:])
	if float64(rep.Duplicates) > committed+float64(again) {
		t.Errorf("%d events reached a read_committed consumer twice, but only %v of the gap were committed by the fence and %d published again as the recovery's may-be-duplicates: the fenced producer's open transaction was committed after it",
			rep.Duplicates, committed, again)
	}
	t.Logf("%d events, %d duplicates (%v of the gap committed before the fence, %d the recovery's may-be-duplicates)", rep.Expected, rep.Duplicates, committed, again)
}

// recoveredMayBeDuplicates sums may_be_duplicates over the "recovered the lost slot's gap" lines
// of a relay's output: the events a recovery published that Kafka may have held already.
func recoveredMayBeDuplicates(output string) int {
	n := 0
	for _, line := range strings.Split(output, "\n") {
		if !strings.Contains(line, "recovered the lost slot's gap") {
			continue
		}
		var fields struct {
			MayBeDuplicates int `json:"may_be_duplicates"`
		}
		if err := json.Unmarshal([]byte(line), &fields); err == nil {
			n += fields.MayBeDuplicates
		}
	}
	return n
}
