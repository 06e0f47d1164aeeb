package check

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// builder makes small histories: transactions, a log the relay published to, consumers that read
// the log, faults and samples.
type builder struct {
	h    history.History
	log  []history.Read // the records published, in append order (Consumer empty)
	next map[string]int64
}

func newBuilder(delivery string) *builder {
	return &builder{
		h: history.History{
			Seed: 42, Mode: "eo-table", Start: t0, End: at(60),
			Settings: history.Settings{
				Delivery: delivery, ShutdownTimeout: 10 * time.Second, StopSlack: 2 * time.Second,
				RSSBound: 256 << 20, ReplayWindow: 20 * time.Second, Lease: 5 * time.Second, ZombieGrace: 3 * time.Second,
			},
		},
		next: make(map[string]int64),
	}
}

func ev(id, key string, seq int) history.Event {
	return history.Event{ID: id, Topic: "orders", Key: key, Seq: seq}
}

func (b *builder) txn(id string, o history.Outcome, sec float64, evs ...history.Event) {
	b.h.Txns = append(b.h.Txns, history.Txn{ID: id, Writer: "w1", Start: at(sec), End: at(sec + 0.1), Outcome: o, Events: evs})
}

func (b *builder) find(id string) history.Event {
	for _, t := range b.h.Txns {
		for _, e := range t.Events {
			if e.ID == id {
				return e
			}
		}
	}
	return history.Event{ID: id, Topic: "orders", Key: "k-ghost", Seq: 99}
}

// publish appends the events to the log at sec, each in its key's partition.
func (b *builder) publish(sec float64, ids ...string) {
	for _, id := range ids {
		e := b.find(id)
		p := int(e.Key[len(e.Key)-1]) % 3
		tp := fmt.Sprintf("%s/%d", e.Topic, p)
		b.log = append(b.log, history.Read{Topic: e.Topic, Partition: p, Offset: b.next[tp], Key: e.Key, EventID: id, Seq: e.Seq, Appended: at(sec)})
		b.next[tp]++
	}
}

func (b *builder) fault(kind, target string, from, to float64) {
	b.h.Faults = append(b.h.Faults, history.Fault{Kind: kind, Target: target, Start: at(from), End: at(to)})
}

// sample records a relay scrape; leader implies up.
func (b *builder) sample(relay string, sec float64, up, leader bool) {
	b.h.Relays = append(b.h.Relays, history.RelaySample{At: at(sec), Relay: relay, Up: up, Leader: leader, RSS: 40 << 20})
}

// done makes every consumer read the whole log, and returns the history.
func (b *builder) done(consumers map[string]string) *history.History {
	for _, name := range []string{"rc", "ru"} {
		iso, ok := consumers[name]
		if !ok {
			continue
		}
		for _, rd := range b.log {
			if rd.Consumer == aborted && iso == history.ReadCommitted {
				continue
			}
			rd.Consumer, rd.Isolation = name, iso
			b.h.Reads = append(b.h.Reads, rd)
		}
	}
	h := b.h
	return &h
}

// aborted, in a log record's Consumer, marks a record of an aborted Kafka transaction: only
// read_uncommitted consumers see it.
const aborted = "aborted"

var bothConsumers = map[string]string{"rc": history.ReadCommitted, "ru": history.ReadUncommitted}

