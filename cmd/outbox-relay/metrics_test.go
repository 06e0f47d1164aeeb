package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/leader"
)

// caughtUpLag is the slot lag that counts as caught up: after the last event the relay confirms
// the server's WAL end from keepalives, but PostgreSQL keeps writing small records of its own
// (running-transaction snapshots, the slot's own bookkeeping).
const caughtUpLag = 64 << 10

func TestMetricsAndReadinessOfALeaderAndAStandbyFollowARunAndAPostgresRestart(t *testing.T) {
	// A cluster of its own: the slot lag is WAL of the whole cluster, so other tests' writes on a
	// shared one would keep it from settling; and this test restarts it.
	pg := testenv.Postgres(t)
	f := newHAFixture(t, pg, testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()

	a := f.start("relay-a", nil)
	f.waitStreamer(t, a, haStartTimeout)
	addrA := a.metricsAddr(t)
	b := f.start("relay-b", nil)
	b.waitLog(t, haStartTimeout, "info", "standby: another instance holds the leader lock")
	addrB := b.metricsAddr(t)

	before := scrape(t, addrA)
	const txs, perTx = 40, 5
	for i := range txs {
		specs := make([]harness.Spec, perTx)
		for j := range specs {
			specs[j] = harness.Spec{AggregateType: f.types[(i+j)%len(f.types)], AggregateID: "agg-" + string(rune('a'+j))}
		}
		if err := f.outbox.WriteTx(ctx, specs...); err != nil {
			t.Fatal(err)
		}
	}
	f.verify(t, f.brokers)

	// Counters are updated on acknowledgement and the slot poll runs every 500ms: wait for both.
	var ms map[string]float64
	published := func() float64 {
		var n float64
		for _, typ := range f.types {
			n += sumMetric(ms, "outbox_relay_events_published_total", `topic="`+harness.TopicFor(typ)+`"`)
		}
		return n
	}
	took := await.True(t, 30*time.Second, "published counters reach the events written and the slot lag settles", func() bool {
		ms = scrape(t, addrA)
		return published() == txs*perTx && ms["outbox_relay_slot_lag_bytes"] <= caughtUpLag &&
			ms["outbox_relay_confirmed_lsn"] > before["outbox_relay_confirmed_lsn"]
	})
	t.Logf("leader metrics settled %s after delivery: lag %v bytes, retained %v bytes", took.Round(time.Millisecond),
		ms["outbox_relay_slot_lag_bytes"], ms["outbox_relay_slot_retained_wal_bytes"])

	for _, c := range []struct {
		name string
		got  float64
		ok   func(float64) bool
		want string
	}{
		{"transactions_total", ms["outbox_relay_transactions_total"], eq(txs), "40"},
		{"end_to_end_latency_seconds_count", ms["outbox_relay_end_to_end_latency_seconds_count"], eq(txs * perTx), "200"},
		{"publish_latency_seconds_count", ms["outbox_relay_publish_latency_seconds_count"], eq(txs * perTx), "200"},
		{"events_failed_total", sumMetric(ms, "outbox_relay_events_failed_total"), eq(0), "0"},
		{"in_flight_events", ms["outbox_relay_in_flight_events"], eq(0), "0"},
		{"in_flight_bytes", ms["outbox_relay_in_flight_bytes"], eq(0), "0"},
		{"published_bytes_total", ms["outbox_relay_published_bytes_total"], gt(txs * perTx * 50), "> 10000"},
		{"received_lsn", ms["outbox_relay_received_lsn"], gt(before["outbox_relay_received_lsn"]), "moved"},
		{"confirmed_lsn", ms["outbox_relay_confirmed_lsn"], gt(before["outbox_relay_confirmed_lsn"]), "moved"},
		{"status_updates_total", ms["outbox_relay_status_updates_total"], gt(0), "> 0"},
		{"last_ack_timestamp_seconds", ms["outbox_relay_last_ack_timestamp_seconds"], gt(float64(time.Now().Add(-5 * time.Minute).Unix())), "recent"},
		{"seconds_behind_source", ms["outbox_relay_seconds_behind_source"], eq(0), "0 once caught up"},
		{"leader", ms["outbox_relay_leader"], eq(1), "1"},
		{"ready", ms["outbox_relay_ready"], eq(1), "1"},
		{"halted", ms["outbox_relay_halted"], eq(0), "0"},
		{"slot_exists", ms["outbox_relay_slot_exists"], eq(1), "1"},
		{"slot_active", ms["outbox_relay_slot_active"], eq(1), "1"},
		{`slot_wal_status{status="reserved"}`, ms[`outbox_relay_slot_wal_status{status="reserved"}`], eq(1), "1"},
		{`slot_wal_status{status="lost"}`, ms[`outbox_relay_slot_wal_status{status="lost"}`], eq(0), "0"},
		{"slot_safe_wal_size_bytes", ms["outbox_relay_slot_safe_wal_size_bytes"], eq(-1), "-1 (unlimited)"},
		{"slot_retained_wal_bytes", ms["outbox_relay_slot_retained_wal_bytes"], gt(0), "> 0"},
		{"postgres_up", ms["outbox_relay_postgres_up"], eq(1), "1"},
	} {
		if !c.ok(c.got) {
			t.Errorf("leader %s = %v, want %s", c.name, c.got, c.want)
		}
	}
	if code, body := get(t, addrA, "/readyz"); code != http.StatusOK || !strings.Contains(body, "leader") {
		t.Errorf("leader /readyz = %d %q, want 200", code, body)
	}

	msB := scrape(t, addrB)
	for name, want := range map[string]float64{
		"outbox_relay_leader": 0, "outbox_relay_ready": 1, "outbox_relay_slot_exists": 1, "outbox_relay_slot_active": 1,
		"outbox_relay_postgres_up": 1,
	} {
		if msB[name] != want {
			t.Errorf("standby %s = %v, want %v", name, msB[name], want)
		}
	}
	if n := sumMetric(msB, "outbox_relay_events_published_total"); n != 0 {
		t.Errorf("the standby counts %v published events", n)
	}
	if code, body := get(t, addrB, "/readyz"); code != http.StatusOK || !strings.Contains(body, "standby") {
		t.Errorf("standby /readyz = %d %q, want 200", code, body)
	}
	for _, addr := range []string{addrA, addrB} {
		if code, _ := get(t, addr, "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz on %s = %d", addr, code)
		}
	}

	// PostgreSQL goes away: nobody can stream, so neither instance is ready; both stay alive.
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	took = await.True(t, 15*time.Second, "both /readyz answer 503 while PostgreSQL is down", func() bool {
		ca, _ := get(t, addrA, "/readyz")
		cb, _ := get(t, addrB, "/readyz")
		return ca == http.StatusServiceUnavailable && cb == http.StatusServiceUnavailable
	})
	t.Logf("both unready %s after PostgreSQL stopped", took.Round(time.Millisecond))
	for _, addr := range []string{addrA, addrB} {
		if code, _ := get(t, addr, "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz on %s = %d while PostgreSQL is down", addr, code)
		}
		if ms := scrape(t, addr); ms["outbox_relay_ready"] != 0 || ms["outbox_relay_leader"] != 0 {
			// the ready gauge follows within a second; the leader flag drops with the fence
			await.True(t, 5*time.Second, "ready and leader gauges drop to 0 on "+addr, func() bool {
				ms := scrape(t, addr)
				return ms["outbox_relay_ready"] == 0 && ms["outbox_relay_leader"] == 0
			})
		}
	}

	// Back again: exactly one instance leads, both are ready.
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	took = await.True(t, 60*time.Second, "one leader and both ready after PostgreSQL came back", func() bool {
		ma, mb := scrape(t, addrA), scrape(t, addrB)
		return ma["outbox_relay_leader"]+mb["outbox_relay_leader"] == 1 && ma["outbox_relay_ready"] == 1 && mb["outbox_relay_ready"] == 1
	})
	t.Logf("one leader, both ready %s after PostgreSQL restarted", took.Round(time.Millisecond))
	a.stop(t)
	b.stop(t)
}

