package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/netproxy"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// standbySlot is the physical slot the standby streams from the primary.
const standbySlot = "standby1"

// cluster is a primary with one outbox database and a physical streaming standby of it that can be
// promoted. The standby's replication connection (and its slot synchronisation) reaches the
// primary through a proxy, which a test freezes to make the standby miss transactions.
type cluster struct {
	t                *testing.T
	primary, standby *devenv.Postgres
	proxy            *netproxy.Proxy
	d                *db
	database         string
	password         string
}

// newCluster starts a primary of version and a standby set up for failover slots (17+:
// sync_replication_slots, hot_standby_feedback, primary_slot_name, a dbname in primary_conninfo);
// with protect, the primary lists the standby's slot in synchronized_standby_slots.
func newCluster(t *testing.T, version string, protect bool) *cluster {
	t.Helper()
	ctx := context.Background()
	primary := testenv.Postgres(t, devenv.PostgresOptions{Version: version})
	d := newDB(t, primary, 3)
	u, err := url.Parse(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	c := &cluster{t: t, primary: primary, d: d, database: strings.TrimPrefix(u.Path, "/"), password: password}
	if err := primary.Exec(ctx, "postgres", fmt.Sprintf("SELECT pg_create_physical_replication_slot('%s', true)", standbySlot)); err != nil {
		t.Fatal(err)
	}
	c.proxy = netproxy.New(t, fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	settings := map[string]string{
		"primary_conninfo": fmt.Sprintf("host=127.0.0.1 port=%d user=postgres password=%s dbname=postgres application_name=%s",
			freeAddrPort(c.proxy.Addr), password, standbySlot),
		"primary_slot_name":    standbySlot,
		"hot_standby_feedback": "on",
	}
	if version >= "17" {
		settings["sync_replication_slots"] = "on"
	}
	c.standby = testenv.Standby(t, primary, devenv.PostgresOptions{Settings: settings})
	if protect {
		for _, sql := range []string{fmt.Sprintf("ALTER SYSTEM SET synchronized_standby_slots = '%s'", standbySlot), "SELECT pg_reload_conf()"} {
			if err := primary.Exec(ctx, "postgres", sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	await.True(t, time.Minute, "the standby to stream from the primary", func() bool {
		var active bool
		err := c.queryPrimary("SELECT active FROM pg_replication_slots WHERE slot_name = $1", []any{standbySlot}, &active)
		return err == nil && active
	})
	return c
}

// dsn lists both servers, first the one named, and asks for the writable one.
func (c *cluster) dsn(standbyFirst bool) string {
	hosts := []int{c.primary.Port(), c.standby.Port()}
	if standbyFirst {
		slices.Reverse(hosts)
	}
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		c.password, hosts[0], hosts[1], c.database)
}

func (c *cluster) queryPrimary(sql string, args []any, dest ...any) error {
	return c.d.outbox.Pool().QueryRow(context.Background(), sql, args...).Scan(dest...)
}

// queryStandby runs a one-row query on the standby, in the outbox database.
func (c *cluster) queryStandby(sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.standby.DSN(c.database))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// waitStandbyCaughtUp waits until the standby has received the primary's WAL up to now.
func (c *cluster) waitStandbyCaughtUp() {
	c.t.Helper()
	var target string
	if err := c.queryPrimary("SELECT pg_current_wal_lsn()::text", nil, &target); err != nil {
		c.t.Fatal(err)
	}
	await.True(c.t, time.Minute, "the standby to receive the primary's WAL", func() bool {
		var ok bool
		err := c.queryStandby("SELECT pg_last_wal_receive_lsn() >= $1::pg_lsn", []any{target}, &ok)
		return err == nil && ok
	})
}

// run starts the relay with pg_dsn dsn (and args) and, once it streams, writers that commit
// through the same dsn, so that they follow a promotion too.
func (c *cluster) run(brokers, dsn string, seed uint64, args ...string) (*relay, *harness.Outbox, *harness.Load) {
	c.t.Helper()
	r := c.d.startRelay(brokers, append([]string{"--pg-dsn=" + dsn}, args...)...)
	r.waitSessions(1, time.Minute)
	ob, err := harness.NewOutbox(context.Background(), dsn, "public.outbox_events")
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(ob.Close)
	return r, ob, harness.StartLoad(ob, harness.LoadConfig{Types: c.d.types, Writers: 2, Aggregates: 6, MaxPerTx: 3, TxPerSecond: 20, Seed: seed})
}

// phases logs the time since the start of the test with each step it names.
func phases(t *testing.T) func(string) {
	start := time.Now()
	return func(what string) { t.Logf("%5.1fs %s", time.Since(start).Seconds(), what) }
}

// promote promotes the standby the way docs/operations.md tells operators to when the old primary
// may be unreachable rather than gone (its connection silent, as here): PostgreSQL 18.1 finishes a
// promotion only once its slot synchronisation worker has returned from the primary, which a silent
// network never lets it do; terminating the worker lets the promotion go on (on 17 it changes
// nothing).
func (c *cluster) promote() {
	c.t.Helper()
	if err := c.standby.Exec(context.Background(), "postgres", "SELECT pg_promote(false)"); err != nil {
		c.t.Fatal(err)
	}
	await.True(c.t, 2*time.Minute, "the standby to be promoted", func() bool {
		var recovering bool
		err := c.queryStandby(`SELECT pg_is_in_recovery(), count(pg_terminate_backend(pid))
			FROM (SELECT pid FROM pg_stat_activity WHERE backend_type = 'slotsync worker') w`, nil, &recovering, new(int64))
		return err == nil && !recovering
	})
}

// surviving returns the ids of the outbox rows on the promoted standby: the events committed on the
// surviving timeline.
func (c *cluster) surviving() map[string]bool {
	c.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.standby.DSN(c.database))
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id::text FROM outbox_events")
	if err != nil {
		c.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// failoverStatus is what the failover test reads of `outbox-relay status --json`.
type failoverStatus struct {
	Failover struct {
		Failover     bool `json:"failover"`
		StandbySlots []struct {
			Name   string `json:"name"`
			Active bool   `json:"active"`
		} `json:"synchronized_standby_slots"`
	} `json:"failover"`
	Standbys []struct {
		Synced    bool `json:"synced"`
		Temporary bool `json:"temporary"`
	} `json:"standbys"`
	Warnings []string `json:"warnings"`
}

// The failover this project promises on PostgreSQL 17 and later: a failover slot, a standby that
// synchronises it, and a multi-host pg_dsn. Writers commit on the primary; the primary is killed
// (SIGKILL, no shutdown) while the standby has not received the last transactions (its replication
// connection frozen); the standby is promoted and the writers go on there. Every event committed
// on the surviving timeline must arrive, in per-aggregate order.
//
// With synchronized_standby_slots, PostgreSQL sends the relay a transaction only once the standby
// has it, so no event of a transaction the standby never received may reach Kafka. Without it the
// relay may publish such events (they are in Kafka, not in the database): that run asserts only the
// rest and reports what it saw.
func TestFailoverToAStandbyWithTheFailoverSlot(t *testing.T) {
	t.Parallel()
	brokers := testenv.SharedKafka(t).Brokers()
	for _, version := range []string{"17", "18"} {
		for _, protect := range []bool{true, false} {
			name := fmt.Sprintf("PostgreSQL %s, synchronized_standby_slots %s", version, map[bool]string{true: "set", false: "empty"}[protect])
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				failoverScenario(t, brokers, version, protect)
			})
		}
	}
}

func failoverScenario(t *testing.T, brokers, version string, protect bool) {
	ctx := context.Background()
	phase := phases(t)
	c := newCluster(t, version, protect)
	phase("primary and standby running")
	d := c.d
	// The protected run lists the standby first: the relay must pick the primary wherever it is.
	dsn := c.dsn(protect)
	r, ob, load := c.run(brokers, dsn, 71, "--failover=true", "--slot-poll-interval=1s")
	// Aggregates the test writes itself, before the freeze, during it (on the old primary only) and
	// after the promotion: lost events sit between surviving ones in their sequence.
	accounts := func(phase string, n int) {
		t.Helper()
		for i := range n {
			spec := harness.Spec{AggregateType: d.types[i%len(d.types)], AggregateID: fmt.Sprintf("account-%d", i%3), EventType: phase}
			await.True(t, 2*time.Minute, "a write to go through", func() bool { return ob.WriteTx(ctx, spec) == nil })
		}
	}
	accounts("before", 6)

	// The standby's copy of the slot must be ready before the failover means anything.
	status := func() (int, failoverStatus) {
		standbyDSN, password := testenv.SplitPassword(t, c.standby.DSN(c.database))
		code, out := relayproc.Run(t, relayproc.Options{Subcommand: "status", Args: []string{"--json", "--standby-dsn=" + standbyDSN},
			Env: map[string]string{"OUTBOX_PG_DSN": dsn, "OUTBOX_SLOT": d.slot, "OUTBOX_FAILOVER": "true", "GORACE": "atexit_sleep_ms=0", "PGPASSWORD": password}}, 30*time.Second)
		var st failoverStatus
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		return code, st
	}
	var st failoverStatus
	await.True(t, 2*time.Minute, "status to report the standby's copy of the slot ready", func() bool {
		// The copy becomes usable once the slot's restart position passes where the standby
		// reserved WAL for it, which moves at running-transactions records: log one now rather
		// than wait for the background writer's (every 15s).
		if err := c.queryPrimary("SELECT pg_log_standby_snapshot()::text", nil, new(string)); err != nil {
			t.Fatal(err)
		}
		var code int
		code, st = status()
		return code == 0
	})
	phase("the standby's copy of the slot is ready")
	if !st.Failover.Failover || len(st.Standbys) != 1 || !st.Standbys[0].Synced || st.Standbys[0].Temporary {
		t.Fatalf("status = %+v, want a failover slot with a synced, persistent copy on the standby", st)
	}
	if protect != (len(st.Failover.StandbySlots) == 1 && st.Failover.StandbySlots[0].Active) || protect == (len(st.Warnings) > 0) {
		t.Fatalf("status = %+v, want synchronized_standby_slots %v and a warning only without it", st, protect)
	}
	listed := map[bool]float64{true: 1, false: 0}[protect]
	await.True(t, 30*time.Second, "the metrics to show the failover slot", func() bool {
		return r.mustMetric("slot_failover", "") == 1 && r.mustMetric("synchronized_standby_slots", "") == listed &&
			r.mustMetric("synchronized_standby_slots_active", "") == listed
	})

	// The standby misses what comes next: everything before is on it, then its replication
	// connection freezes and the primary commits transactions it never receives.
	load.Pause()
	c.waitStandbyCaughtUp()
	c.proxy.Freeze()
	before := len(ob.Written())
	accounts("lost", 4)
	lost := ob.Written()[before:]
	if protect {
		// PostgreSQL holds them back from the relay: its walsender waits for the standby.
		await.True(t, time.Minute, "the relay's walsender to wait for the standby", func() bool {
			var wait *string
			err := c.queryPrimary(`SELECT a.wait_event FROM pg_stat_activity a JOIN pg_replication_slots s ON a.pid = s.active_pid
				WHERE s.slot_name = $1`, []any{d.slot}, &wait)
			return err == nil && wait != nil && *wait == "WaitForStandbyConfirmation"
		})
	} else {
		// Nothing holds them back: give the relay the time to publish them, and report it.
		cons := harness.NewConsumer(brokers, harness.Topics(lost, nil)...)
		readCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := cons.ReadUntil(readCtx, 0, func(recs []harness.Record) bool { return harness.Verify(lost, recs, nil).Missing == 0 })
		cancel()
		cons.Close()
		t.Logf("without synchronized_standby_slots: %d of %d events the standby never received were published before the failover (read: %v)",
			len(lost)-harness.Verify(lost, cons.Records(), nil).Missing, len(lost), err)
	}

	// Failover: the primary dies without a shutdown, the standby is promoted, the writers go on.
	phase("killing the primary")
	if err := c.primary.Kill(); err != nil {
		t.Fatal(err)
	}
	c.promote()
	phase("standby promoted")
	load.Resume()
	accounts("after", 6)
	r.waitSessions(2, 2*time.Minute)
	phase("the relay streams from the new primary")
	ob.AwaitMore(t, 120, "on the new primary")
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Every event committed on the surviving timeline arrives, in per-aggregate order.
	surviving := c.surviving()
	var expected []harness.Written
	for _, w := range ob.Written() {
		if surviving[w.ID] {
			expected = append(expected, w)
		}
	}
	for _, w := range lost {
		if surviving[w.ID] {
			t.Fatalf("event %s, written while the standby's replication was frozen, is on the promoted standby: the test did not make it miss anything", w.ID)
		}
	}
	if len(expected) != len(surviving) {
		t.Fatalf("the promoted standby has %d outbox rows, the writers know of %d of them", len(surviving), len(expected))
	}
	cons := harness.NewConsumer(brokers, harness.Topics(ob.Written(), nil)...)
	defer cons.Close()
	readCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	readErr := cons.ReadUntil(readCtx, 2*time.Second, func(recs []harness.Record) bool {
		return harness.Verify(expected, recs, nil).Missing == 0
	})
	rep := harness.Verify(expected, cons.Records(), nil)
	phase("delivery checked")
	phantoms := rep.Unknown // records of events the surviving database does not have
	t.Logf("load: %s; surviving events %d, lost %d; Kafka: %s", stats, len(expected), len(lost), rep)
	if readErr != nil || rep.Missing > 0 || rep.OrderViolations > 0 || rep.Mismatches > 0 {
		t.Fatalf("events committed on the surviving timeline were not all delivered in order (read error: %v): %s", readErr, rep)
	}
	if protect && phantoms > 0 {
		t.Fatalf("%d events of transactions the standby never received reached Kafka despite synchronized_standby_slots: %s", phantoms, rep)
	}
	if !protect {
		t.Logf("without synchronized_standby_slots: %d records in Kafka are of events the surviving database does not have", phantoms)
	}

	// The relay said what happened.
	log := relayproc.FindLog(r.Output(), "warn", "PostgreSQL is on another timeline")
	if log == nil || log["old_timeline"] != float64(1) || log["timeline"] != float64(2) || log["system_identifier"] == "" {
		t.Fatalf("the relay did not log the failover with both timelines and the system identifier: %v", log)
	}
	if relayproc.FindLog(r.Output(), "info", "resuming from the failover slot this server kept as a standby") == nil {
		t.Fatal("the relay did not log that it resumed from the synchronised slot")
	}
}

// Before PostgreSQL 17 (and on 17+ without a failover slot) a promoted standby has no copy of the
// logical slot. The relay must not create a new one there by itself: that slot would start after
// the gap, and the events committed between the old slot's last confirmed position and now would
// never be published, without a trace. The running relay stops, a restarted one is refused by the
// slot ledger (which the standby received with the rest of the database), and the documented
// recovery (forget-slot, then one start with backfill_since before the last acknowledgement)
// publishes every event of the surviving timeline, in per-aggregate order.
func TestPromotionWithoutAFailoverSlotIsRefusedAndRecoveredByBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.SharedKafka(t).Brokers()
	phase := phases(t)
	c := newCluster(t, "16", false)
	phase("primary and standby running")
	d := c.d
	dsn := c.dsn(true)
	r, ob, load := c.run(brokers, dsn, 72)

	// Everything written so far reaches Kafka; the recovery's start time is taken after that, as an
	// operator takes it from the last acknowledgement before the incident (less a margin).
	ob.AwaitMore(t, 120, "before the incident")
	load.Pause()
	deliver(t, brokers, ob.Written(), 90*time.Second, r)
	phase("first events delivered")
	since := time.Now().Add(-2 * time.Second).UTC().Truncate(time.Second)
	await.Window(t, time.Second, "the gap is written a whole second after the recovery's start time")
	// More is written, and the primary dies before the relay need have published it: the gap.
	load.Resume()
	ob.AwaitMore(t, 120, "in the gap")
	load.Pause()
	c.waitStandbyCaughtUp()
	if err := c.primary.Kill(); err != nil {
		t.Fatal(err)
	}
	c.promote()
	phase("standby promoted")
	load.Resume()

	noSlot := func(when string) {
		t.Helper()
		var n int
		if err := c.queryStandby("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", []any{d.slot}, &n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("%s: the relay created slot %s on the promoted standby", when, d.slot)
		}
	}
	refused := func(p *relay, when string) {
		t.Helper()
		code, ok := p.Wait(2 * time.Minute)
		if !ok || code == 0 {
			t.Fatalf("%s: the relay did not stop with an error (exited %v, code %d)", when, ok, code)
		}
		out := p.Output()
		for _, want := range []string{"no longer exists", "failover slots from PostgreSQL 17", "backfill_since", "forget-slot"} {
			if !strings.Contains(out, want) {
				t.Fatalf("%s: the relay's error does not say %q:\n%s", when, want, out[max(0, len(out)-3000):])
			}
		}
		noSlot(when)
	}
	refused(r, "the running relay")
	phase("the running relay stopped")
	refused(d.startRelay(brokers, "--pg-dsn="+dsn), "a restarted relay")
	phase("a restarted relay refused")

	// The recovery of docs/operations.md.
	code, out := relayproc.Run(t, relayproc.Options{Subcommand: "forget-slot",
		Env: map[string]string{"OUTBOX_PG_DSN": dsn, "OUTBOX_SLOT": d.slot, "GORACE": "atexit_sleep_ms=0"}}, 30*time.Second)
	if code != 0 || !strings.Contains(out, "forgot lost slot") {
		t.Fatalf("forget-slot exited %d:\n%s", code, out)
	}
	recovered := d.startRelay(brokers, "--pg-dsn="+dsn, "--backfill=true", "--backfill-since="+since.Format(time.RFC3339))
	if _, ok := recovered.waitLog(0, "backfill complete", 2*time.Minute); !ok {
		t.Fatalf("the recovering relay did not complete its backfill:\n%s", recovered.Output())
	}
	phase("backfill complete")
	ob.AwaitMore(t, 120, "after the backfill")
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	surviving := c.surviving()
	if len(surviving) != len(ob.Written()) {
		t.Fatalf("the promoted standby has %d outbox rows, the writers committed %d", len(surviving), len(ob.Written()))
	}
	rep := deliver(t, brokers, ob.Written(), 2*time.Minute, recovered)
	phase("delivery checked")
	t.Cleanup(func() { phase("cleaned up") })
	t.Logf("load: %s; backfill since %s; Kafka: %s", stats, since.Format(time.RFC3339), rep)
}
