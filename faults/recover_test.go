package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestALostSlotIsRecoveredFromTheOutboxTable: a relay with on_slot_lost: recover is stopped, writers
// go on committing, and PostgreSQL invalidates the slot (max_slot_wal_keep_size, a checkpoint). The
// next start must replace the slot, publish the gap from the outbox table, and stream on: every
// event arrives, in per-aggregate order, and what arrives twice is only what the rule allows (by
// commit time: the last acknowledged transaction's second; by creation time: what was acknowledged
// within the margin). Between the stop and the loss, `outbox-relay prune --older-than 0s` must keep
// every row the recovery will need.
func TestALostSlotIsRecoveredFromTheOutboxTable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		version          string
		commitTimestamps bool
		lose             string // how PostgreSQL invalidates the slot: invalidation_reason
		delivery         string
		failover         bool // a failover slot: the replication connection runs SQL before streaming
	}{
		{"16", true, "wal_removed", "at-least-once", false},
		{"18", false, "wal_removed", "exactly-once", false},
		{"18", true, "idle_timeout", "at-least-once", true},
	} {
		name := fmt.Sprintf("PostgreSQL%s/%s/track_commit_timestamp=%v/%s/failover=%v", tc.version, tc.lose, tc.commitTimestamps, tc.delivery, tc.failover)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			settings := map[string]string{
				"max_slot_wal_keep_size": "1MB",
				"wal_keep_size":          "0",
				"min_wal_size":           "32MB",
				"max_wal_size":           "64MB",
			}
			if tc.lose == "idle_timeout" {
				settings = map[string]string{"idle_replication_slot_timeout": "1s"}
			}
			if tc.commitTimestamps {
				settings["track_commit_timestamp"] = "on"
			}
			testLostSlotRecovered(t, testenv.Postgres(t, devenv.PostgresOptions{Version: tc.version, Settings: settings}), tc.commitTimestamps, tc.lose, tc.delivery, tc.failover)
		})
	}
}

// loseSlot makes PostgreSQL invalidate the inactive slot: by removing WAL it needs (filler writes
// and checkpoints past max_slot_wal_keep_size), or for idleness (a checkpoint after
// idle_replication_slot_timeout).
func loseSlot(t *testing.T, d *db, how string) {
	t.Helper()
	ctx := context.Background()
	pool := d.outbox.Pool()
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS filler (id bigserial PRIMARY KEY, pad text)"); err != nil {
		t.Fatal(err)
	}
	lost := func() bool {
		var st *string
		if err := pool.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", d.slot).Scan(&st); err != nil {
			t.Fatalf("read the slot: %v", err)
		}
		return st != nil && *st == "lost"
	}
	await.True(t, 2*time.Minute, "PostgreSQL to invalidate the slot ("+how+")", func() bool {
		if how == "idle_timeout" {
			// The checkpoint invalidates a slot inactive for the timeout's whole seconds by the
			// server's clock: wait for that, as the server reads it.
			await.True(t, 30*time.Second, "the slot to idle for idle_replication_slot_timeout", func() bool {
				var idle bool
				err := pool.QueryRow(ctx, "SELECT now() - inactive_since >= current_setting('idle_replication_slot_timeout')::interval FROM pg_replication_slots WHERE slot_name = $1", d.slot).Scan(&idle)
				return err == nil && idle
			})
		} else if _, err := pool.Exec(ctx, "INSERT INTO filler (pad) SELECT repeat('x', 1000) FROM generate_series(1, 8000)"); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		return lost()
	})
}

