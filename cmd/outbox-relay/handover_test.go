package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/netproxy"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// handoverTimeout is the leader_kafka_timeout of TestALeaderCutOffFromKafkaAloneHandsOver: short,
// so that the test is.
const handoverTimeout = 5 * time.Second

// kafkaWithProxiedListeners starts a dedicated broker with one PLAINTEXT listener per name, each
// advertised as a proxy in front of it: a client that bootstraps through a proxy is given that
// proxy for every later connection (metadata, produce), so freezing it cuts that client alone off
// from Kafka. The broker's own PLAINTEXT listener, for the test's consumer, is not proxied.
func kafkaWithProxiedListeners(t *testing.T, names ...string) (*devenv.Kafka, map[string]*netproxy.Proxy) {
	t.Helper()
	port, controller := freePort(t), freePort(t)
	listeners := []string{fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", port), fmt.Sprintf("CONTROLLER://127.0.0.1:%d", controller)}
	advertised := []string{fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", port), fmt.Sprintf("CONTROLLER://127.0.0.1:%d", controller)}
	protocols := []string{"CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"}
	proxies := map[string]*netproxy.Proxy{}
	for _, name := range names {
		lp := freePort(t)
		p := netproxy.New(t, fmt.Sprintf("127.0.0.1:%d", lp))
		proxies[name] = p
		listeners = append(listeners, fmt.Sprintf("%s://127.0.0.1:%d", name, lp))
		advertised = append(advertised, name+"://"+p.Addr)
		protocols = append(protocols, name+":PLAINTEXT")
	}
	k := testenv.Kafka(t, devenv.KafkaOptions{Port: port, ControllerPort: controller, Settings: map[string]string{
		"listeners":                      strings.Join(listeners, ","),
		"advertised.listeners":           strings.Join(advertised, ","),
		"listener.security.protocol.map": strings.Join(protocols, ","),
	}})
	return k, proxies
}

// TestALeaderCutOffFromKafkaAloneHandsOver: two relays on one slot, each reaching the one broker
// through its own proxy. The leader's proxy freezes (no FIN, no RST): after leader_kafka_timeout
// without an acknowledgement while events wait, it releases the lock, and the standby, whose Kafka
// answers, takes over and delivers everything, in order per key. Then the new leader's Kafka is cut
// off too, Kafka is down for everyone: with no standby ready (its Kafka does not answer) the leader
// keeps the lock, and leadership does not change at all.
func TestALeaderCutOffFromKafkaAloneHandsOver(t *testing.T) {
	k, proxies := kafkaWithProxiedListeners(t, "RELAYA", "RELAYB")
	f := newHAFixture(t, testenv.SharedPostgres(t), k.Brokers(), 2)
	ctx := context.Background()
	began := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), what) }
	settings := func(proxy string) map[string]string {
		return map[string]string{"OUTBOX_KAFKA_BROKERS": proxies[proxy].Addr, "OUTBOX_LEADER_KAFKA_TIMEOUT": handoverTimeout.String(),
			"OUTBOX_LEADER_RETRY_INTERVAL": "500ms", "OUTBOX_KAFKA_WRITE_TIMEOUT": "2s"}
	}
	a := f.start("relay-a", settings("RELAYA"))
	f.waitStreamer(t, a, haStartTimeout)
	b := f.start("relay-b", settings("RELAYB"))
	b.waitLog(t, haStartTimeout, "info", "standby: another instance holds the leader lock")
	step("relay-a leads, relay-b stands by")
	w := f.startWriter(ctx, 11)
	f.outbox.AwaitMore(t, 150, "before the freeze")

	proxies["RELAYA"].Freeze()
	frozen := time.Now()
	step("relay-a's Kafka frozen")
	// The handover waits leader_kafka_timeout, then the fence and relay-b's next attempt (500ms)
	// and start; a loaded machine gets room.
	bound := handoverTimeout + 15*time.Second
	f.waitStreamer(t, b, bound)
	step(fmt.Sprintf("relay-b streams, %s after the freeze (bound %s)", time.Since(frozen).Round(time.Millisecond), bound))
	a.waitLog(t, 5*time.Second, "error", "no Kafka acknowledgement")
	f.outbox.AwaitMore(t, 150, "across the takeover")
	w.stop(t)
	rep := f.verify(t, k.Brokers())
	step("everything delivered: " + rep.String())

	// Kafka down for everyone: relay-b is cut off too, relay-a still is; events keep coming (an
	// idle leader waits for nothing, and keeps the lock).
	changes, last := 0, "relay-b"
	w = f.startWriter(ctx, 12)
	defer w.stop(t)
	proxies["RELAYB"].Freeze()
	step("relay-b's Kafka frozen too")
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if app, _ := f.streamer(); app != last {
			changes++
			step(fmt.Sprintf("the slot is streamed by %q", app))
			last = app
		}
		if a.Exited() || b.Exited() {
			t.Fatalf("a relay exited:\nrelay-a:\n%s\nrelay-b:\n%s", a.Output(), b.Output())
		}
	}
	// No standby could do better, so relay-b keeps the lock: handing over would only pause the
	// relay and churn leadership.
	if changes > 0 {
		t.Fatalf("leadership changed %d times in 20s with Kafka down for everyone (now %q): it flaps", changes, last)
	}
	if n := strings.Count(b.Output(), "no Kafka acknowledgement"); n != 0 {
		t.Fatalf("relay-b handed over %d times with no standby able to reach Kafka", n)
	}
	if l := a.findLog("warn", "not trying to take the leader lock"); l == nil {
		t.Error("relay-a, cut off from Kafka, never said it stays out of the election")
	}
}