// clean builds a run with faults that breaks no rule: a rolled-back txn, in-doubt txns delivered
// and not, a txn that vanished in an unsynced failover yet was delivered, duplicates inside a
// kill -9's replay window (for the read_uncommitted consumer only in exactly-once), a pause longer
// than the lease whose zombie leadership stays within the grace, a handover whose samples overlap
// by less than their resolution, and a SIGTERM within shutdown_timeout.
func clean(delivery string) *builder {
	b := newBuilder(delivery)
	b.txn("t1", history.Committed, 1, ev("e1", "k1", 1), ev("e2", "k2", 1))
	b.txn("t2", history.RolledBack, 2, ev("e3", "k1", 2))
	b.txn("t3", history.Committed, 3, ev("e4", "k1", 3))
	b.txn("t4", history.InDoubt, 4, ev("e5", "k2", 2))
	b.txn("t5", history.InDoubt, 5, ev("e6", "k2", 3))
	b.txn("t6", history.Vanished, 20, ev("e7", "k1", 4))
	b.txn("t7", history.Committed, 40, ev("e8", "k1", 5))
	b.h.Txns = append(b.h.Txns, history.Txn{ID: "t8", Writer: "w2", Start: at(41), End: at(42), Outcome: history.Committed, Resolved: true,
		Events: []history.Event{ev("e9", "k2", 4)}})
	b.txn("t9", history.Committed, 6) // load on another table: no events

	b.publish(1.2, "e1", "e2")
	b.publish(3.2, "e4")
	b.publish(4.2, "e5")
	b.publish(20.2, "e7")
	b.fault("failover-unsynced", "postgres", 25, 27)
	b.fault("kill9", "r2", 30, 30)
	if delivery == history.AtLeastOnce {
		b.publish(31, "e4", "e7") // replayed after the kill, within its window
	} else {
		// The killed relay's open Kafka transaction, aborted: read_uncommitted sees a duplicate.
		b.publish(30.1, "e4")
		b.log[len(b.log)-1].Consumer = aborted
	}
	b.publish(40.2, "e8")
	b.publish(42.2, "e9")

	// r1 leads, is paused longer than its lease (r2 takes over), comes back a zombie for 2 s.
	b.fault("pause", "r1", 10, 18)
	for s := 0; s < 60; s++ {
		sec := float64(s)
		switch {
		case s < 10:
			b.sample("r1", sec, true, true)
		case s < 18:
			b.sample("r1", sec, false, false)
		case s < 20:
			b.sample("r1", sec, true, true) // the zombie, inside the grace
		case s < 41:
			b.sample("r1", sec, true, false)
		default:
			b.sample("r1", sec, true, true) // took over from r2 at 41
		}
		sec += 0.5
		switch {
		case s < 12:
			b.sample("r2", sec, true, false)
		case s <= 40:
			b.sample("r2", sec, true, true)
		default:
			b.sample("r2", sec, false, false) // SIGTERMed at 40.2
		}
	}
	b.h.Stops = append(b.h.Stops, history.Stop{Relay: "r2", Signal: at(40.2), Exited: at(41)})
	b.h.Slots = append(b.h.Slots, history.SlotSample{At: at(30), Slot: "outbox", ConfirmedLSN: 100, WALEnd: 200})
	return b
}

func TestCleanHistoriesBreakNoRule(t *testing.T) {
	for _, delivery := range []string{history.ExactlyOnce, history.AtLeastOnce} {
		t.Run(delivery, func(t *testing.T) {
			h := clean(delivery).done(bothConsumers)
			if vs := Check(h); len(vs) != 0 {
				t.Fatalf("violations in a clean history:\n%s", Format(h, vs, 0))
			}
		})
	}
}

