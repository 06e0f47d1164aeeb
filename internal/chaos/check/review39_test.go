package check

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// Adversarial review of issue 39's rules: each case is a history the rules judge wrongly today.

// A big transaction's documented wait is "as long as its size takes": legitimateWaits excuses
// everything committed from its start until its last event is delivered, however late that is.
// 100 events that take 30 s to reach Kafka, holding every later commit back for 30 s with the
// servers and both relays there, is a stall the rule cannot see (liveness.go legitimateWaits).
func TestReviewABigTransactionExcusesNoUnboundedStall(t *testing.T) {
	late := map[string]float64{}
	for i := 5; i < 20; i++ {
		late["e"+itoa(i)] = 39.5 // committed from 10 s on, delivered at 39.5 s
	}
	b := live(history.AtLeastOnce, late)
	big := make([]history.Event, bigTxnEvents)
	var ids []string
	for i := range big {
		big[i] = ev("big"+itoa(i), "k9", i)
		ids = append(ids, big[i].ID)
	}
	b.txn("tbig", history.Committed, 9, big...)
	b.publish(39, ids...) // 100 events, 30 s after their commit
	h := b.done(bothConsumers)
	if got := rulesOf(Check(h), RuleUnavailable); len(got) == 0 {
		t.Fatalf("a 30 s stall of every commit behind a 100-event transaction passed the liveness rule (worst stall counted: %v)", Summarize(h).WorstStall)
	}
}

// The exit allowlist matches "replication slot lost: " whatever the mode and whatever happened
// before: a relay that exits with it although no fault of the run lost its slot (no slot-lost,
// slot-invalidated or unsynced failover), in a mode that recovers lost slots, is the very bug
// class issue 39 names (a fatal "slot no longer exists" after a slot creation cut short), and it
// passes (exits.go allowed).
func TestReviewASlotLostExitWithNoFaultThatLosesASlotFailsTheRun(t *testing.T) {
	b := newBuilder(history.ExactlyOnce)
	b.h.Exits = append(b.h.Exits, history.Exit{Relay: "r1", At: at(20), Cause: history.ExitOwn, Code: 1,
		LastError: `outbox-relay: replication slot lost: replication slot "chaos_eo_table" does not exist`})
	if got := rulesOf(Check(b.done(bothConsumers)), RuleExit); len(got) == 0 {
		t.Fatal("a relay that ended of its own accord with a lost slot no fault lost broke no rule")
	}
	// After an unsynced failover (the slot not on the new primary) it is the documented answer.
	b.fault("failover-unsynced", "postgres", 10, 12)
	if got := rulesOf(Check(b.done(bothConsumers)), RuleExit); len(got) != 0 {
		t.Fatalf("a slot-lost exit after an unsynced failover fails the run: %v", got)
	}
}

// A server fault's replay is not sized (its slot position may lag by a checkpoint interval), a
// relay fault's is; explainedBy credits a repeat to the latest fault that explains it. An
// immediate PostgreSQL restart at 5 s replays ten events; the leader is killed at 6 s, and the
// replay (published at 7 s) is charged to the kill and held to its in-flight bound: a false
// alarm on behaviour the docs allow (cause.go checkReplaySizes, check.go explainedBy).
func TestReviewAServerReplayIsNotSizedAsALaterRelayFaults(t *testing.T) {
	b := newBuilder(history.AtLeastOnce)
	b.h.Settings.StatusInterval, b.h.Settings.KafkaWriteTimeout, b.h.Settings.MaxInFlightEvents = 500*time.Millisecond, time.Second, 1
	var ids []string
	for i := 0; i < 10; i++ {
		id := "x" + itoa(i)
		b.txn("t"+id, history.Committed, 3.3, ev(id, "k"+itoa(i), 1))
		b.publish(3.5+0.1*float64(i), id)
		ids = append(ids, id)
	}
	for sec := 0.0; sec < 20; sec += 0.5 {
		b.sample("r1", sec, true, true)
		b.sample("r2", sec, true, false)
	}
	b.fault("pg-restart-immediate", "postgres", 5, 5.5)
	b.fault("kill9", "r1", 6, 6.2)
	b.publish(7, ids...)
	h := b.done(map[string]string{"rc": history.ReadCommitted})
	// Alone, the restart explains the replay: the same history without the kill breaks nothing.
	if vs := rulesOf(Check(h), RuleDuplicate); len(vs) != 0 {
		t.Fatalf("the restart's replay, charged to the kill a second later, is a duplicate violation: %v", vs)
	}
}