func TestReadyzAnswers503WhileTheHaltPolicyHoldsTheRelay(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	// A halted relay never drains, so SIGTERM waits out the shutdown timeout: keep it short.
	r := f.start("relay-halt", map[string]string{"OUTBOX_SHUTDOWN_TIMEOUT": "2s"}, "--on-failure=halt")
	f.waitStreamer(t, r, haStartTimeout)
	addr := r.metricsAddr(t)
	await.True(t, 10*time.Second, "the streaming leader is ready", func() bool {
		code, _ := get(t, addr, "/readyz")
		return code == http.StatusOK
	})

	// A space makes the topic name invalid: the halt policy stops publishing at this event.
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: "not a topic", AggregateID: "x"}); err != nil {
		t.Fatal(err)
	}
	var body string
	took := await.True(t, 30*time.Second, "/readyz answers 503 once halted", func() bool {
		var code int
		code, body = get(t, addr, "/readyz")
		return code == http.StatusServiceUnavailable
	})
	t.Logf("unready %s after the bad event: %q", took.Round(time.Millisecond), body)
	if !strings.Contains(body, "halted") {
		t.Errorf("/readyz body %q does not say halted", body)
	}
	await.True(t, 5*time.Second, "halted and ready gauges", func() bool {
		ms := scrape(t, addr)
		return ms["outbox_relay_halted"] == 1 && ms["outbox_relay_ready"] == 0 && ms["outbox_relay_leader"] == 1 &&
			sumMetric(ms, "outbox_relay_events_failed_total", `reason="invalid_topic"`) == 1
	})
	if code, _ := get(t, addr, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d while halted; the process is alive", code)
	}
	if r.Exited() {
		t.Fatal("the halted relay exited; it must stay up for an operator")
	}
	r.stop(t)
}

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }
func gt(min float64) func(float64) bool  { return func(v float64) bool { return v > min } }