func testLostSlotRecovered(t *testing.T, pg *devenv.Postgres, commitTimestamps bool, lose, delivery string, failover bool) {
	ctx := context.Background()
	d := newDB(t, pg, 4)
	pool := d.outbox.Pool()
	brokers := testenv.SharedKafka(t).Brokers()
	// The margin of the creation time rule: events acknowledged more than this before the loss
	// must not come again.
	const margin = 2 * time.Second
	args := []string{"--on-slot-lost=recover", "--slot-recovery-margin=" + margin.String(), "--status-interval=200ms", "--delivery=" + delivery}
	if delivery == "exactly-once" {
		args = append(args, "--positions-topic="+testenv.UniqueName(t, "positions"), "--transactional-id="+d.slot)
	}
	if failover {
		args = append(args, "--failover=true")
	}
	check := deliver
	if delivery == "exactly-once" {
		check = deliverCommitted // what read_committed consumers see
	}
	write := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			spec := harness.Spec{AggregateType: d.types[i%len(d.types)], AggregateID: fmt.Sprintf("%s-%d", prefix, i%7)}
			if err := d.outbox.WriteTx(ctx, spec, spec); err != nil {
				t.Fatal(err)
			}
		}
	}

	r := d.startRelay(brokers, args...)
	r.waitSessions(1, 90*time.Second)
	write("early", 40)
	early := len(d.outbox.Written())
	await.Window(t, 2*margin+time.Second, "the early events fall outside every rule's window")
	write("late", 2)
	acknowledged := d.outbox.Written()
	check(t, brokers, acknowledged, time.Minute, r)
	// The ledger records how far Kafka acknowledged every few seconds, and once more at a stop.
	r.Terminate()
	if code, ok := r.Wait(time.Minute); !ok || code != 0 {
		t.Fatalf("the relay did not stop cleanly (exit %d, exited %v):\n%s", code, ok, r.Output())
	}
	var confirmed time.Time
	if err := pool.QueryRow(ctx, "SELECT confirmed_commit_time FROM outbox_relay_slots WHERE slot = $1", d.slot).Scan(&confirmed); err != nil {
		t.Fatalf("read the acknowledged commit time from the slot ledger: %v", err)
	}

	// The gap: written while no relay runs.
	write("gap", 120)

	// Pruning everything it may: what the recovery needs stays.
	code, out := relayproc.Run(t, relayproc.Options{Subcommand: "prune",
		Args: []string{"--older-than=0s", "--slot=" + d.slot, "--slot-recovery-margin=" + margin.String()},
		Env:  map[string]string{"OUTBOX_PG_DSN": d.dsn}}, time.Minute)
	if code != 0 {
		t.Fatalf("outbox-relay prune: exit %d\n%s", code, out)
	}
	t.Logf("prune: %s", strings.TrimSpace(out))
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if want := len(d.outbox.Written()) - early; left < want {
		t.Fatalf("prune left %d rows; the recovery needs the %d written after the early ones", left, want)
	}
	if left == len(d.outbox.Written()) {
		t.Errorf("prune --older-than=0s deleted nothing: the %d early events, acknowledged long before, were prunable", early)
	}

	loseSlot(t, d, lose)

	r2 := d.startRelay(brokers, args...)
	r2.waitSessions(1, 2*time.Minute)
	write("after", 20)
	written := d.outbox.Written()
	rep := check(t, brokers, written, 2*time.Minute, r2)
	if rep.Missing != 0 || rep.OrderViolations != 0 {
		t.Fatalf("after the recovery: %s", rep)
	}
	if !strings.Contains(r2.Output(), "recovered the lost slot's gap") {
		t.Errorf("the relay did not log the recovery:\n%s", r2.Output())
	}
	if n := r2.mustMetric("slot_recoveries_total", ""); n != 1 {
		t.Errorf("slot_recoveries_total = %v, want 1", n)
	}

	// What came twice: only what the rule allows.
	counts := deliveries(t, brokers, written)
	allowed := make(map[string]bool)
	for _, w := range acknowledged[early:] {
		allowed[w.ID] = true // the last acknowledged transactions: within the skew, or the margin
	}
	dups := 0
	for _, w := range written {
		if counts[w.ID] > 1 {
			dups += counts[w.ID] - 1
			if !allowed[w.ID] {
				t.Errorf("event %s (aggregate %s) arrived %d times: it was acknowledged more than the margin before the loss (ledger: %s), so no rule lets the recovery publish it again",
					w.ID, w.AggregateID, counts[w.ID], confirmed.Format(time.RFC3339Nano))
			}
		}
	}
	t.Logf("%d events, %d duplicates (%d allowed), recovered after %s", len(written), dups, len(allowed), confirmed.Format(time.RFC3339Nano))
	var recovered int64
	var rule string
	if err := pool.QueryRow(ctx, "SELECT recovered_events, recovered_rule FROM outbox_relay_slots WHERE slot = $1", d.slot).Scan(&recovered, &rule); err != nil {
		t.Fatalf("read the recovery from the slot ledger: %v", err)
	}
	wantRule := "xmin" // the horizon recorded with the acknowledged commit, not the margin
	if commitTimestamps {
		wantRule = "commit_time"
	}
	if rule != wantRule || recovered < 120*2 {
		t.Errorf("the ledger records a recovery of %d events by %q; want at least the gap's %d, by %q", recovered, rule, 120*2, wantRule)
	}
	code, out = relayproc.Run(t, relayproc.Options{Subcommand: "status", Args: []string{"--slot=" + d.slot},
		Env: map[string]string{"OUTBOX_PG_DSN": d.dsn}}, time.Minute)
	if want := fmt.Sprintf("events committed after %s (rule %s)", confirmed.UTC().Format(time.RFC3339), wantRule); code != 0 || !strings.Contains(out, "last recovery") || !strings.Contains(out, want) {
		t.Errorf("status after the recovery: exit %d, want 0 and a line \"last recovery\" with %q:\n%s", code, want, out)
	}
}