// A one-way cut of Kafka (its replies lost) leaves the leader with its lock until
// leader_kafka_timeout, as a full cut of Kafka does: the takeover comes within the whole bound.
// checkWindows excuses the whole bound after cut-kafka and cut-both only; after
// net-oneway-kafka it excuses the lease's takeover (lease + retry + write timeout, 11 s here,
// 13 s in make chaos against a 21 s bound), so a takeover the docs allow is reported as
// unavailable (liveness.go checkWindows).
func TestReviewAOneWayCutOfKafkaExcusesTheTakeoverACutDoes(t *testing.T) {
	for _, kind := range []string{"cut-kafka", "net-oneway-kafka"} {
		t.Run(kind, func(t *testing.T) {
			late := map[string]float64{}
			for i := 6; i < 16; i++ {
				late["e"+itoa(i)] = 33 // committed from 12 s on, delivered 21 s after the fault began
			}
			b := live(history.AtLeastOnce, late)
			b.h.Settings.LeaderKafkaTimeout = 15 * time.Second // make chaos's; the bound is 15 + 1 + 5 = 21 s
			b.fault(kind, "r1", 12, 32)
			if got := rulesOf(Check(b.done(bothConsumers)), RuleUnavailable); len(got) != 0 {
				t.Fatalf("the leader's takeover within the bound after %s is reported: %v", kind, got)
			}
		})
	}
}

// Kafka "away" stretches every replay's lookback over the time the slot stood still. A cut of a
// standby's own path to Kafka (cut-kafka, net-oneway-kafka, cut-heal-open are one relay's faults)
// holds no slot: the leader kept publishing and confirming. Yet it counts as Kafka away for
// everyone (check.go newRun, kafkaAway), and a repeat of an event acknowledged 20 s before the
// leader's kill passes as the kill's replay.
func TestReviewAStandbysCutFromKafkaStretchesNoReplay(t *testing.T) {
	for _, kind := range []string{"", "cut-kafka", "net-oneway-kafka", "cut-heal-open"} {
		t.Run("standby fault "+kind, func(t *testing.T) {
			b := lookback(false) // e1, e2 acknowledged at 10 s; r1 killed at 30 s; e1 again at 31 s
			for sec := 0.0; sec < 40; sec += 0.5 {
				b.sample("r2", sec, true, false)
			}
			if kind != "" {
				b.fault(kind, "r2", 9, 29)
			}
			if got := rulesOf(Check(b.done(map[string]string{"rc": history.ReadCommitted})), RuleDuplicate); len(got) != 1 {
				t.Fatalf("a standby's %s excused a repeat of an event acknowledged 20 s before the leader's kill: %d duplicate violations, want 1", kind, len(got))
			}
		})
	}
}

