package faults

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
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
	fb.start(context.Background(), t)
}

// start starts the stopped broker again and waits until it serves. Its bound is testenv's for a
// broker's first start: with three test packages at once on two cores a restart was seen to take
// over 90 s, its JVM busy but progressing.
func (fb *faultBroker) start(ctx context.Context, t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
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
		{"broker stopped for 20s during load, relays on the newest and oldest supported PostgreSQL versions: a running relay keeps the slot behind the first unacknowledged transaction and recovers by itself, a relay restarted meanwhile waits and delivers", testBrokerOutage},
		{"broker connection stalls without a reset: the relay notices within its write timeout and recovers", testStalledBrokerConnection},
		{"a huge transaction (OUTBOX_FAULTS_BIG_TX_ROWS) while the broker is paused, then slow: memory stays bounded and the walsender never times out", testHugeTransactionWithPausedBroker},
		{"rows of 10 MB while the broker is paused, max_in_flight_bytes 8 MiB: the rows read ahead of Kafka are bounded by bytes, RSS stays under its bound", testHugeRowsWithPausedBroker},
		{"PostgreSQL 14 commits transactions without events as fast as it can while the broker is paused with an event in flight: RSS stays flat, nothing is lost, the slot then moves past them", testEmptyTransactionsWithPausedBroker},
		{"slot loses its WAL while the broker is down: the relay exits with an actionable error and never recreates the slot", testSlotLostWhileBrokerDown},
		{"slot dropped while a new start waits for the broker, on_slot_lost: recover: the relay recovers the gap instead of exiting", testSlotDroppedWhileANewStartWaitsForKafka},
	} {
		fb.heal(t)
		t.Run(sc.name, func(t *testing.T) { sc.run(t, fb) })
	}
}

// testBrokerOutage covers scenarios 2 and 4 with one broker outage (a broker restart costs more
// than the rest of both), on the shared cluster and, for the version matrix, on the oldest
// supported version at the same time: the two ends of the range (PostgreSQL 14 is the one that
// streams every transaction of the database, empty or not); the versions between them add
// minutes of relays and read-backs under -race and nothing a relay does differently. On the shared cluster, A's outbox
// mixes table rows and logical decoding messages in its transactions (outbox_shape both) and B's
// is messages only, without a table: the outage costs no more for covering the table-free outbox.
func testBrokerOutage(t *testing.T, fb *faultBroker) {
	var others []*devenv.Postgres
	if vs := testenv.MatrixVersions(t); len(vs) > 0 {
		others = append(others, testenv.SharedPostgresVersion(t, vs[0])) // PGVersions is oldest first
	}
	brokerOutage(t, fb, testenv.SharedPostgres(t), others...)
}

// outageSide is one cluster's part of a broker outage: relay A and maybe relay B (nil without),
// on databases of their own.
type outageSide struct {
	name                string // "PostgreSQL <major>"
	a, b, c             *db    // c: exactly-once, on pg only
	ra, rb, rb2, rc     *relay
	loadA, loadB, loadC *harness.Load
	m                   marked // A's first transaction during the outage
	mark                int    // length of A's output when the broker stopped
	first, last         uint64 // A's confirmed position when the outage began and last seen during it
}