func TestEachRule(t *testing.T) {
	eo, alo := history.ExactlyOnce, history.AtLeastOnce
	tests := []struct {
		name      string
		delivery  string
		consumers map[string]string
		change    func(b *builder)
		rules     []string // the rules that must fire, and no other
		says      string   // the first violation of rules[0] must say this
	}{
		{
			name: "a committed event nobody read is lost for each consumer", delivery: eo,
			change: func(b *builder) { b.txn("t10", history.Committed, 50, ev("e10", "k3", 1)) },
			rules:  []string{RuleLost}, says: "never read 1 of 6 committed events: e10 (key k3 seq 1, txn t10)",
		},
		{
			name: "without consumers every committed event is lost", delivery: alo, consumers: map[string]string{},
			rules: []string{RuleLost}, says: "no consumer read anything: 5 committed events never delivered: e1 (key k1 seq 1, txn t1)",
		},
		{
			name: "an event of a rolled-back txn is read", delivery: eo,
			change: func(b *builder) { b.publish(50, "e3") },
			rules:  []string{RuleRolledBack}, says: "read event e3 (key k1 seq 2 at orders/1@",
		},
		{
			name: "an event nobody wrote is read", delivery: alo,
			change: func(b *builder) { b.publish(50, "ghost") },
			rules:  []string{RulePhantom}, says: "read event ghost (key k-ghost seq 99",
		},
		{
			name: "an event is read with another seq than written", delivery: eo,
			change: func(b *builder) { b.log[2].Seq = 7 },
			rules:  []string{RulePhantom}, says: "read event e4 as topic orders key k1 seq 7",
		},
		{
			name: "a txn lost by a synced failover is delivered", delivery: eo,
			change: func(b *builder) { b.h.Faults[0].Kind = "failover-synced" },
			rules:  []string{RuleVanishedDelivered}, says: "read event e7 (key k1 seq 4",
		},
		{
			name: "a txn lost by a synced failover is delivered, its commit noted just after the kill", delivery: eo,
			change: func(b *builder) {
				b.fault("failover-synced", "postgres", 50, 52)
				b.fault("failover-unsynced", "postgres", 55, 57) // a later failover must not excuse it
				b.txn("t10", history.Vanished, 49.95, ev("e10", "k3", 1))
				b.publish(49.99, "e10")
			},
			rules: []string{RuleVanishedDelivered}, says: "read event e10 (key k3 seq 1",
		},
		{
			name: "a consumer the run started reads nothing", delivery: alo,
			consumers: map[string]string{"rc": history.ReadCommitted},
			change: func(b *builder) {
				b.h.Consumers = []history.Consumer{{Name: "rc", Isolation: history.ReadCommitted}, {Name: "ru", Isolation: history.ReadUncommitted}}
			},
			rules: []string{RuleLost}, says: "consumer ru (read_uncommitted) never read 5 of 5 committed events",
		},
		{
			name: "an in-doubt txn rolled back across a synced failover is delivered", delivery: eo,
			change: func(b *builder) {
				b.fault("failover-synced", "postgres", 50, 52)
				b.h.Txns = append(b.h.Txns, history.Txn{ID: "t10", Writer: "w1", Start: at(49.5), End: at(50.2),
					Outcome: history.RolledBack, Resolved: true, Events: []history.Event{ev("e10", "k3", 1)}})
				b.publish(49.9, "e10")
			},
			rules: []string{RuleRolledBack}, says: "read event e10 (key k3 seq 1",
		},
		{
			name: "a txn vanishes without a failover", delivery: eo,
			change: func(b *builder) { b.h.Faults = slices.Delete(b.h.Faults, 0, 1) },
			rules:  []string{RuleHarness}, says: "txn t6 (writer w1, 1 events) vanished without a failover",
		},
		{
			name: "exactly-once delivers an event twice to read_committed", delivery: eo,
			consumers: map[string]string{"rc": history.ReadCommitted},
			change:    func(b *builder) { b.publish(31, "e4") }, // inside the kill's window: no excuse here
			rules:     []string{RuleDuplicate}, says: "key k1: consumer rc (exactly-once, read_committed) read event e4 (seq 3) again",
		},
		{
			name: "exactly-once read_uncommitted duplicates are held to the replay window", delivery: eo,
			change: func(b *builder) { b.publish(55, "e2") },
			// rc may not read it twice at all; ru may not outside a window.
			rules: []string{RuleDuplicate}, says: "key k2: consumer rc (exactly-once, read_committed) read event e2 (seq 1) again",
		},
		{
			name: "at-least-once duplicates outside every replay window", delivery: alo,
			change: func(b *builder) { b.publish(55, "e1") },
			rules:  []string{RuleDuplicate}, says: "key k1: consumer rc (read_committed) read event e1 (seq 1) again at orders/1@",
		},
		{
			name: "at-least-once duplicate while only a fault that cannot replay lasts", delivery: alo,
			change: func(b *builder) {
				b.fault("big-tx", "alo", 78, 82)
				b.publish(80, "e8")
			},
			rules: []string{RuleDuplicate}, says: "key k1: consumer rc (read_committed) read event e8 (seq 5) again at orders/1@",
		},
		{
			name: "at-least-once duplicate while only a prune of the outbox lasts", delivery: alo,
			change: func(b *builder) {
				b.fault("prune", "alo", 78, 82)
				b.publish(80, "e8")
			},
			rules: []string{RuleDuplicate}, says: "key k1: consumer rc (read_committed) read event e8 (seq 5) again at orders/1@",
		},
		{
			name: "at-least-once duplicate while only the standby's replay lags", delivery: alo,
			change: func(b *builder) {
				b.fault("standby-lag", "postgres", 78, 82)
				b.publish(80, "e8")
			},
			rules: []string{RuleDuplicate}, says: "key k1: consumer rc (read_committed) read event e8 (seq 5) again at orders/1@",
		},
		{
			name: "at-least-once duplicate of an event first published after the fault ended", delivery: alo,
			change: func(b *builder) { b.publish(41, "e8") }, // e8 first at 40.2; the kill was at 30
			rules:  []string{RuleDuplicate}, says: "(first at orders/1@",
		},
		{
			name: "exactly-once skips a committed event (and so loses it)", delivery: eo,
			change: func(b *builder) {
				b.log = slices.DeleteFunc(b.log, func(rd history.Read) bool { return rd.EventID == "e4" })
			}, // e7 after it vanished: not in the order
			rules: []string{RuleOrder, RuleLost}, says: "key k1: consumer rc read seq 5 (event e8 at orders/1@4) right after seq 1 (event e1 at orders/1@0), skipping committed seq 3 (event e4)",
		},
		{
			name: "exactly-once delivers a key out of order", delivery: eo,
			change: func(b *builder) {
				b.log = b.log[:2]
				b.publish(30, "e8", "e4", "e5", "e7", "e9")
			},
			rules: []string{RuleOrder}, says: "key k1: consumer rc read seq 5 (event e8 at orders/1@5) right after seq 1 (event e1 at orders/1@0), skipping committed seq 3 (event e4); 1 reads of this key out of order, 1 gaps",
		},
		{
			name: "at-least-once first deliveries out of order", delivery: alo,
			change: func(b *builder) {
				b.log = b.log[:2]
				b.publish(30, "e8", "e4", "e5", "e7", "e9")
			},
			rules: []string{RuleOrder}, says: "key k1: consumer rc read seq 3 (event e4 at orders/1@7) after seq 5 (event e8 at orders/1@6)",
		},
		{
			name: "a key read in two partitions", delivery: alo,
			change: func(b *builder) { b.log[len(b.log)-2].Partition = 2 }, // e8
			rules:  []string{RuleOrder}, says: "key k1: consumer rc read it in two partitions: orders/1@0 (event e1) and orders/2@",
		},
		{
			name: "the slot confirms beyond the WAL end", delivery: eo,
			change: func(b *builder) {
				b.h.Slots = append(b.h.Slots, history.SlotSample{At: at(33), Slot: "outbox", ConfirmedLSN: 1<<32 + 300, WALEnd: 1<<32 + 200})
			},
			rules: []string{RuleSlotAhead}, says: "slot outbox confirmed 1/12C, beyond the server's WAL end 1/C8",
		},
		{
			name: "two relays lead at once", delivery: eo,
			change: func(b *builder) {
				for i := range b.h.Relays {
					if s := &b.h.Relays[i]; s.Relay == "r2" && s.At.After(at(50)) && s.At.Before(at(55)) {
						s.Up, s.Leader = true, true
					}
				}
			},
			rules: []string{RuleTwoLeaders}, says: "relays r1 and r2 both reported leadership for 5s (sampling resolution allows 1.5s)",
		},
		{
			name: "a zombie leads beyond its grace", delivery: eo,
			change: func(b *builder) {
				for i := range b.h.Relays {
					if s := &b.h.Relays[i]; s.Relay == "r1" && !s.At.Before(at(20)) && s.At.Before(at(25)) {
						s.Leader = true
					}
				}
			},
			rules: []string{RuleTwoLeaders}, says: "relays r2 and r1 both reported leadership for 4s",
		},
		{
			name: "a SIGTERM takes too long", delivery: eo,
			change: func(b *builder) { b.h.Stops[0].Exited = at(60) },
			rules:  []string{RuleSlowStop}, says: "relay r2 took 19.8s to exit after SIGTERM (code 0), more than shutdown_timeout 10s + slack 2s",
		},
		{
			name: "a SIGTERM never ends", delivery: eo,
			change: func(b *builder) { b.h.Stops[0].Exited = time.Time{} },
			rules:  []string{RuleSlowStop}, says: "relay r2 had not exited when the harness gave up waiting",
		},
		{
			name: "a relay's RSS above the bound", delivery: eo,
			change: func(b *builder) { b.h.Relays[7].RSS = 300 << 20 },
			rules:  []string{RuleRSS}, says: "relay r2 RSS above the bound of 256.0 MiB in 1 samples, at most 300.0 MiB",
		},
		{
			name: "the harness lists a txn twice", delivery: eo,
			change: func(b *builder) { b.txn("t9", history.Committed, 50) },
			rules:  []string{RuleHarness}, says: "txn t9 listed twice",
		},
		{
			name: "the harness writes an event in two txns", delivery: eo,
			change: func(b *builder) { b.txn("t10", history.RolledBack, 50, ev("e1", "k1", 9)) },
			rules:  []string{RuleHarness}, says: "event e1 written by txn t1 and again by txn t10",
		},
		{
			name: "the harness records a read without an event id", delivery: alo,
			change: func(b *builder) { b.log = append(b.log, history.Read{Topic: "orders", Offset: 9, Appended: at(50)}) },
			rules:  []string{RuleHarness}, says: "2 reads without an event id, the first by consumer rc at orders/0@9",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := clean(tt.delivery)
			if tt.change != nil {
				tt.change(b)
			}
			consumers := tt.consumers
			if consumers == nil {
				consumers = bothConsumers
			}
			h := b.done(consumers)
			vs := Check(h)
			fired := map[string]bool{}
			for _, v := range vs {
				fired[v.Rule] = true
			}
			for _, want := range tt.rules {
				if !fired[want] {
					t.Errorf("rule %s did not fire", want)
				}
				delete(fired, want)
			}
			if len(fired) > 0 {
				t.Errorf("other rules fired too: %v", fired)
			}
			i := slices.IndexFunc(vs, func(v Violation) bool { return v.Rule == tt.rules[0] })
			if i >= 0 && !strings.Contains(vs[i].Message, tt.says) {
				t.Errorf("message %q\ndoes not say %q", vs[i].Message, tt.says)
			}
			if t.Failed() {
				t.Logf("report:\n%s", Format(h, vs, 0))
			}
		})
	}
}