// A mode's neighbour relay (<mode>-nb) is the one relay streaming the neighbour's slot; a
// follower's fault may land on it (roles counts it among the others). It is not sampled
// (h.Relays holds the mode's own relays), so ledBefore finds it never led while the mode's own
// relays did: its kill explains no replay, and the open Kafka transaction it aborted, which a
// read_uncommitted consumer reads again, is reported as a duplicate (cause.go ledBefore).
func TestReviewAKillOfTheNeighbourRelayExplainsItsReplay(t *testing.T) {
	build := func(target string) *history.History {
		b := newBuilder(history.ExactlyOnce)
		for sec := 0.0; sec < 20; sec += 0.5 {
			b.sample("r1", sec, true, true)
			b.sample("r2", sec, true, false)
		}
		b.h.Txns = append(b.h.Txns, history.Txn{ID: "tnb", Writer: "nbw0", Start: at(1), End: at(1.1), Outcome: history.Committed,
			Events: []history.Event{ev("nb1", "nbk", 1)}, Slot: "nb"})
		b.publish(2, "nb1")
		b.log[len(b.log)-1].Consumer = aborted // in the Kafka transaction the kill aborted
		b.fault("kill9", target, 3, 3)
		b.publish(5, "nb1") // published again by the restarted relay, committed
		return b.done(bothConsumers)
	}
	if got := rulesOf(Check(build("eo-table-nb")), RuleDuplicate); len(got) != 0 {
		t.Fatalf("the neighbour relay's kill explains no replay: %v", got)
	}
	if got := rulesOf(Check(build("r2")), RuleDuplicate); len(got) != 1 {
		t.Fatalf("a standby's kill explains the neighbour's replay: %d duplicate violations, want 1", len(got))
	}
}

// A lost slot's recovery publishes the gap (what Kafka had not acknowledged at the loss) from the
// table, so what committed during the recovery waits for it. But legitimateWaits excuses every
// event committed from gapLookback (3 minutes) before the loss until the recovery's end: a stall
// of 20 s with everything there, before the slot was lost at all, passes because a loss came
// after it (liveness.go legitimateWaits, the recovery's legit.from).
func TestReviewALostSlotExcusesNoStallBeforeTheLoss(t *testing.T) {
	late := map[string]float64{}
	for i := 5; i < 10; i++ {
		late["e"+itoa(i)] = 31 // committed from 10 s on, nothing delivered from 9 s to 31 s
	}
	for _, lose := range []bool{false, true} {
		b := live(history.AtLeastOnce, late)
		if lose {
			b.fault(faultSlotLost, "eo-table", 30, 30.5)
		}
		if got := rulesOf(Check(b.done(bothConsumers)), RuleUnavailable); len(got) == 0 {
			t.Errorf("slot lost after the stall %v: a 21 s stall with the servers and relays there passed", lose)
		}
	}
}

// On three brokers (replication factor 3, min.insync.replicas 2) a broker SIGKILLed is fenced by
// the controller within broker.session.timeout (4.5 s) and its partitions get another leader: two
// in-sync replicas remain, so producers go on. Only the election counts as the broker away, not
// the time until its restart: a relay stuck on the dead leader for the whole kill (the bug a
// three-broker cluster is there to catch) fails. The controller's node and a one-broker cluster
// (no target broker-N) still excuse the whole fault: nothing else can lead there.
func TestReviewABrokerKillOnThreeBrokersExcusesOnlyTheElection(t *testing.T) {
	for _, tc := range []struct {
		name, kind, target string
		failed             bool
	}{
		{"a follower broker killed", "broker-kill", "broker-2", true},
		{"a follower broker paused", "broker-pause", "broker-3", true},
		{"the coordinator's broker killed", "coordinator-move", "broker-2", true},
		{"the controller's broker stopped", "broker-stop", "broker-1", false},
		{"the only broker stopped", "broker-stop", "", false},
		{"every follower stopped (below min.insync.replicas)", "isr-shrink", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5 // committed from 10 s on, delivered after the restart
			}
			b := live(history.AtLeastOnce, late)
			b.fault(tc.kind, tc.target, 9, 29)
			got := rulesOf(Check(b.done(bothConsumers)), RuleUnavailable)
			if failed := len(got) > 0; failed != tc.failed {
				t.Fatalf("events delivered 20 s after a %s at 9-29 s: liveness failed %v, want %v (%v)", tc.kind, failed, tc.failed, got)
			}
		})
	}
}