// A leader that loses its lock and stands by reports nothing of its last term: the LSNs it
// received and confirmed, what it had in flight, how far behind it was and whether it waited for
// a topic belong to the term, and a standby showing them (confirmed_lsn frozen, publication
// check age growing) would read as a stuck leader or hide the real one's progress.
func TestALeaderThatLosesItsLockAndStandsByReportsNoneOfItsTermsGauges(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()

	a := f.start("relay-a", nil)
	f.waitStreamer(t, a, haStartTimeout)
	addr := a.metricsAddr(t)
	for i := range 5 {
		if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: fmt.Sprintf("agg-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	f.verify(t, f.brokers)
	await.True(t, 30*time.Second, "the leader reports received and confirmed LSNs", func() bool {
		ms := scrape(t, addr)
		return ms["outbox_relay_received_lsn"] > 0 && ms["outbox_relay_confirmed_lsn"] > 0 && ms["outbox_relay_leader"] == 1
	})

	// The test's own session queues for the lock before the leader's lock session is ended, so
	// PostgreSQL grants it the lock at once and the fenced relay must stand by.
	lockPID := f.lockHolder(t)
	lock, err := f.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		lock.Conn().Close(ctx) // it holds the lock: never back into the pool
		lock.Release()
	}()
	taken := make(chan error, 1)
	go func() {
		_, err := lock.Exec(ctx, "SELECT pg_advisory_lock($1)", leader.Key(f.slot))
		taken <- err
	}()
	await.True(t, 10*time.Second, "the test's session waits for the leader lock", func() bool {
		var waiting bool
		err := f.pool.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&waiting)
		return err == nil && waiting
	})
	if _, err := f.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", lockPID); err != nil {
		t.Fatal(err)
	}
	if err := <-taken; err != nil {
		t.Fatalf("the test's session did not get the leader lock: %v", err)
	}
	a.waitLog(t, haStartTimeout, "error", "lost the leader lock connection; fencing")
	var ms map[string]float64
	await.True(t, 30*time.Second, "the fenced relay stands by", func() bool {
		ms = scrape(t, addr)
		return ms["outbox_relay_leader"] == 0 && ms["outbox_relay_ready"] == 1
	})
	// The fenced relay's run has returned (every goroutine of the term ended) and the next
	// campaign has found the lock held: nothing of the term is left to update a gauge.
	a.waitLog(t, haStartTimeout, "info", "the fenced relay stopped; standing by")
	a.waitLog(t, haStartTimeout, "info", "standby: another instance holds the leader lock")
	ms = scrape(t, addr)
	for _, name := range []string{
		"outbox_relay_received_lsn", "outbox_relay_confirmed_lsn", "outbox_relay_leader", "outbox_relay_in_flight_events",
		"outbox_relay_in_flight_bytes", "outbox_relay_seconds_behind_source", "outbox_relay_halted",
		"outbox_relay_publication_check_age_seconds",
	} {
		if v := ms[name]; v != 0 {
			t.Errorf("standing by after a lost term: %s = %v, want 0 (or no series)", name, v)
		}
	}
	if n := sumMetric(ms, "outbox_relay_topic_unavailable"); n != 0 {
		t.Errorf("standing by after a lost term: outbox_relay_topic_unavailable sums to %v, want 0", n)
	}
	a.stop(t)
}
