package main

// Binary-level tests of exactly-once delivery where the single-leader deployment meets Kafka's
// producer fencing: a zombie leader (paused past its lease while a standby took over) and a
// transactional id shared by mistake.

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// eosEnv is the environment of an exactly-once relay with a quick lease, so a paused leader is
// replaced within seconds (lease = 1s + 2 x 1s + 2s).
func eosEnv(extra map[string]string) map[string]string {
	env := map[string]string{
		"OUTBOX_DELIVERY":              "exactly-once",
		"OUTBOX_LEADER_CHECK_TIMEOUT":  "1s",
		"OUTBOX_LEADER_RETRY_INTERVAL": "300ms",
		"OUTBOX_STATUS_INTERVAL":       "500ms",
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// verifyCommitted is verify with a read_committed consumer: every written event, in order per
// aggregate, and no duplicate.
func (f *haFixture) verifyCommitted(t *testing.T) harness.Report {
	t.Helper()
	written := f.outbox.Written()
	c := harness.NewCommittedConsumer(f.brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), haDeliverTimeout)
	defer cancel()
	err := c.ReadUntil(ctx, 2*time.Second, func(recs []harness.Record) bool {
		return harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() || rep.Duplicates != 0 {
		t.Fatalf("read_committed delivery check failed (read error: %v): %s", err, rep)
	}
	return rep
}

func TestAZombieLeaderIsFencedByKafkaAndWritesNothingAReadCommittedConsumerSees(t *testing.T) {
	t.Parallel()
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	a := f.start("relay-a", eosEnv(nil))
	f.waitStreamer(t, a, haStartTimeout)
	b := f.start("relay-b", eosEnv(nil))
	b.waitLog(t, haStartTimeout, "", "another instance holds the leader lock")
	w := f.startWriter(context.Background(), 7)
	writing := true
	defer func() {
		if writing {
			w.stop(t)
		}
	}()
	waitFor(t, haDeliverTimeout, "relay-a to commit Kafka transactions", func() bool {
		return a.findLog("info", "the first Kafka transaction committed") != nil
	})
	aMetrics := a.metricsAddr(t)
	time.Sleep(500 * time.Millisecond) // events in flight in a's open Kafka transaction

	// The pause: a keeps its sockets, its lock session and its walsender, and answers nothing.
	if err := syscall.Kill(a.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(a.PID(), syscall.SIGCONT)
		}
	}
	defer resume()
	f.waitStreamer(t, b, time.Minute)
	b.waitLog(t, time.Minute, "info", "transactional producer ready")
	bMetrics := b.metricsAddr(t)
	waitFor(t, haDeliverTimeout, "relay-b to publish", func() bool {
		return sumMetric(scrape(t, bMetrics), "outbox_relay_events_published_total") > 0
	})
	t.Logf("relay-b took over and published %s after relay-a was paused", time.Since(paused).Round(time.Millisecond))

	mark := len(a.Output())
	resume()
	// The zombie wakes up with produce requests and a transaction to commit: Kafka refuses them
	// (its epoch is older than b's), and its lock is gone. It must say so and stand by.
	waitFor(t, time.Minute, "relay-a to notice it was replaced", func() bool {
		out := a.Output()[mark:]
		return strings.Contains(out, "Standing by") || strings.Contains(out, "lost the leader lock connection")
	})
	waitFor(t, time.Minute, "relay-a to stand by", func() bool {
		return strings.Contains(a.Output()[mark:], "another instance holds the leader lock")
	})
	if a.Exited() {
		t.Fatalf("relay-a exited; it must stand by:\n%s", a.Output()[mark:])
	}
	committedBefore := sumMetric(scrape(t, aMetrics), "outbox_relay_kafka_transactions_total", `outcome="committed"`)
	time.Sleep(2 * time.Second)
	if after := sumMetric(scrape(t, aMetrics), "outbox_relay_kafka_transactions_total", `outcome="committed"`); after != committedBefore {
		t.Errorf("relay-a committed %v Kafka transactions after it was replaced", after-committedBefore)
	}
	for _, l := range a.logs()[strings.Count(a.Output()[:mark], "\n"):] {
		if l["level"] == "error" || l["level"] == "warn" {
			t.Logf("relay-a after the pause: %s %v", l["level"], l["msg"])
		}
	}
	if app, _ := f.streamer(); app != "relay-b" {
		t.Fatalf("%q streams the slot after the zombie woke up, want relay-b", app)
	}

	w.stop(t)
	writing = false
	rep := f.verifyCommitted(t)
	t.Logf("read_committed: %s", rep)
	b.stop(t)
	a.stop(t)
}

func TestARelayFencedByKafkaWhileItHoldsItsLockExitsNamingTransactionalID(t *testing.T) {
	t.Parallel()
	pg := testenv.SharedPostgres(t)
	brokers := testenv.SharedKafka(t).Brokers()
	// Two slots configured with one transactional id: a mistake the leader election cannot see.
	shared := map[string]string{"OUTBOX_TRANSACTIONAL_ID": testenv.UniqueName(t, "shared")}
	f1, f2 := newHAFixture(t, pg, brokers, 1), newHAFixture(t, pg, brokers, 1)
	r1 := f1.start("relay-1", eosEnv(shared))
	f1.waitStreamer(t, r1, haStartTimeout)
	w := f1.startWriter(context.Background(), 11)
	defer w.stop(t)
	r1.waitLog(t, haDeliverTimeout, "info", "the first Kafka transaction committed")

	r2 := f2.start("relay-2", eosEnv(shared))
	f2.waitStreamer(t, r2, haStartTimeout)
	code, ok := r1.Wait(time.Minute)
	if !ok || code != 1 {
		t.Fatalf("relay-1: exit status %d (exited: %v), want 1:\n%s", code, ok, r1.Output())
	}
	out := strings.TrimRight(r1.Output(), "\n")
	last := out[strings.LastIndex(out, "\n")+1:]
	for _, want := range []string{"fenced by Kafka", "transactional_id", "still holds the leader lock"} {
		if !strings.Contains(last, want) {
			t.Errorf("relay-1's last line lacks %q: %s", want, last)
		}
	}
	t.Logf("relay-1: %s", last)
	if r2.Exited() {
		t.Fatalf("relay-2 exited:\n%s", r2.Output())
	}
	r2.stop(t)
}