// TestNoFalseAlarms: histories a correct relay can leave, at the edges of the rules.
func TestNoFalseAlarms(t *testing.T) {
	tests := []struct {
		name   string
		change func(b *builder)
	}{
		{
			// The writer notes the acknowledgement of its COMMIT a moment after the old primary
			// was killed (it was slow to be scheduled): that failover lost it.
			name: "a txn acknowledged just before the kill vanishes in it",
			change: func(b *builder) {
				b.txn("t10", history.Vanished, 24.95, ev("e10", "k3", 1))
				b.publish(24.99, "e10")
			},
		},
		{
			// The COMMIT was cut off by the kill after the old primary committed and the relay
			// published it; the surviving timeline lacks the marker row, so it is settled as
			// rolled back. Without synchronized_standby_slots that delivery is allowed.
			name: "an in-doubt txn committed on the old primary, lost by an unsynced failover, delivered",
			change: func(b *builder) {
				b.h.Txns = append(b.h.Txns, history.Txn{ID: "t10", Writer: "w1", Start: at(24.5), End: at(25.2),
					Outcome: history.RolledBack, Resolved: true, Events: []history.Event{ev("e10", "k3", 1)}})
				b.publish(24.9, "e10")
			},
		},
	}
	for _, tt := range tests {
		for _, delivery := range []string{history.ExactlyOnce, history.AtLeastOnce} {
			t.Run(tt.name+"/"+delivery, func(t *testing.T) {
				b := clean(delivery)
				tt.change(b)
				h := b.done(bothConsumers)
				if vs := Check(h); len(vs) != 0 {
					t.Fatalf("violations:\n%s", Format(h, vs, 0))
				}
			})
		}
	}
}