// TestAKilledRecoveryIsFinishedByTheStandby: the leader is killed -9 while it publishes a lost
// slot's gap, and the standby takes over. The standby must find the recovery under way (the new
// slot was confirmed nothing), begin it again, and stream on: every event arrives, in per-aggregate
// order.
func TestAKilledRecoveryIsFinishedByTheStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t, devenv.PostgresOptions{Version: "16", Settings: map[string]string{
		"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0", "min_wal_size": "32MB", "max_wal_size": "64MB",
		"track_commit_timestamp": "on",
	}})
	d := newDB(t, pg, 3)
	pool := d.outbox.Pool()
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--on-slot-lost=recover", "--status-interval=200ms", "--leader-retry-interval=200ms"}
	a := d.startRelay(brokers, args...)
	a.waitSessions(1, 90*time.Second)
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "before"}); err != nil {
		t.Fatal(err)
	}
	deliver(t, brokers, d.outbox.Written(), time.Minute, a)
	a.Terminate()
	if _, ok := a.Wait(time.Minute); !ok {
		t.Fatal("the relay did not stop")
	}

	// A gap large enough that publishing it takes a while: large events.
	for i := range 200 {
		specs := make([]harness.Spec, 20)
		for j := range specs {
			specs[j] = harness.Spec{AggregateType: d.types[j%len(d.types)], AggregateID: fmt.Sprintf("gap-%d", j%11), PadBytes: 16 << 10}
		}
		if err := d.outbox.WriteTx(ctx, specs...); err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
	}
	loseSlot(t, d, "wal_removed")

	leader := d.startRelay(brokers, args...)
	if !leader.WaitFor(ctx, "recovering a lost slot's gap from the outbox table", 2*time.Minute) {
		t.Fatalf("the relay did not begin the recovery:\n%s", leader.Output())
	}
	standby := d.startRelay(brokers, args...)
	leader.Kill()
	var underWay *time.Time
	if err := pool.QueryRow(ctx, "SELECT recovery_since FROM outbox_relay_slots WHERE slot = $1", d.slot).Scan(&underWay); err != nil {
		t.Fatal(err)
	}
	if underWay == nil {
		t.Fatalf("the recovery completed before the kill; the test needs a larger gap:\n%s", leader.Output())
	}
	if !standby.WaitFor(ctx, "recovered the lost slot's gap", 2*time.Minute) {
		t.Fatalf("the standby did not finish the recovery:\n%s", standby.Output())
	}
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "after"}); err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, brokers, d.outbox.Written(), 2*time.Minute, standby)
	if rep.Missing != 0 || rep.OrderViolations != 0 {
		t.Fatalf("after the takeover: %s", rep)
	}
	if !strings.Contains(standby.Output(), "a recovery of the lost slot's gap was under way and did not complete") {
		t.Errorf("the standby did not say it began an interrupted recovery again:\n%s", standby.Output())
	}
	t.Logf("%d events, %d duplicates", rep.Expected, rep.Duplicates)
}

// deliveries counts how often each written event arrived (read_uncommitted: every copy).
func deliveries(t *testing.T, brokers string, written []harness.Written) map[string]int {
	t.Helper()
	counts := make(map[string]int)
	for _, rec := range readAll(t, brokers, written) {
		counts[rec.Header("id")]++
	}
	return counts
}

// TestALostSlotOfAMessagesOutboxStopsTheRelay: logical decoding messages are stored nowhere but
// the WAL, so with on_slot_lost: recover a lost slot of a messages-only outbox cannot be
// recovered: the relay must stop saying so, and not replace the slot (which would skip the gap).
func TestALostSlotOfAMessagesOutboxStopsTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t, devenv.PostgresOptions{Settings: map[string]string{
		"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0", "min_wal_size": "32MB", "max_wal_size": "64MB",
	}})
	d := newMessagesDB(t, pg, 1, 1)
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--on-slot-lost=recover", "--status-interval=200ms"}
	r := d.startRelay(brokers, args...)
	r.waitSessions(1, 90*time.Second)
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "before"}); err != nil {
		t.Fatal(err)
	}
	deliver(t, brokers, d.outbox.Written(), time.Minute, r)
	r.Terminate()
	if _, ok := r.Wait(time.Minute); !ok {
		t.Fatal("the relay did not stop")
	}
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "gap"}); err != nil {
		t.Fatal(err)
	}
	loseSlot(t, d, "wal_removed")

	r2 := d.startRelay(brokers, args...)
	code, ok := r2.Wait(time.Minute)
	if !ok {
		t.Fatal("the relay kept running on a lost slot of a messages outbox")
	}
	lines := strings.Split(strings.TrimSpace(r2.Output()), "\n")
	last := lines[len(lines)-1]
	t.Logf("exit %d: %s", code, last)
	for _, want := range []string{d.slot, "lost", "stored nowhere but the WAL", "cannot be recovered"} {
		if code == 0 || !strings.Contains(last, want) {
			t.Errorf("exit %d; want a non-zero exit and a last line that says %q: %s", code, want, last)
		}
	}
	if strings.Contains(r2.Output(), "created replication slot") {
		t.Error("the relay replaced the slot of a messages outbox")
	}
}

// TestASlotDroppedUnderARunningRelayIsRecoveredWhileWritersGoOn: with on_slot_lost: recover, the
// slot is dropped under a streaming relay while writers keep committing. The relay must notice,
// replace the slot and publish the gap from the table without a restart: every event committed
// before, during and after the swap arrives, in per-aggregate order.
func TestASlotDroppedUnderARunningRelayIsRecoveredWhileWritersGoOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDB(t, testenv.SharedPostgres(t), 3)
	pool := d.outbox.Pool()
	brokers := testenv.SharedKafka(t).Brokers()
	r := d.startRelay(brokers, "--on-slot-lost=recover", "--slot-recovery-margin=5s", "--status-interval=200ms")
	r.waitSessions(1, 90*time.Second)

	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			spec := harness.Spec{AggregateType: d.types[i%len(d.types)], AggregateID: fmt.Sprintf("w-%d", i%13)}
			if err := d.outbox.WriteTx(ctx, spec, spec); err != nil {
				done <- err
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	d.outbox.AwaitMore(t, 500, "before the slot is dropped")
	dropActiveSlot(ctx, t, pool, d.slot)
	if !r.WaitFor(ctx, "recovered the lost slot's gap", time.Minute) {
		t.Fatalf("the relay did not recover the dropped slot:\n%s", r.Output())
	}
	d.outbox.AwaitMore(t, 500, "after the recovery")
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, brokers, d.outbox.Written(), 2*time.Minute, r)
	if rep.Missing != 0 || rep.OrderViolations != 0 {
		t.Fatalf("after the slot was replaced: %s", rep)
	}
	if r.Exited() {
		t.Fatalf("the relay exited:\n%s", r.Output())
	}
	t.Logf("%d events, %d duplicates", rep.Expected, rep.Duplicates)
}

