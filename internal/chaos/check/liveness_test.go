package check

import (
	"strconv"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// live is a history with the liveness bound's parts (7 + 1 + 5 = 13 s, of a 5 s lease and a 7 s
// leader_kafka_timeout) and a fault period from 0 to 40 s: one event committed every 2 s and
// delivered a second later, unless the case moves it.
func live(delivery string, late map[string]float64) *builder {
	b := newBuilder(delivery)
	b.h.Settings.LeaderRetry, b.h.Settings.LeaderKafkaTimeout, b.h.Settings.KafkaWriteTimeout = time.Second, 7*time.Second, 5*time.Second
	b.h.FaultsFrom, b.h.FaultsTo = at(0), at(40)
	for sec := 0.0; sec < 40; sec++ {
		b.sample("r1", sec, true, true)
		b.sample("r2", sec, true, false)
	}
	for i := 0; i < 20; i++ {
		id := "e" + itoa(i)
		b.txn("t"+itoa(i), history.Committed, float64(2*i), ev(id, "k1", i))
	}
	for i := 0; i < 20; i++ {
		id := "e" + itoa(i)
		sec := float64(2*i) + 1
		if d, ok := late[id]; ok {
			sec = d
		}
		b.publish(sec, id)
	}
	return b
}

func itoa(i int) string { return strconv.Itoa(i) }

func rulesOf(vs []Violation, rule string) []Violation {
	var out []Violation
	for _, v := range vs {
		if v.Rule == rule {
			out = append(out, v)
		}
	}
	return out
}

func TestLiveness(t *testing.T) {
	tests := []struct {
		name  string
		build func() *history.History
		want  int // unavailable violations
	}{
		{"events delivered a second after their commit break nothing", func() *history.History {
			return live(history.AtLeastOnce, nil).done(bothConsumers)
		}, 0},
		{"an event delivered 20 s after its commit while the servers were there is a stall", func() *history.History {
			// e5 (committed at 10 s) and everything after it up to 30 s wait: order holds them
			// back too, so their deliveries come at 30.5 s.
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5
			}
			return live(history.AtLeastOnce, late).done(bothConsumers)
		}, 3}, // one stall, and two windows (10-30 s) without a delivery
		{"the same wait during a broker stop is not counted", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5
			}
			b := live(history.AtLeastOnce, late)
			b.fault("broker-stop", "broker", 10, 25)
			return b.done(bothConsumers)
		}, 0},
		{"the same wait while every relay of the mode is cut off is not counted", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5
			}
			b := live(history.AtLeastOnce, late)
			b.fault("cut-both", "r1", 9, 26)
			b.fault("kill9", "r2", 10, 25)
			return b.done(bothConsumers)
		}, 0},
		{"the same wait while the primary is frozen or the synchronized standby is away is not counted", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5
			}
			b := live(history.AtLeastOnce, late)
			b.fault("pg-freeze", "postgres", 10, 18)
			b.fault("standby-stop", "postgres", 17, 25)
			return b.done(bothConsumers)
		}, 0},
		{"the same wait while one relay is cut off and the other OOM-killed is not counted", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5
			}
			b := live(history.AtLeastOnce, late)
			b.fault("cut-both", "r1", 9, 26)
			b.fault("oom", "r2", 10, 25)
			return b.done(bothConsumers)
		}, 0},
		{"one relay cut off while the other runs excuses only the takeover", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5
			}
			b := live(history.AtLeastOnce, late)
			b.fault("cut-both", "r1", 9, 26)
			return b.done(bothConsumers)
		}, 1}, // the stall: the takeover's bound ended at 22 s, and no 10 s after it lacks a delivery
		{"a neighbour's event waits while the neighbour's one relay is cut off", func() *history.History {
			b := neighbourLate()
			b.fault("cut-both", "eo-table-nb", 9, 26)
			return b.done(bothConsumers)
		}, 0},
		{"a neighbour's event is not excused by the mode's own relays being out", func() *history.History {
			b := neighbourLate()
			b.fault("cut-both", "r1", 9, 26)
			b.fault("kill9", "r2", 9, 26)
			return b.done(bothConsumers)
		}, 1},
		{"a standby's fault excuses no window", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 10; i++ {
				late["e"+itoa(i)] = 21.5
			}
			b := live(history.AtLeastOnce, late)
			b.fault("cut-kafka", "r2", 9, 26)
			return b.done(bothConsumers)
		}, 1},
		{"what commits behind a big transaction waits for it", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5
			}
			b := live(history.AtLeastOnce, late)
			big := make([]history.Event, bigTxnEvents)
			var ids []string
			for i := range big {
				big[i] = ev("big"+itoa(i), "k9", i)
				ids = append(ids, big[i].ID)
			}
			b.txn("tbig", history.Committed, 9, big...)
			for i, id := range ids {
				b.publish(10+0.2*float64(i), id) // its publication takes from 10 s to 30 s
			}
			return b.done(bothConsumers)
		}, 0},
		{"a big transaction whose first event waits past the bound is a stall", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 15; i++ {
				late["e"+itoa(i)] = 30.5
			}
			b := live(history.AtLeastOnce, late)
			big := make([]history.Event, bigTxnEvents)
			var ids []string
			for i := range big {
				big[i] = ev("big"+itoa(i), "k9", i)
				ids = append(ids, big[i].ID)
			}
			b.txn("tbig", history.Committed, 9, big...)
			b.publish(30, ids...) // 21 s after its commit, all at once
			return b.done(bothConsumers)
		}, 3}, // one stall, and two windows (10-30 s) without a delivery
		{"a window with commits and no delivery for 10 s is reported even below the bound", func() *history.History {
			late := map[string]float64{}
			for i := 5; i < 10; i++ {
				late["e"+itoa(i)] = 21.5 // e5 waits 11.5 s: under the 13 s bound
			}
			return live(history.AtLeastOnce, late).done(bothConsumers)
		}, 1},
		{"a window without attempts and without waiting events is no stall", func() *history.History {
			b := live(history.AtLeastOnce, nil)
			var keep []history.Txn
			for _, tx := range b.h.Txns {
				if tx.Start.Before(at(10)) || !tx.Start.Before(at(20)) {
					keep = append(keep, tx)
				}
			}
			b.h.Txns = keep
			var log []history.Read
			for _, rd := range b.log {
				if rd.Appended.Before(at(10)) || !rd.Appended.Before(at(21)) {
					log = append(log, rd)
				}
			}
			b.log = log
			return b.done(bothConsumers)
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.build()
			vs := Check(h)
			got := rulesOf(vs, RuleUnavailable)
			if len(got) != tt.want {
				t.Fatalf("got %d unavailable violations, want %d: %v (all: %v)", len(got), tt.want, got, vs)
			}
			for _, v := range vs {
				if v.Rule != RuleUnavailable {
					t.Fatalf("unexpected violation %v", v)
				}
			}
			if s := Summarize(h); tt.want > 0 && s.WorstStall < 10*time.Second {
				t.Fatalf("worst stall %v, want the stall reported: %s", s.WorstStall, s.Stall)
			}
		})
	}
}

// neighbourLate is live's history with a slot sample of the mode's slot "main" and a neighbour's
// transaction on slot "nb", committed at 10 s and delivered at 30 s.
func neighbourLate() *builder {
	b := live(history.ExactlyOnce, nil)
	b.h.Slots = append(b.h.Slots, history.SlotSample{At: at(1), Slot: "main", ConfirmedLSN: 1, WALEnd: 2})
	b.h.Txns = append(b.h.Txns, history.Txn{ID: "tnb", Writer: "nbw0", Start: at(10), End: at(10.1), Outcome: history.Committed,
		Events: []history.Event{ev("nb1", "nbk", 1)}, Slot: "nb"})
	b.publish(30, "nb1")
	return b
}