func TestViolationsAreOrderedAndEventsBounded(t *testing.T) {
	b := clean(history.ExactlyOnce)
	for i := range 30 {
		b.txn(fmt.Sprintf("x%d", i), history.Committed, 50, ev(fmt.Sprintf("x%d", i), "k9", i+1))
	}
	b.h.Slots = append(b.h.Slots, history.SlotSample{At: at(59), Slot: "outbox", ConfirmedLSN: 2, WALEnd: 1})
	h := b.done(bothConsumers)
	vs := Check(h)
	want := []string{RuleSlotAhead, RuleLost, RuleLost}
	var got []string
	for _, v := range vs {
		got = append(got, v.Rule)
		if len(v.Events) > maxEvents {
			t.Errorf("%s lists %d events", v.Rule, len(v.Events))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rules %v, want %v", got, want)
	}
	if !strings.Contains(vs[1].Message, "consumer rc (read_committed) never read 30 of 35") || len(vs[1].Events) != maxEvents {
		t.Errorf("lost: %q with %d events", vs[1].Message, len(vs[1].Events))
	}
}

func TestFormat(t *testing.T) {
	b := clean(history.ExactlyOnce)
	b.h.Faults[0].Kind = "failover-synced"
	b.h.Faults[0].Detail = "synchronized_standby_slots=standby1"
	b.h.Slots = append(b.h.Slots,
		history.SlotSample{At: at(58), Slot: "outbox", ConfirmedLSN: 2, WALEnd: 1},
		history.SlotSample{At: at(59), Slot: "outbox", ConfirmedLSN: 2, WALEnd: 1})
	h := b.done(bothConsumers)
	vs := Check(h)
	out := Format(h, vs, 2)
	for _, want := range []string{
		"seed 42, mode eo-table, exactly-once, 1m0s: 3 violations",
		"reproduce: make chaos SEED=42 MODE=eo-table DURATION=1m\n",
		"1. [vanished-delivered] +20.2s  consumer rc read event e7 (key k1 seq 4 at orders/1@2) of txn t6",
		"   events: e7\n",
		"   the schedule around it:\n     +10.0s pause r1 until +18.0s (8s)\n     +25.0s failover-synced postgres until +27.0s (2s): synchronized_standby_slots=standby1\n     +30.0s kill9 r2\n",
		"... and 1 more\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report does not contain %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "3. ") {
		t.Errorf("report shows more than 2 violations:\n%s", out)
	}
	if got := Format(h, nil, 10); !strings.Contains(got, "no violations") {
		t.Errorf("clean report:\n%s", got)
	}
}

func TestRoundDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		20 * time.Second:                      "20s",
		3*time.Minute + 2*time.Second:         "3m",
		30*time.Minute - 400*time.Millisecond: "30m",
		2*time.Hour + 10*time.Second:          "2h",
		90 * time.Minute:                      "90m",
	} {
		if got := roundDuration(d); got != want {
			t.Errorf("roundDuration(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestSummarize(t *testing.T) {
	h := clean(history.AtLeastOnce).done(bothConsumers)
	s := Summarize(h)
	want := Summary{
		Seed: 42, Mode: "eo-table", Delivery: history.AtLeastOnce, Duration: time.Minute,
		Txns:      map[history.Outcome]int{history.Committed: 5, history.RolledBack: 1, history.InDoubt: 2, history.Vanished: 1},
		Resolved:  1,
		Committed: 5, InDoubt: 2, Vanished: 1, Delivered: 5,
		Duplicates:    map[string]int{history.ReadCommitted: 2, history.ReadUncommitted: 2},
		ByCause:       map[string]int{"kill9": 4},
		Faults:        map[string]int{"failover-unsynced": 1, "kill9": 1, "pause": 1},
		LeaderChanges: 2, MaxRSS: 40 << 20, LongestStop: 800 * time.Millisecond,
	}
	if got, want := fmt.Sprintf("%+v", s), fmt.Sprintf("%+v", want); got != want {
		t.Errorf("summary\n got %s\nwant %s", got, want)
	}
	str := s.String()
	for _, line := range []string{
		"txns        5 committed, 1 rolled back, 2 in doubt, 1 vanished (1 resolved afterwards)",
		"events      5 committed: 5 delivered, 0 lost, 0 reordered, 0 gaps; 2 in doubt, 1 vanished",
		"duplicates  read_committed 2, read_uncommitted 2 (total 4)",
		"of them replays, by the fault that caused them: kill9 4 (total 4)",
		"faults      failover-unsynced 1, kill9 1, pause 1 (total 3)",
		"relays      2 leader changes, max RSS 40.0 MiB, longest SIGTERM stop 800ms, 0 not stopped",
	} {
		if !strings.Contains(str, line) {
			t.Errorf("summary table lacks %q:\n%s", line, str)
		}
	}

	// Exactly-once: the aborted Kafka transaction shows as a duplicate to read_uncommitted only.
	eo := Summarize(clean(history.ExactlyOnce).done(bothConsumers))
	if want := map[string]int{history.ReadUncommitted: 1}; fmt.Sprint(eo.Duplicates) != fmt.Sprint(want) {
		t.Errorf("exactly-once duplicates %v, want %v", eo.Duplicates, want)
	}
}

// TestLargeHistory checks a history of the size a long run records, 200,000 events and 400,000
// reads, with a few faults and violations sprinkled in: it must finish (no quadratic walk).
func TestLargeHistory(t *testing.T) {
	const keys, perKey = 2000, 100
	b := newBuilder(history.AtLeastOnce)
	b.h.End = at(1800)
	b.h.Txns = make([]history.Txn, 0, keys*perKey)
	b.h.Reads = make([]history.Read, 0, 2*keys*perKey)
	names := make([]string, keys)
	for k := range keys {
		names[k] = "k" + strconv.Itoa(k)
	}
	for seq := 1; seq <= perKey; seq++ {
		for k, key := range names {
			sec := float64(seq*keys+k) / float64(keys*perKey) * 1700
			id := "e" + strconv.Itoa(k) + "-" + strconv.Itoa(seq)
			b.h.Txns = append(b.h.Txns, history.Txn{ID: id, Start: at(sec), End: at(sec), Outcome: history.Committed,
				Events: []history.Event{{ID: id, Topic: "orders", Key: key, Seq: seq}}})
			for _, c := range []string{"rc", "ru"} {
				b.h.Reads = append(b.h.Reads, history.Read{Consumer: c, Isolation: history.ReadCommitted, Topic: "orders",
					Partition: k % 12, Offset: int64(seq*keys + k), Key: key, EventID: id, Seq: seq, Appended: at(sec)})
			}
		}
	}
	for i := range 50 {
		b.fault("kill9", "r1", float64(i*30), float64(i*30))
	}
	// A duplicate long after the last fault's replay window, and a read missing.
	dup := b.h.Reads[0]
	dup.Offset, dup.Appended = 1<<40, at(1750)
	b.h.Reads = append(slices.Delete(b.h.Reads, 1000, 1001), dup)
	vs := Check(&b.h)
	if len(vs) != 2 || vs[0].Rule != RuleDuplicate || vs[1].Rule != RuleLost {
		t.Fatalf("violations:\n%s", Format(&b.h, vs, 10))
	}
	if s := Summarize(&b.h); s.Committed != keys*perKey || s.Lost != 1 {
		t.Errorf("summary:\n%s", s)
	}
}

// An old leader's belief may outlive the death of its primary by less than the lease (its lock
// and stream died with the server; its next check fences it); longer is two leaders.
func TestAnOldLeadersBeliefAfterItsPrimaryDied(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lagsTo float64 // r1 still reports leadership until then; the primary died at 20
		want   int
	}{
		{"within the lease", 23, 0},
		{"beyond the lease", 28, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder(history.AtLeastOnce)
			b.fault("failover-unsynced", "postgres", 20, 22)
			for s := 0.0; s < 40; s += 0.5 {
				b.sample("r1", s, true, s < tc.lagsTo)
				b.sample("r2", s+0.25, true, s >= 20.5)
			}
			h := b.done(map[string]string{})
			var got []Violation
			for _, v := range Check(h) {
				if v.Rule == RuleTwoLeaders {
					got = append(got, v)
				}
			}
			if len(got) != tc.want {
				t.Errorf("%d two-leaders violations, want %d:\n%s", len(got), tc.want, Format(h, got, 0))
			}
		})
	}
}