// TestAPromotionWithoutTheSlotIsRecoveredByTheRunningRelay: a PostgreSQL 16 primary (no failover
// slots) dies under load and its standby is promoted; the relay, with a multi-host pg_dsn and
// on_slot_lost: recover, finds the slot missing on the new primary, replaces it and publishes the
// gap from the table without a restart. Nothing committed on the surviving timeline is missing,
// per-aggregate order holds.
func TestAPromotionWithoutTheSlotIsRecoveredByTheRunningRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.SharedKafka(t).Brokers()
	phase := phases(t)
	c := newCluster(t, "16", false)
	phase("primary and standby running")
	dsn := c.dsn(true)
	r, ob, load := c.run(brokers, dsn, 73, "--on-slot-lost=recover", "--slot-recovery-margin=10s")
	ob.AwaitMore(t, 180, "before the primary dies")
	c.waitStandbyCaughtUp()
	if err := c.primary.Kill(); err != nil {
		t.Fatal(err)
	}
	c.promote()
	phase("standby promoted")
	if !r.WaitFor(ctx, "recovered the lost slot's gap", 2*time.Minute) {
		t.Fatalf("the running relay did not recover the slot on the promoted standby:\n%s", r.Output())
	}
	phase("gap recovered")
	ob.AwaitMore(t, 120, "after the recovery")
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	surviving := c.surviving()
	// What the writers saw committed and the new primary has: the surviving timeline's events
	// (a commit the standby had not received when the primary died is lost with it).
	var want []harness.Written
	for _, w := range ob.Written() {
		if surviving[w.ID] {
			want = append(want, w)
		}
	}
	rep := deliver(t, brokers, want, 2*time.Minute, r)
	if rep.Missing != 0 || rep.OrderViolations != 0 {
		t.Fatalf("after the promotion: %s", rep)
	}
	if r.Exited() {
		t.Fatalf("the relay exited:\n%s", r.Output())
	}
	phase("delivery checked")
	t.Logf("load: %s; %d of %d written events survive; Kafka: %s", stats, len(want), len(ob.Written()), rep)
}

// TestAPartlyPrunedGapStopsTheRelay: rows of a lost slot's gap were deleted by a pruning that did
// not keep them (one from before the ledger's guard, which recorded how far it went). With
// on_slot_lost: recover the relay must stop saying the gap cannot be recovered whole, publish
// nothing of what is left of it, and stop again at the next start rather than skip the gap with
// the slot it replaced.
func TestAPartlyPrunedGapStopsTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t, devenv.PostgresOptions{Settings: map[string]string{
		"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0", "min_wal_size": "32MB", "max_wal_size": "64MB",
	}})
	d := newDB(t, pg, 1)
	pool := d.outbox.Pool()
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--on-slot-lost=recover", "--slot-recovery-margin=1s", "--status-interval=200ms"}
	r := d.startRelay(brokers, args...)
	r.waitSessions(1, 90*time.Second)
	write := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			spec := harness.Spec{AggregateType: d.types[0], AggregateID: fmt.Sprintf("%s-%d", prefix, i%5)}
			if err := d.outbox.WriteTx(ctx, spec); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("before", 10)
	deliver(t, brokers, d.outbox.Written(), time.Minute, r)
	r.Terminate()
	if code, ok := r.Wait(time.Minute); !ok || code != 0 {
		t.Fatalf("the relay did not stop cleanly (exit %d, exited %v):\n%s", code, ok, r.Output())
	}
	acknowledged := len(d.outbox.Written())
	await.Window(t, 3*time.Second, "the gap's rows are created after the acknowledged commit and its margin")
	write("gap", 30)
	gap := d.outbox.Written()[acknowledged:]

	// The pruning of an unguarded version: the gap's first 10 rows deleted, and recorded.
	var through time.Time
	if err := pool.QueryRow(ctx, `WITH gone AS (
		DELETE FROM outbox_events WHERE id IN (SELECT id FROM outbox_events WHERE aggregate_id LIKE 'gap-%' ORDER BY created_at, id LIMIT 10) RETURNING created_at)
		SELECT max(created_at) FROM gone`).Scan(&through); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE outbox_relay_slots SET pruned_through = $2 WHERE slot = $1", d.slot, through.Add(time.Microsecond)); err != nil {
		t.Fatal(err)
	}
	loseSlot(t, d, "wal_removed")

	for start := 1; start <= 2; start++ {
		r2 := d.startRelay(brokers, args...)
		code, ok := r2.Wait(time.Minute)
		if !ok {
			t.Fatalf("start %d: the relay kept running on a lost slot whose gap was partly pruned:\n%s", start, r2.Output())
		}
		lines := strings.Split(strings.TrimSpace(r2.Output()), "\n")
		last := lines[len(lines)-1]
		t.Logf("start %d: exit %d: %s", start, code, last)
		for _, want := range []string{d.slot, "cannot be recovered whole", "20 rows of the gap are left", "Nothing of the gap was published"} {
			if code == 0 || !strings.Contains(last, want) {
				t.Errorf("start %d: exit %d; want a non-zero exit and a last line that says %q: %s", start, code, want, last)
			}
		}
	}
	// Nothing of the partial gap reached Kafka (what was acknowledged before stays, once or more).
	counts := deliveries(t, brokers, d.outbox.Written())
	for _, w := range gap {
		if counts[w.ID] != 0 {
			t.Errorf("event %s of the partly pruned gap was published %d times", w.ID, counts[w.ID])
		}
	}
}