// brokerOutage stops the broker once for relays on pg and on every cluster of others (the
// version matrix passes one per other version). Relay A rides the outage out: the slot must stay
// behind the first transaction committed during the outage, and A must recover without a restart.
// Relay B, on another database of pg only (what it tests does not depend on the server), is
// stopped during the outage and started again while the broker is still down: it must start, say
// it waits for Kafka, and deliver once the broker is back.
func brokerOutage(t *testing.T, fb *faultBroker, pg *devenv.Postgres, others ...*devenv.Postgres) {
	const outage = 20 * time.Second
	ctx := context.Background()
	var sides []*outageSide
	for i, cluster := range append([]*devenv.Postgres{pg}, others...) {
		var a *db
		if i == 0 {
			a = newMessagesDB(t, pg, 2, 2) // rows and messages mixed
		} else {
			a = newDB(t, cluster, 2)
		}
		sd := &outageSide{name: fmt.Sprintf("PostgreSQL %d", a.major), a: a}
		sd.ra = a.startRelay(fb.brokers, "--kafka.write-timeout=3s", "--status-interval=200ms")
		if i == 0 {
			sd.b = newMessagesDB(t, pg, 2, 1) // messages only
			sd.rb = sd.b.startRelay(fb.brokers, "--shutdown-timeout=2s")
			// Relay C rides the outage out like A, with exactly-once delivery.
			sd.c = newDB(t, pg, 2)
			sd.rc = sd.c.startRelay(fb.brokers, "--kafka.write-timeout=3s", "--status-interval=200ms", "--delivery=exactly-once")
		}
		sides = append(sides, sd)
	}
	for i, sd := range sides {
		seed := uint64(21 + 3*i)
		rate := 20.0
		if i > 0 {
			rate = 10 // the other versions' sides: what they show needs no more, and reading it back is the cost
		}
		sd.ra.waitSessions(1, 90*time.Second)
		sd.loadA = harness.StartLoad(sd.a.outbox, harness.LoadConfig{
			Types: sd.a.types, Writers: 2, Aggregates: 10, MaxPerTx: 4, TxPerSecond: rate,
			LargeEvery: 200, LargeBytes: 200 << 10, BigTxEvents: 800, BigTxAfter: 5 * time.Second, Seed: seed,
		})
		if sd.b != nil {
			sd.rb.waitSessions(1, 90*time.Second)
			sd.loadB = harness.StartLoad(sd.b.outbox, harness.LoadConfig{Types: sd.b.types, Writers: 2, MaxPerTx: 4, TxPerSecond: 20, Seed: seed + 1})
			sd.rc.waitSessions(1, 90*time.Second)
			sd.loadC = harness.StartLoad(sd.c.outbox, harness.LoadConfig{Types: sd.c.types, Writers: 2, MaxPerTx: 4, TxPerSecond: 20, Seed: seed + 2})
		}
	}
	for _, sd := range sides {
		sd.a.outbox.AwaitMore(t, 80, sd.name+": before the outage")
	}

	if err := fb.k.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for _, sd := range sides {
		sd.mark = len(sd.ra.Output())
		// The first transaction written during the outage cannot be acknowledged, so A's slot must
		// not be confirmed past the start of its commit record until the broker is back.
		sd.m = sd.a.writeMarked(harness.Spec{AggregateType: sd.a.types[0], AggregateID: "marker-ü", EventType: "Marker"})
		if sd.b != nil {
			sd.rb.Terminate()
		}
	}
	for _, sd := range sides {
		if sd.b == nil {
			continue
		}
		if code, ok := sd.rb.Wait(30 * time.Second); !ok {
			t.Fatalf("%s: relay B did not stop within 30s of SIGTERM while the broker was down (shutdown_timeout 2s)", sd.name)
		} else {
			t.Logf("%s: relay B stopped during the outage with exit status %d", sd.name, code)
		}
		sd.rb2 = sd.b.startRelay(fb.brokers)
	}
	for _, sd := range sides {
		if sd.b != nil {
			if _, ok := sd.rb2.waitLog(0, "kafka unreachable", 30*time.Second); !ok {
				t.Fatalf("%s: relay B, restarted while the broker is down, did not log that it waits for Kafka", sd.name)
			}
		}
		sd.first = confirmedLSN(t, sd.a.outbox.Pool(), sd.a.slot)
		sd.last = sd.first
	}
	for time.Since(stopped) < outage {
		for _, sd := range sides {
			sd.last = confirmedLSN(t, sd.a.outbox.Pool(), sd.a.slot)
			if sd.last > sd.m.CommitStart {
				t.Fatalf("%s: relay A: confirmed_flush_lsn %s passed the unacknowledged transaction committed at %s while the broker was down",
					sd.name, lsnString(sd.last), lsnString(sd.m.CommitStart))
			}
			if sd.ra.Exited() || (sd.b != nil && (sd.rb2.Exited() || sd.rc.Exited())) {
				t.Fatalf("%s: a relay exited during the broker outage (relay A exited: %v)", sd.name, sd.ra.Exited())
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, sd := range sides {
		t.Logf("%s: relay A: during the outage confirmed_flush_lsn went from %s to %s; the first unacknowledged commit is at %s",
			sd.name, lsnString(sd.first), lsnString(sd.last), lsnString(sd.m.CommitStart))
		if !strings.Contains(sd.ra.Output()[sd.mark:], "retrying") {
			t.Errorf("%s: relay A logged no retry while the broker was down", sd.name)
		}
	}

	fb.start(ctx, t)
	restarted := time.Now()
	for _, sd := range sides {
		await.True(t, 2*time.Minute, sd.name+": relay A to publish the outage's backlog", func() bool {
			return confirmedLSN(t, sd.a.outbox.Pool(), sd.a.slot) >= sd.m.CommitEnd
		})
		t.Logf("%s: relay A: backlog confirmed %s after the broker came back", sd.name, time.Since(restarted).Round(time.Millisecond))
		if sd.b != nil {
			sd.rb2.waitSessions(1, 2*time.Minute)
		}
	}
	for _, sd := range sides {
		sd.a.outbox.AwaitMore(t, 80, sd.name+": after the outage (all keep going)")
	}

	// Every load stops before any delivery check, so no side keeps writing while others are read.
	type check struct {
		side  *outageSide
		name  string
		d     *db
		stats harness.LoadStats
	}
	var checks []check
	for _, sd := range sides {
		for _, c := range []struct {
			name string
			d    *db
			load *harness.Load
		}{{"A", sd.a, sd.loadA}, {"B", sd.b, sd.loadB}, {"C (exactly-once)", sd.c, sd.loadC}} {
			if c.d == nil {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			stats, err := c.load.Stop(sctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "A" && !stats.BigTxWritten {
				t.Fatalf("%s: the large transaction was not written", sd.name)
			}
			checks = append(checks, check{sd, c.name, c.d, stats})
		}
	}
	for _, c := range checks {
		relays := []*relay{c.side.ra}
		if c.side.rb2 != nil {
			relays = append(relays, c.side.rb2)
		}
		var rep harness.Report
		if c.d == c.side.b {
			rep = deliver(t, fb.brokers, c.d.outbox.Written(), 2*time.Minute, relays...)
		} else {
			// A and C ride the outage out: the idempotent producer keeps a request the broker
			// wrote just before it stopped from being written twice, and C's Kafka transaction
			// outlives the outage. A read_committed consumer sees each event once.
			if c.d == c.side.c {
				relays = []*relay{c.side.rc}
			}
			rep = deliverCommitted(t, fb.brokers, c.d.outbox.Written(), 2*time.Minute, relays...)
			if rep.Duplicates != 0 {
				t.Errorf("%s: relay %s: %d duplicates after riding out the broker outage, want 0", c.side.name, c.name, rep.Duplicates)
			}
		}
		t.Logf("%s: relay %s: load %s; delivery %s", c.side.name, c.name, c.stats, rep)
		end := currentLSN(t, c.d.outbox.Pool())
		await.True(t, 30*time.Second, c.side.name+": relay "+c.name+"'s slot to be confirmed past the load", func() bool {
			return confirmedLSN(t, c.d.outbox.Pool(), c.d.slot) >= end
		})
	}
	for _, sd := range sides {
		if sd.ra.Exited() || sd.ra.sessions() != 1 {
			t.Fatalf("%s: relay A restarted (exited: %v, streaming sessions: %d); it must recover on its own", sd.name, sd.ra.Exited(), sd.ra.sessions())
		}
	}
}

// testStalledBrokerConnection: scenario 5. The proxy stops forwarding without closing anything,
// the way a hung broker or a black-holed route behaves; no RST ever arrives.
func testStalledBrokerConnection(t *testing.T, fb *faultBroker) {
	const writeTimeout = 3 * time.Second
	ctx := context.Background()
	d := newDB(t, testenv.SharedPostgres(t), 2)
	r := d.startRelay(fb.brokers, "--kafka.write-timeout="+writeTimeout.String(), "--status-interval=200ms")
	r.waitSessions(1, 90*time.Second)
	load := harness.StartLoad(d.outbox, harness.LoadConfig{Types: d.types, Writers: 2, MaxPerTx: 4, TxPerSecond: 30, Seed: 51})
	await.True(t, time.Minute, "events to flow before the stall", func() bool {
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
		await.Window(t, writeTimeout, "the stall outlasts another write timeout, so the relay times out and reconnects into it again")
		published := r.mustMetric("events_published_total", "")
		stalledAt := currentLSN(t, d.outbox.Pool())
		phase.heal()
		healed := time.Now()
		await.True(t, time.Minute, phase.name+": the relay to publish again", func() bool {
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
	await.True(t, time.Minute, "the event of a first new topic to be published, and nothing in flight", func() bool {
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