// TestAReplayThatWaitsForKafkaIsStillAReplay: the replay window and its lookback count only time
// when Kafka was there. A relay killed while the broker is down replays once the broker is back,
// from a slot position that stood still while it was away (a 30-minute run on a loaded machine:
// broker restarts of a minute, replays three minutes after the first copies).
func TestAReplayThatWaitsForKafkaIsStillAReplay(t *testing.T) {
	tests := []struct {
		name      string
		stopUntil float64 // the broker, stopped from 35 s (the kill is at 30 s, the window 20 s)
		again     float64 // when e1 (first at 0 s) is appended again
		want      bool    // a duplicate violation
	}{
		{"appended within the window after the broker's return", 60, 75, false},
		{"appended past the window after the broker's return", 40, 75, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := clean(history.AtLeastOnce)
			b.fault("broker-stop", "broker", 35, tt.stopUntil)
			b.publish(tt.again, "e1")
			h := b.done(bothConsumers)
			vs := Check(h)
			got := slices.ContainsFunc(vs, func(v Violation) bool { return v.Rule == RuleDuplicate })
			if got != tt.want {
				t.Errorf("duplicate violation: %v; want %v\n%s", got, tt.want, Format(h, vs, 0))
			}
		})
	}
}

// TestALostSlotsGapPublishedAgainIsExcusedAndNothingElse: a slot-lost or slot-invalidated fault's recovery publishes
// the gap again from the outbox table, at least once under either delivery (docs/guarantees.md,
// "Lost slot, no lost events"): a repeat of an event committed in the gap, appended during the
// recovery or its window, is no violation, even exactly-once for a read_committed consumer. A
// repeat of an event committed before the gap's lookback or after the drop, or appended after the
// window, still is; so is a gap that leaves the key's last copies out of order.
func TestALostSlotsGapPublishedAgainIsExcusedAndNothingElse(t *testing.T) {
	tests := []struct {
		name     string
		delivery string
		again    []string // published again at 305 s
		late     float64  // when set, the repeats are appended then instead
		want     string   // the rule broken, "" for none
	}{
		{"the gap published again exactly-once", history.ExactlyOnce, []string{"a1", "a2", "b1"}, 0, ""},
		{"the gap published again at-least-once", history.AtLeastOnce, []string{"a1", "a2", "b1"}, 0, ""},
		{"a repeat of an event committed before the gap's lookback", history.ExactlyOnce, []string{"old"}, 0, RuleDuplicate},
		{"a repeat of an event committed before the gap's lookback, at-least-once", history.AtLeastOnce, []string{"old"}, 0, RuleDuplicate},
		{"a repeat of an event committed after the drop", history.ExactlyOnce, []string{"a1", "a2", "b1", "after"}, 0, RuleDuplicate},
		{"the gap published again after the recovery's window", history.ExactlyOnce, []string{"a1", "a2", "b1"}, 340, RuleDuplicate},
		{"a gap that misses an event Kafka held", history.ExactlyOnce, []string{"a1", "b1"}, 0, RuleOrder},
		{"a gap that misses an event Kafka held, at-least-once", history.AtLeastOnce, []string{"a1", "b1"}, 0, RuleOrder},
	}
	// A slot invalidated by max_slot_wal_keep_size is lost as a dropped one is, and recovered so.
	for _, kind := range []string{faultSlotLost, faultSlotInvalidated} {
		for _, tt := range tests {
			t.Run(kind+": "+tt.name, func(t *testing.T) {
				b := newBuilder(tt.delivery)
				b.h.End = at(600)
				b.txn("t0", history.Committed, 10, ev("old", "k1", 1))
				b.txn("t1", history.Committed, 250, ev("a1", "k1", 2), ev("b1", "k2", 1))
				b.txn("t2", history.Committed, 290, ev("a2", "k1", 3))
				b.txn("t3", history.Committed, 305, ev("after", "k2", 2))
				b.publish(10.2, "old")
				b.publish(250.2, "a1", "b1")
				b.publish(290.2, "a2")
				// The slot dropped at 302 s (the first attempt at 300 s lost the race with the
				// relay's reconnection), the gap published again, the recovery over at 310 s.
				b.h.Faults = append(b.h.Faults, history.Fault{Kind: kind, Target: "eo-table", Start: at(300), Lost: at(302), End: at(310)})
				when := 305.0
				if tt.late > 0 {
					when = tt.late
				}
				gap := slices.DeleteFunc(slices.Clone(tt.again), func(id string) bool { return id == "after" })
				b.publish(when, gap...)
				b.publish(when+1, "after") // streamed from the new slot
				if len(gap) < len(tt.again) {
					b.publish(when+2, "after")
				}
				h := b.done(bothConsumers)
				vs := Check(h)
				var rules []string
				for _, v := range vs {
					if !slices.Contains(rules, v.Rule) {
						rules = append(rules, v.Rule)
					}
				}
				want := []string{}
				if tt.want != "" {
					want = []string{tt.want}
				}
				if fmt.Sprint(rules) != fmt.Sprint(want) {
					t.Errorf("rules broken %v, want %v\n%s", rules, want, Format(h, vs, 0))
				}
				if tt.want == "" {
					s := Summarize(h)
					if n := s.Recovered[history.ReadCommitted]; n != len(tt.again) {
						t.Errorf("read_committed duplicates counted as the gap's: %d, want %d", n, len(tt.again))
					}
				}
			})
		}
	}
}