// slowGap stops a streaming relay on a new database of the shared cluster, writes a gap that takes
// seconds to publish at Kafka's pace (1500 events of 16 KiB, more than the sockets between
// PostgreSQL and the relay hold, so the server's statement lasts as long as Kafka takes to
// acknowledge most of them with args' small in-flight window) and drops the slot. It returns
// how many events Kafka acknowledged before the gap.
func slowGap(t *testing.T, args []string) (d *db, acknowledged int) {
	t.Helper()
	ctx := context.Background()
	d = newDB(t, testenv.SharedPostgres(t), 3)
	brokers := testenv.SharedKafka(t).Brokers()
	startStreamingThenStop(t, d, brokers, args, func() {
		if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "before"}); err != nil {
			t.Fatal(err)
		}
	})
	acknowledged = len(d.outbox.Written())
	for i := range 75 {
		specs := make([]harness.Spec, 20)
		for j := range specs {
			specs[j] = harness.Spec{AggregateType: d.types[j%len(d.types)], AggregateID: fmt.Sprintf("gap-%d", j%11), PadBytes: 16 << 10}
		}
		if err := d.outbox.WriteTx(ctx, specs...); err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
	}
	if _, err := d.outbox.Pool().Exec(ctx, "SELECT pg_drop_replication_slot($1)", d.slot); err != nil {
		t.Fatal(err)
	}
	return d, acknowledged
}

// TestARecoveryOutlastsTheRelayRolesStatementTimeout: the relay's role has statement_timeout =
// 1s, and the lost slot's gap takes longer than that to read at Kafka's pace (large events, a
// small in-flight window). The recovery's read must not be cancelled and begun again for ever: it
// completes once (one recovery begun, slot_recoveries_total 1, the ledger records it ended), every
// event arrives in per-aggregate order, and only what Kafka acknowledged before the loss may come
// twice.
func TestARecoveryOutlastsTheRelayRolesStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--on-slot-lost=recover", "--slot-recovery-margin=1s", "--status-interval=200ms", "--max-in-flight-events=4"}
	d, acknowledged := slowGap(t, args)
	pool := d.outbox.Pool()
	// The role's setting in this database only: the shared cluster's other tests keep theirs.
	if _, err := pool.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER ROLE %I IN DATABASE %I SET statement_timeout = %L', current_user, current_database(), '1s'); END $$`); err != nil {
		t.Fatal(err)
	}

	r2 := d.startRelay(brokers, args...)
	await.True(t, 2*time.Minute, "the recovery to complete, or the role's statement_timeout to cancel it", func() bool {
		out := r2.Output()
		return strings.Contains(out, "recovered the lost slot's gap") || strings.Contains(out, "statement timeout") || r2.Exited()
	})
	out := r2.Output()
	if !strings.Contains(out, "recovered the lost slot's gap") {
		t.Fatalf("the relay did not complete the recovery:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		var rec struct {
			Msg  string  `json:"msg"`
			Took float64 `json:"took"` // seconds
		}
		if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec.Msg, "recovered the lost slot's gap") && rec.Took <= 1 {
			t.Fatalf("the gap was published in %.1fs, within the role's statement_timeout: the test needs a larger gap to prove anything", rec.Took)
		}
	}
	if n := strings.Count(out, "recovering a lost slot's gap from the outbox table"); n != 1 {
		t.Errorf("the recovery was begun %d times, want once:\n%s", n, out)
	}
	if strings.Contains(out, "statement timeout") {
		t.Errorf("the role's statement_timeout cancelled the recovery's read:\n%s", out)
	}
	if n := r2.mustMetric("slot_recoveries_total", ""); n != 1 {
		t.Errorf("slot_recoveries_total = %v, want 1", n)
	}
	var underWay *time.Time
	var recovered int64
	if err := pool.QueryRow(ctx, "SELECT recovery_since, recovered_events FROM outbox_relay_slots WHERE slot = $1", d.slot).Scan(&underWay, &recovered); err != nil {
		t.Fatal(err)
	}
	if underWay != nil || recovered < 1500 {
		t.Errorf("the ledger records a recovery under way since %v with %d events recovered; want it ended, with at least the gap's 1500", underWay, recovered)
	}
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "after"}); err != nil {
		t.Fatal(err)
	}
	written := d.outbox.Written()
	rep := deliver(t, brokers, written, 2*time.Minute, r2)
	if rep.Missing != 0 || rep.OrderViolations != 0 {
		t.Fatalf("after the recovery: %s", rep)
	}
	counts := deliveries(t, brokers, written)
	for _, w := range written[acknowledged:] {
		if counts[w.ID] > 1 {
			t.Errorf("event %s of the gap or after it arrived %d times: the gap was published more than once", w.ID, counts[w.ID])
		}
	}
	t.Logf("%d events, %d duplicates", rep.Expected, rep.Duplicates)
}

