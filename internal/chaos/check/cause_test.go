package check

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// replayed is an at-least-once run whose events e1..e4 are published at 1-4 s, a fault of kind on
// relay target at 5 s, and e3 and e4 published again at 6 s; r1 leads throughout, r2 stands by.
func replayed(kind, target string) *builder {
	b := newBuilder(history.AtLeastOnce)
	b.h.Settings.StatusInterval, b.h.Settings.MaxInFlightEvents = 500*time.Millisecond, 100
	for i, id := range []string{"e1", "e2", "e3", "e4"} {
		b.txn("t"+id, history.Committed, float64(i), ev(id, "k1", i+1))
		b.publish(float64(i+1), id)
	}
	for sec := 0.0; sec < 10; sec += 0.5 {
		b.sample("r1", sec, true, true)
		b.sample("r2", sec, true, false)
	}
	b.fault(kind, target, 5, 5.5)
	b.publish(6, "e3", "e4")
	return b
}

func TestDuplicatesByCause(t *testing.T) {
	tests := []struct {
		name  string
		build func() *history.History
		want  int // duplicate violations
	}{
		{"a kill of the leader explains its replay", func() *history.History {
			return replayed("kill9", "r1").done(bothConsumers)
		}, 0},
		{"a kill of a standby explains nothing", func() *history.History {
			return replayed("kill9", "r2").done(bothConsumers)
		}, 4}, // two events, two consumers
		{"an OOM kill of the leader explains its replay", func() *history.History {
			return replayed("oom", "r1").done(bothConsumers)
		}, 0},
		{"an OOM kill of a standby explains nothing", func() *history.History {
			return replayed("oom", "r2").done(bothConsumers)
		}, 4},
		{"a frozen primary explains a replay whoever led", func() *history.History {
			return replayed("pg-freeze", "postgres").done(bothConsumers)
		}, 0},
		{"a clean SIGTERM of the leader explains nothing", func() *history.History {
			b := replayed("sigterm", "r1")
			b.h.Stops = append(b.h.Stops, history.Stop{Relay: "r1", Signal: at(5), Exited: at(5.4), Code: 0})
			return b.done(bothConsumers)
		}, 4},
		{"a SIGTERM that outlived shutdown_timeout is a crash", func() *history.History {
			b := replayed("sigterm", "r1")
			b.h.Stops = append(b.h.Stops, history.Stop{Relay: "r1", Signal: at(5), Exited: at(16), Code: 0})
			return b.done(bothConsumers)
		}, 0},
		{"a PostgreSQL restart explains a replay whoever led", func() *history.History {
			return replayed("pg-restart", "postgres").done(bothConsumers)
		}, 0},
		{"a replay larger than in flight, a status interval of acknowledgements and a partial transaction is too large", func() *history.History {
			b := replayed("kill9", "r1")
			b.h.Settings.MaxInFlightEvents = 1 // 1 in flight + 0 acknowledged around the kill + 1 (each txn one event) < 2 + 1
			var ids []string
			for i := 5; i < 8; i++ {
				id := "x" + itoa(i)
				b.txn("t"+id, history.Committed, 0.5, ev(id, "k"+itoa(i), 1))
				b.publish(0.6, id)
				ids = append(ids, id)
			}
			b.publish(6, ids...)
			return b.done(map[string]string{"rc": history.ReadCommitted})
		}, 1},
		{"a relay's kill replays nothing acknowledged long before it", func() *history.History {
			b := lookback(false)
			return b.done(map[string]string{"rc": history.ReadCommitted})
		}, 1},
		{"a relay's kill replays the whole of a partly acknowledged transaction", func() *history.History {
			b := lookback(true)
			return b.done(map[string]string{"rc": history.ReadCommitted})
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs := Check(tt.build())
			if got := rulesOf(vs, RuleDuplicate); len(got) != tt.want {
				t.Fatalf("got %d duplicate violations, want %d: %v", len(got), tt.want, vs)
			}
		})
	}
}

// lookback is an at-least-once run with a kafka write timeout of 1 s (relayLookback 2 x 0.5 s +
// 1 s + 1 s = 3 s): txn t1's first event is published at 10 s, the leader r1 is killed at 30 s and
// the event is published again at 31 s; with partial, t1's second event is first published at 29 s.
func lookback(partial bool) *builder {
	b := newBuilder(history.AtLeastOnce)
	b.h.Settings.StatusInterval, b.h.Settings.KafkaWriteTimeout, b.h.Settings.MaxInFlightEvents = 500*time.Millisecond, time.Second, 100
	b.txn("t1", history.Committed, 9, ev("e1", "k1", 1), ev("e2", "k2", 1))
	b.publish(10, "e1")
	if partial {
		b.publish(29, "e2")
	} else {
		b.publish(10, "e2")
	}
	for sec := 0.0; sec < 40; sec += 0.5 {
		b.sample("r1", sec, true, true)
	}
	b.fault("kill9", "r1", 30, 30.5)
	b.publish(31, "e1")
	return b
}
