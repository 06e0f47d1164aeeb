package faults

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// faultBroker is a dedicated Kafka broker that clients reach only through a proxy: the broker
// advertises the proxy's address, so every connection (metadata, produce, fetch) crosses it and
// the test can stop, pause, stall, slow down or cut off the relay's Kafka.
type faultBroker struct {
	k       *devenv.Kafka
	proxy   *proxy
	brokers string // the proxy: what clients are given
}

func newFaultBroker(t *testing.T) *faultBroker {
	t.Helper()
	port, controller := freePort(t), freePort(t)
	p := newProxy(t, "127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", port))
	k := testenv.Kafka(t, devenv.KafkaOptions{Port: port, ControllerPort: controller, Settings: map[string]string{
		"advertised.listeners": fmt.Sprintf("PLAINTEXT://%s,CONTROLLER://127.0.0.1:%d", p.addr, controller),
		// Room for the 10 MB rows of the huge-rows scenario; the others send far smaller records.
		"message.max.bytes": "16777216",
	}})
	return &faultBroker{k: k, proxy: p, brokers: p.addr}
}

// heal undoes whatever a scenario left broken, so the next one starts with a working broker.
func (fb *faultBroker) heal(t *testing.T) {
	t.Helper()
	fb.proxy.Heal(t)
	if fb.k.Running() {
		if err := fb.k.Resume(); err != nil {
			t.Fatal(err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := fb.k.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	return freeAddrPort(freeAddr(t))
}

func freeAddrPort(addr string) int {
	a, _ := net.ResolveTCPAddr("tcp", addr)
	return a.Port
}

// TestBrokerFaults runs the scenarios that break Kafka, one after another on one dedicated broker
// (a broker start costs far more than a scenario).
func TestBrokerFaults(t *testing.T) {
	t.Parallel()
	fb := newFaultBroker(t)
	for _, sc := range []struct {
		name string
		run  func(*testing.T, *faultBroker)
	}{
		{"broker stopped for 20s during load: a running relay keeps the slot behind the first unacknowledged transaction and recovers by itself, a relay restarted meanwhile waits and delivers", testBrokerOutage},
		{"broker connection stalls without a reset: the relay notices within its write timeout and recovers", testStalledBrokerConnection},
		{"a huge transaction (OUTBOX_FAULTS_BIG_TX_ROWS) while the broker is paused, then slow: memory stays bounded and the walsender never times out", testHugeTransactionWithPausedBroker},
		{"rows of 10 MB while the broker is paused, max_in_flight_bytes 8 MiB: the rows read ahead of Kafka are bounded by bytes, RSS stays under its bound", testHugeRowsWithPausedBroker},
		{"slot loses its WAL while the broker is down: the relay exits with an actionable error and never recreates the slot", testSlotLostWhileBrokerDown},
	} {
		fb.heal(t)
		t.Run(sc.name, func(t *testing.T) { sc.run(t, fb) })
	}
}

// testBrokerOutage covers scenarios 2 and 4 with one broker outage (a broker restart costs more
// than the rest of both). Relay A rides the outage out: the slot must stay behind the first
// transaction committed during the outage, and A must recover without a restart. Relay B, on
// another database, is stopped during the outage and started again while the broker is still
// down: it must start, say it waits for Kafka, and deliver once the broker is back. A's outbox
// mixes table rows and logical decoding messages in its transactions (outbox_source both), B's is
// messages only, without a table: the outage costs no more for covering the table-free outbox.
func testBrokerOutage(t *testing.T, fb *faultBroker) {
	const outage = 20 * time.Second
	ctx := context.Background()
	pg := testenv.SharedPostgres(t)
	a, b := newMessagesDB(t, pg, 2, 2), newMessagesDB(t, pg, 2, 1)
	ra := a.startRelay(fb.brokers, false, "--kafka.write-timeout=3s", "--status-interval=200ms")
	rb := b.startRelay(fb.brokers, false, "--shutdown-timeout=2s")
	ra.waitSessions(1, 90*time.Second)
	rb.waitSessions(1, 90*time.Second)
	loadA := harness.StartLoad(a.outbox, harness.LoadConfig{
		Types: a.types, Writers: 2, Aggregates: 10, MaxPerTx: 4, TxPerSecond: 20,
		LargeEvery: 200, LargeBytes: 200 << 10, BigTxEvents: 800, BigTxAfter: 5 * time.Second, Seed: 21,
	})
	loadB := harness.StartLoad(b.outbox, harness.LoadConfig{Types: b.types, Writers: 2, MaxPerTx: 4, TxPerSecond: 20, Seed: 22})
	time.Sleep(2 * time.Second)

	if err := fb.k.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	mark := len(ra.Output())
	// The first transaction written during the outage cannot be acknowledged, so A's slot must not
	// be confirmed past the start of its commit record until the broker is back.
	m := a.writeMarked(harness.Spec{AggregateType: a.types[0], AggregateID: "marker-ü", EventType: "Marker"})

	rb.Terminate()
	if code, ok := rb.Wait(30 * time.Second); !ok {
		t.Fatal("relay B did not stop within 30s of SIGTERM while the broker was down (shutdown_timeout 2s)")
	} else {
		t.Logf("relay B stopped during the outage with exit status %d", code)
	}
	rb2 := b.startRelay(fb.brokers, false)
	if _, ok := rb2.waitLog(0, "kafka unreachable", 30*time.Second); !ok {
		t.Fatal("relay B, restarted while the broker is down, did not log that it waits for Kafka")
	}

	first := confirmedLSN(t, a.outbox.Pool(), a.slot)
	last := first
	for time.Since(stopped) < outage {
		last = confirmedLSN(t, a.outbox.Pool(), a.slot)
		if last > m.CommitStart {
			t.Fatalf("relay A: confirmed_flush_lsn %s passed the unacknowledged transaction committed at %s while the broker was down",
				lsnString(last), lsnString(m.CommitStart))
		}
		if ra.Exited() || rb2.Exited() {
			t.Fatalf("a relay exited during the broker outage (A: %v, B: %v)", ra.Exited(), rb2.Exited())
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("relay A: during the outage confirmed_flush_lsn went from %s to %s; the first unacknowledged commit is at %s",
		lsnString(first), lsnString(last), lsnString(m.CommitStart))
	if !strings.Contains(ra.Output()[mark:], "retrying") {
		t.Error("relay A logged no retry while the broker was down")
	}

	if err := fb.k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	eventually(t, 2*time.Minute, "relay A to publish the outage's backlog", func() bool {
		return confirmedLSN(t, a.outbox.Pool(), a.slot) >= m.CommitEnd
	})
	t.Logf("relay A: backlog confirmed %s after the broker came back", time.Since(restarted).Round(time.Millisecond))
	rb2.waitSessions(1, 2*time.Minute)
	time.Sleep(2 * time.Second) // both keep going

	for _, c := range []struct {
		name string
		d    *db
		load *harness.Load
	}{{"A", a, loadA}, {"B", b, loadB}} {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		stats, err := c.load.Stop(sctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if c.name == "A" && !stats.BigTxWritten {
			t.Fatal("the large transaction was not written")
		}
		rep := deliver(t, fb.brokers, c.d.outbox.Written(), 2*time.Minute, ra, rb2)
		t.Logf("relay %s: load %s; delivery %s", c.name, stats, rep)
		end := currentLSN(t, c.d.outbox.Pool())
		eventually(t, 30*time.Second, "relay "+c.name+"'s slot to be confirmed past the load", func() bool {
			return confirmedLSN(t, c.d.outbox.Pool(), c.d.slot) >= end
		})
	}
	if ra.Exited() || ra.sessions() != 1 {
		t.Fatalf("relay A restarted (exited: %v, streaming sessions: %d); it must recover on its own", ra.Exited(), ra.sessions())
	}
}

// testStalledBrokerConnection: scenario 5. The proxy stops forwarding without closing anything,
// the way a hung broker or a black-holed route behaves; no RST ever arrives.
func testStalledBrokerConnection(t *testing.T, fb *faultBroker) {
	const writeTimeout = 3 * time.Second
	ctx := context.Background()
	d := newDB(t, testenv.SharedPostgres(t), 2)
	r := d.startRelay(fb.brokers, false, "--kafka.write-timeout="+writeTimeout.String(), "--status-interval=200ms")
	r.waitSessions(1, 90*time.Second)
	load := harness.StartLoad(d.outbox, harness.LoadConfig{Types: d.types, Writers: 2, MaxPerTx: 4, TxPerSecond: 30, Seed: 51})
	eventually(t, time.Minute, "events to flow before the stall", func() bool {
		return r.mustMetric("events_published_total", "") > 0
	})

	for _, phase := range []struct {
		name string
		heal func()
	}{
		{"the network comes back", fb.proxy.Resume},
		{"the stalled connections are reset", func() { fb.proxy.Reset(); fb.proxy.Resume() }},
	} {
		mark := len(r.Output())
		fb.proxy.Stall()
		noticed, ok := r.waitLog(mark, "retrying", writeTimeout+10*time.Second)
		if !ok {
			t.Fatalf("%s: the relay did not notice the stalled connection within %s (kafka.write_timeout %s)",
				phase.name, writeTimeout+10*time.Second, writeTimeout)
		}
		time.Sleep(writeTimeout) // stalled across more timeouts and reconnects
		published := r.mustMetric("events_published_total", "")
		stalledAt := currentLSN(t, d.outbox.Pool())
		phase.heal()
		healed := time.Now()
		eventually(t, time.Minute, phase.name+": the relay to publish again", func() bool {
			return r.mustMetric("events_published_total", "") > published &&
				confirmedLSN(t, d.outbox.Pool(), d.slot) >= stalledAt
		})
		t.Logf("%s: stall noticed after %s, recovered %s after healing",
			phase.name, noticed.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	}

	// A stall during the one Kafka request that has no produce timeout of its own: the metadata
	// lookup for a topic the relay has not written to yet. Nothing else is in flight, so only a
	// bounded lookup can notice.
	load.Pause()
	// A first new topic while the network is fine, so the relay's metadata connection is healthy
	// (the resets above broke it) and the next lookup hangs rather than fails.
	before := r.mustMetric("events_published_total", "")
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: testenv.UniqueName(t, "warm"), AggregateID: "w-1"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the event of a first new topic to be published, and nothing in flight", func() bool {
		return r.mustMetric("events_published_total", "") > before && r.mustMetric("in_flight_events", "") == 0
	})
	fresh := testenv.UniqueName(t, "fresh")
	mark := len(r.Output())
	fb.proxy.Stall()
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: fresh, AggregateID: "f-1"}); err != nil {
		t.Fatal(err)
	}
	noticed, ok := r.waitLog(mark, "retrying", writeTimeout+10*time.Second)
	if !ok {
		t.Fatalf("a new topic's metadata lookup: the relay did not notice the stalled connection within %s (kafka.write_timeout %s)",
			writeTimeout+10*time.Second, writeTimeout)
	}
	fb.proxy.Resume()
	load.Resume()
	t.Logf("a new topic's metadata lookup: stall noticed after %s", noticed.Round(time.Millisecond))

	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stats, err := load.Stop(sctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, fb.brokers, d.outbox.Written(), 2*time.Minute, r)
	t.Logf("load: %s; delivery: %s", stats, rep)
	if r.Exited() || r.sessions() != 1 {
		t.Fatalf("the relay restarted (exited: %v, streaming sessions: %d); it must recover on its own", r.Exited(), r.sessions())
	}
}