// TestARecoveryCancelledAgainAndAgainStopsTheRelay: something outside the relay (here a watchdog
// calling pg_cancel_backend) cancels every read of the lost slot's gap. Each session would drop the
// replacement slot and publish the gap again from its start, for ever; after three cancellations
// in a row the relay must stop with a line naming the cause, the recovery left under way in the
// ledger for the next start.
func TestARecoveryCancelledAgainAndAgainStopsTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--on-slot-lost=recover", "--slot-recovery-margin=1s", "--status-interval=200ms", "--max-in-flight-events=4"}
	d, _ := slowGap(t, args)
	pool := d.outbox.Pool()

	watchdog, stop := context.WithCancel(ctx)
	defer stop()
	cancelled := make(chan int, 1)
	go func() {
		n := 0
		defer func() { cancelled <- n }()
		for watchdog.Err() == nil {
			var c int
			err := pool.QueryRow(watchdog, `SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
				AND query LIKE '%FROM "public"."outbox_events" WHERE true%'`).Scan(&c)
			if err == nil {
				n += c
			}
			time.Sleep(50 * time.Millisecond) // the watchdog's own pace
		}
	}()

	r := d.startRelay(brokers, args...)
	code, ok := r.Wait(2 * time.Minute)
	stop()
	if !ok {
		t.Fatalf("the relay kept recovering a gap whose read is cancelled every time:\n%s", r.Output())
	}
	t.Logf("the watchdog cancelled %d reads", <-cancelled)
	lines := strings.Split(strings.TrimSpace(r.Output()), "\n")
	last := lines[len(lines)-1]
	t.Logf("exit %d: %s", code, last)
	for _, want := range []string{"recover the gap of lost slot", d.slot, "cancelled the read of the lost slot's gap from the outbox table 3 times in a row", "canceling statement due to user request"} {
		if code == 0 || !strings.Contains(last, want) {
			t.Errorf("exit %d; want a non-zero exit and a last line that says %q: %s", code, want, last)
		}
	}
	if n := strings.Count(r.Output(), "recovering a lost slot's gap from the outbox table"); n != 3 {
		t.Errorf("the recovery was begun %d times, want 3", n)
	}
	var underWay *time.Time
	if err := pool.QueryRow(ctx, "SELECT recovery_since FROM outbox_relay_slots WHERE slot = $1", d.slot).Scan(&underWay); err != nil {
		t.Fatal(err)
	}
	if underWay == nil {
		t.Error("the ledger no longer records the recovery under way: the next start would not publish the gap")
	}
}

// TestALostSlotsGapIsBoundedByWhatPostgreSQLRecorded: without track_commit_timestamp and without
// slot_recovery_margin, on a server whose idle_in_transaction_session_timeout is 2 s (which says
// nothing of a transaction that runs statements, waits on a lock, or is prepared), on PostgreSQL
// 16 and 18 (each its own cluster: prepared transactions need max_prepared_transactions):
//   - three transactions write an event each and stay open across the last acknowledged commit C
//     (one running statements, one waiting on a lock, one prepared), commit while no relay runs,
//     and the slot is dropped: pruning with a margin shorter than they ran must keep their rows,
//     and the recovery must publish all three (the horizon recorded with C bounds the gap, not a
//     timeout), and warn, before publishing, about acknowledged rows that were rewritten since (an
//     UPDATE gives them a new transaction id) and come again;
//   - a ledger that records neither an acknowledged commit nor a horizon (written by an older
//     version, its row's creation time rewritten later) bounds nothing: the relay must stop saying
//     so, at every start, and publish nothing of the gap.
func TestALostSlotsGapIsBoundedByWhatPostgreSQLRecorded(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"16", "18"} {
		t.Run("PostgreSQL"+version, func(t *testing.T) {
			t.Parallel()
			pg := testenv.Postgres(t, devenv.PostgresOptions{Version: version, Settings: map[string]string{
				"max_prepared_transactions":           "4",
				"idle_in_transaction_session_timeout": "2s",
			}})
			t.Run("TransactionsOpenAcrossTheLastAcknowledgedCommitArePublished", func(t *testing.T) {
				t.Parallel()
				testOpenAcrossTheAcknowledgedCommit(t, pg)
			})
			t.Run("ALedgerThatBoundsNothingStopsTheRelay", func(t *testing.T) {
				t.Parallel()
				testALedgerThatBoundsNothing(t, pg)
			})
		})
	}
}

// startStreamingThenStop runs a relay until it has delivered what d has written, then stops it
// cleanly (its last act records the acknowledged point in the ledger). Under exactly-once, what
// it delivered is read as a read_committed consumer does (a transaction's commit marker is no
// event).
func startStreamingThenStop(t *testing.T, d *db, brokers string, args []string, during func()) {
	t.Helper()
	r := d.startRelay(brokers, args...)
	r.waitSessions(1, 90*time.Second)
	during()
	check := deliver
	if slices.Contains(args, "--delivery=exactly-once") {
		check = deliverCommitted
	}
	check(t, brokers, d.outbox.Written(), time.Minute, r)
	r.Terminate()
	if code, ok := r.Wait(time.Minute); !ok || code != 0 {
		t.Fatalf("the relay did not stop cleanly (exit %d, exited %v):\n%s", code, ok, r.Output())
	}
}

// dropInactiveSlot drops d's slot once no walsender uses it.
func dropInactiveSlot(t *testing.T, d *db) {
	t.Helper()
	await.True(t, 30*time.Second, "the stopped relay's slot to be dropped", func() bool {
		_, err := d.outbox.Pool().Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", d.slot)
		return err == nil
	})
}

func testOpenAcrossTheAcknowledgedCommit(t *testing.T, pg *devenv.Postgres) {
	ctx := context.Background()
	d := newDB(t, pg, 1)
	pool := d.outbox.Pool()
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--on-slot-lost=recover", "--status-interval=200ms"}
	spec := func(id string) harness.Spec { return harness.Spec{AggregateType: d.types[0], AggregateID: id} }
	connect := func() *pgx.Conn {
		t.Helper()
		conn, err := pgx.Connect(ctx, d.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE released (at timestamptz)"); err != nil {
		t.Fatal(err)
	}
	holder := connect()
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(38)"); err != nil {
		t.Fatal(err)
	}
	gid := d.slot + "_prepared"
	t.Cleanup(func() { pool.Exec(context.Background(), "ROLLBACK PREPARED '"+gid+"'") })

	type open struct {
		tx     pgx.Tx
		commit func()
		done   chan error // the statement the transaction runs across C
	}
	var running, waiting open
	var prepared func()
	startStreamingThenStop(t, d, brokers, args, func() {
		if err := d.outbox.WriteTx(ctx, spec("before"), spec("before")); err != nil {
			t.Fatal(err)
		}
		begin := func(id, statement string) open {
			t.Helper()
			tx, err := connect().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			o := open{tx: tx, done: make(chan error, 1)}
			if o.commit, err = d.outbox.WriteIn(ctx, tx, spec(id)); err != nil {
				t.Fatal(err)
			}
			go func() {
				_, err := tx.Exec(ctx, statement)
				o.done <- err
			}()
			return o
		}
		// Never idle in transaction: it runs statements until released.
		running = begin("running", "DO $$ BEGIN WHILE NOT EXISTS (SELECT FROM released) LOOP PERFORM pg_sleep(0.05); END LOOP; END $$")
		waiting = begin("waiting", "SELECT pg_advisory_xact_lock(38)")
		tx, err := connect().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if prepared, err = d.outbox.WriteIn(ctx, tx, spec("prepared")); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "PREPARE TRANSACTION '"+gid+"'"); err != nil {
			t.Fatal(err)
		}
		// Longer than idle_in_transaction_session_timeout (2 s), which the relay took for the
		// longest transaction: the three were created further than that before C, by the server's
		// clock. The prepared one began last, and before its PREPARE.
		await.True(t, 30*time.Second, "the open transactions to be older than idle_in_transaction_session_timeout", func() bool {
			var old bool
			err := pool.QueryRow(ctx, "SELECT now() - prepared > current_setting('idle_in_transaction_session_timeout')::interval FROM pg_prepared_xacts WHERE gid = $1", gid).Scan(&old)
			return err == nil && old
		})
		if err := d.outbox.WriteTx(ctx, spec("acknowledged")); err != nil {
			t.Fatal(err)
		}
	})

	code, out := relayproc.Run(t, relayproc.Options{Subcommand: "status", Args: []string{"--slot=" + d.slot},
		Env: map[string]string{"OUTBOX_PG_DSN": d.dsn}}, time.Minute)
	if !strings.Contains(out, "Kafka holds the events of every transaction below id") {
		t.Errorf("status (exit %d) does not show the horizon recorded with the acknowledged commit:\n%s", code, out)
	}

	// C is behind the relay. The three commit, and rows Kafka holds are rewritten.
	if _, err := pool.Exec(ctx, "INSERT INTO released VALUES (now())"); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(38)"); err != nil {
		t.Fatal(err)
	}
	for _, o := range []open{running, waiting} {
		if err := <-o.done; err != nil {
			t.Fatalf("a transaction open across C: %v", err)
		}
		if err := o.tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		o.commit()
	}
	if _, err := pool.Exec(ctx, "COMMIT PREPARED '"+gid+"'"); err != nil {
		t.Fatal(err)
	}
	prepared()
	tag, err := pool.Exec(ctx, "UPDATE outbox_events SET created_at = created_at - interval '2 hours' WHERE aggregate_id = 'before'")
	if err != nil || tag.RowsAffected() != 2 {
		t.Fatalf("rewrite the acknowledged rows: %v (%d rows)", err, tag.RowsAffected())
	}
	if err := d.outbox.WriteTx(ctx, spec("gap")); err != nil {
		t.Fatal(err)
	}
	// Pruning with a margin shorter than the three ran: the horizon keeps their rows.
	code, out = relayproc.Run(t, relayproc.Options{Subcommand: "prune",
		Args: []string{"--older-than=0s", "--slot=" + d.slot, "--on-slot-lost=recover", "--slot-recovery-margin=1s"},
		Env:  map[string]string{"OUTBOX_PG_DSN": d.dsn}}, time.Minute)
	if code != 0 {
		t.Fatalf("outbox-relay prune: exit %d\n%s", code, out)
	}
	var kept int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE aggregate_id IN ('running', 'waiting', 'prepared')").Scan(&kept); err != nil || kept != 3 {
		t.Fatalf("pruning left %d of the 3 rows of transactions open across the acknowledged commit (%v); %s", kept, err, out)
	}
	dropInactiveSlot(t, d)

	r := d.startRelay(brokers, args...)
	if !r.WaitFor(ctx, "recovered the lost slot's gap", 2*time.Minute) {
		t.Fatalf("the relay did not recover the lost slot:\n%s", r.Output())
	}
	rep := deliver(t, brokers, d.outbox.Written(), time.Minute, r)
	if rep.Missing != 0 || rep.OrderViolations != 0 {
		t.Fatalf("after the recovery (the log says it succeeded): %s\n%s", rep, r.Output())
	}
	var rule string
	if err := pool.QueryRow(ctx, "SELECT recovered_rule FROM outbox_relay_slots WHERE slot = $1", d.slot).Scan(&rule); err != nil || rule != "xmin" {
		t.Errorf("the ledger records the recovery's rule %q (%v); want xmin", rule, err)
	}
	var warned string
	for _, line := range strings.Split(r.Output(), "\n") {
		if strings.Contains(line, "rows of the lost slot's gap were created long before the last acknowledged commit") {
			warned = line
		}
	}
	if !strings.Contains(warned, `"rows":2,`) || strings.Index(r.Output(), warned) > strings.Index(r.Output(), "recovering a lost slot's gap") {
		t.Errorf("want a warning, before the gap is published, of the 2 rewritten rows; got %q:\n%s", warned, r.Output())
	}
	t.Logf("%s; %s", rep, warned)
}

func testALedgerThatBoundsNothing(t *testing.T, pg *devenv.Postgres) {
	ctx := context.Background()
	d := newDB(t, pg, 1)
	pool := d.outbox.Pool()
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--on-slot-lost=recover", "--status-interval=200ms"}
	spec := func(id string) harness.Spec { return harness.Spec{AggregateType: d.types[0], AggregateID: id} }
	startStreamingThenStop(t, d, brokers, args, func() {
		if err := d.outbox.WriteTx(ctx, spec("before")); err != nil {
			t.Fatal(err)
		}
	})
	acknowledged := len(d.outbox.Written())
	for range 5 {
		if err := d.outbox.WriteTx(ctx, spec("gap")); err != nil {
			t.Fatal(err)
		}
	}
	// Longer than idle_in_transaction_session_timeout (2 s), before the row's creation time is
	// rewritten: the gap's rows were created further than that before it, by the server's clock.
	await.True(t, 30*time.Second, "the gap's rows to be older than idle_in_transaction_session_timeout", func() bool {
		var old bool
		err := pool.QueryRow(ctx, "SELECT now() - max(created_at) > current_setting('idle_in_transaction_session_timeout')::interval FROM outbox_events").Scan(&old)
		return err == nil && old
	})
	// What a relay from before the recorded commit time and horizon leaves, its row rewritten
	// since (an identity or holder write of an older version sets it to now()).
	forget := "confirmed_commit_time = NULL, confirmed_end_lsn = NULL, created_at = now()"
	var horizon bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM information_schema.columns WHERE table_name = 'outbox_relay_slots' AND column_name = 'confirmed_xmin')").Scan(&horizon); err != nil {
		t.Fatal(err)
	}
	if horizon {
		forget += ", confirmed_xmin = NULL"
	}
	if _, err := pool.Exec(ctx, "UPDATE outbox_relay_slots SET "+forget+" WHERE slot = $1", d.slot); err != nil {
		t.Fatal(err)
	}
	dropInactiveSlot(t, d)

	for start := 1; start <= 2; start++ {
		r := d.startRelay(brokers, args...)
		code, ok := r.Wait(time.Minute)
		if !ok {
			r.Kill()
		}
		lines := strings.Split(strings.TrimSpace(r.Output()), "\n")
		last := lines[len(lines)-1]
		t.Logf("start %d: exit %d: %s", start, code, last)
		for _, want := range []string{d.slot, "nothing PostgreSQL recorded bounds its gap", "Nothing of the gap was published", "slot_recovery_margin", "forget-slot"} {
			if !ok || code == 0 || !strings.Contains(last, want) {
				t.Errorf("start %d: exit %d (exited %v); want a non-zero exit and a last line that says %q:\n%s", start, code, ok, want, r.Output())
				break
			}
		}
	}
	counts := deliveries(t, brokers, d.outbox.Written())
	for _, w := range d.outbox.Written()[acknowledged:] {
		if counts[w.ID] != 0 {
			t.Errorf("event %s of a gap nothing bounds was published %d times", w.ID, counts[w.ID])
		}
	}
}
