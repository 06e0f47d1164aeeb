// Package check holds a chaos run's history to the relay's promises: every committed event
// delivered to every consumer, nothing rolled back ever delivered, exactly-once without duplicates
// or gaps, at-least-once with duplicates only after a fault, one leader at a time, bounded SIGTERM
// stops and memory. It is pure computation over a history.History: no servers, so a history saved
// by a failing run can be checked again, and the checker itself is tested on hand-made histories.
package check

import (
	"cmp"
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// Rules a history can break; Violation.Rule holds one of them.
const (
	RuleLost              = "lost"               // a committed event some consumer never read
	RuleRolledBack        = "rolled-back"        // an event of a rolled-back transaction was read
	RulePhantom           = "phantom"            // a read of an event nobody wrote, or altered on the way
	RuleVanishedDelivered = "vanished-delivered" // a transaction lost by a synced failover was delivered
	RuleDuplicate         = "duplicate"          // an event read twice where the mode forbids it
	RuleOrder             = "order"              // a key's events out of order, skipped, or in two partitions
	RuleSlotAhead         = "slot-ahead"         // the slot confirmed WAL the server had not written
	RuleTwoLeaders        = "two-leaders"        // two relays reported leadership at once
	RuleSlowStop          = "slow-stop"          // a SIGTERM took longer than shutdown_timeout
	RuleRSS               = "rss"                // a relay's RSS above the bound
	RuleHarness           = "harness"            // the history contradicts itself: a bug of the harness
	RuleNotCarriedOut     = "not-carried-out"    // the run could not be judged: its outcomes could not be settled
	RuleExit              = "exit"               // a relay ended of its own accord, or a SIGTERM did not end it with 0
	RuleCrash             = "crash"              // a panic, fatal runtime error or data race in a relay's output
	RuleHangingTxn        = "hanging-txn"        // a partition's last stable offset below its high watermark at the end
	RuleContent           = "content"            // a record's payload or headers differ from what was committed
)

// maxEvents bounds Violation.Events, so that a run that lost a million events still gives a
// readable report.
const maxEvents = 20

// Violation is one broken rule.
type Violation struct {
	Rule    string    // one of the Rule* constants
	At      time.Time // when it happened (or the run's end for "never delivered")
	Message string    // what broke, in one line, naming the key/event/relay
	Events  []string  // the event ids involved (at most 20)
}

// Check returns every violation of h, ordered by At, then Rule, then Message.
func Check(h *history.History) []Violation {
	return analyze(h).vs
}

// analyze runs every rule once; Check keeps the violations, Summarize the counts. Only faults
// that took effect are seen: a failed or skipped one excuses nothing.
func analyze(h *history.History) *run {
	h = tookEffect(h)
	r := newRun(h)
	if h.Unsettled != "" {
		// The outcomes are unknown: every rule that judges events by them would only guess.
		r.add(Violation{Rule: RuleNotCarriedOut, At: h.End,
			Message: "the run was not carried out: the writers' transactions could not be settled, so no outcome is known: " + h.Unsettled})
	} else {
		r.checkTxns()
		r.scanReads()
		r.checkConsumers()
		r.checkLost()
		r.checkReplaySizes()
		r.findDeliveries()
		r.checkLiveness()
		r.checkSlotBehind()
	}
	r.checkSlots()
	r.checkLeaders()
	r.checkStops()
	r.checkRSS()
	r.checkExits()
	r.checkEndOffsets()
	slices.SortStableFunc(r.vs, func(a, b Violation) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Rule, b.Rule); c != 0 {
			return c
		}
		return cmp.Compare(a.Message, b.Message)
	})
	return r
}

// tookEffect returns h with only the faults that took effect (h itself when all did).
func tookEffect(h *history.History) *history.History {
	if !slices.ContainsFunc(h.Faults, func(f history.Fault) bool { return !f.TookEffect() }) {
		return h
	}
	c := *h
	c.Faults = slices.DeleteFunc(slices.Clone(h.Faults), func(f history.Fault) bool { return !f.TookEffect() })
	return &c
}

// run is one analysis of a history. Events are numbered densely (in the order the transactions
// list them) so that per-consumer bookkeeping is a slice, not a map: a 30-minute run holds about a
// million events and two million reads.
type run struct {
	h    *history.History
	evs  []evInfo
	byID map[string]int32 // event id -> index in evs

	keys []string // key id -> key
	// committed lists, per key id, the key's committed events in Seq order; evInfo.pos is an
	// event's place in it.
	committed [][]int32

	consumers []*consumer
	replay    []history.Fault // the faults that can make a relay publish again, by start
	windows   []span          // per replay fault: from its lookback's start to its window's end
	// recoveries are the slot-lost faults, by start; recoveryWindows, per recovery, from the
	// oldest commit its gap may hold to the end of the window in which the gap is published.
	recoveries      []history.Fault
	recoveryWindows []span

	vs []Violation

	// replayed counts, per consumer and fault of r.replay, the repeats that fault explains, and
	// replayTxn the largest transaction among them (the partial one of the duplicate bound).
	replayed  map[string][]int
	replayTxn map[string][]int
	byCause   map[string]int // repeats by the kind of the fault whose replay explains them
	txnFirst  []time.Time    // per txn: txnPublished, filled on first use

	delivered []time.Time // per event: its first delivery (findDeliveries); zero: never
	worst     stall       // the longest counted wait (checkLiveness)

	// counts for Summarize
	duplicates      map[string]int // repeated deliveries by isolation
	recovered       map[string]int // of duplicates: a lost slot's gap published again, by isolation
	reordered       int            // first deliveries after a later Seq's
	gaps            int            // exactly-once deliveries that skipped a committed event
	committedEvents int
	lost            int // committed events some consumer never read
}

type evInfo struct {
	txn int32 // index in h.Txns
	ev  int32 // index in that txn's Events
	key int32
	pos int32 // place in committed[key]; -1 unless committed
	// vanishedSynced: the txn vanished in a failover protected by synchronized_standby_slots, so
	// none of its events may ever be delivered.
	vanishedSynced bool
	// maybe: the txn was in doubt across the kill of an unsynced failover and its marker row did
	// not survive: it may have committed on the old primary and been delivered from there.
	maybe bool
}

type consumer struct {
	name      string
	isolation string
	reads     []readRef // its reads of known events
	seen      []bool    // per event: read at least once
	first     []int32   // per event: the index in h.Reads of its first read, when seen
	mixed     bool      // reported reading under two isolations
}

// readRef is a read (index into h.Reads) of a known event (index into run.evs).
type readRef struct{ read, ev int32 }

// span is a closed interval of time.
type span struct{ from, to time.Time }

func newRun(h *history.History) *run {
	r := &run{h: h, duplicates: make(map[string]int), recovered: make(map[string]int), byCause: make(map[string]int)}
	var away []span
	for _, f := range h.Faults {
		if !noReplay[f.Kind] && r.canReplay(f) {
			r.replay = append(r.replay, f)
		}
		if kafkaAway[f.Kind] && (!relayFaults[f.Kind] || r.ledDuring(f)) {
			// A relay's own cut from Kafka holds the slot still only if that relay streamed it
			// (before the cut, or once it took over during it).
			away = append(away, span{f.Start, faultEnd(f)})
		}
		if f.Kind == faultSlotLost || f.Kind == faultSlotInvalidated {
			r.recoveries = append(r.recoveries, f)
		}
	}
	slices.SortFunc(r.replay, func(a, b history.Fault) int { return a.Start.Compare(b.Start) })
	slices.SortFunc(r.recoveries, func(a, b history.Fault) int { return a.Start.Compare(b.Start) })
	relayBack := relayLookback(h.Settings)
	relayClusters := awayClusters(slices.Clone(away), relayBack, h.Settings.ReplayWindow)
	clusters := awayClusters(away, replayLookback, h.Settings.ReplayWindow)
	for _, f := range r.replay {
		back, cl := replayLookback, clusters
		if relayFaults[f.Kind] && relayBack > 0 {
			back, cl = relayBack, relayClusters
		}
		r.windows = append(r.windows, stretch(cl, span{f.Start.Add(-back), faultEnd(f).Add(h.Settings.ReplayWindow)}))
	}
	for _, f := range r.recoveries {
		r.recoveryWindows = append(r.recoveryWindows, stretch(clusters, span{f.Start.Add(-gapLookback), faultEnd(f).Add(h.Settings.ReplayWindow)}))
	}
	return r
}

// faultSlotLost is the fault kind that drops a mode's slot under its relays, which run with
// on_slot_lost: recover: the relay publishes the gap again from the outbox table, at least once
// even under exactly-once (docs/guarantees.md, "Lost slot, no lost events").
const faultSlotLost = "slot-lost"

// faultSlotInvalidated loses the slot as max_slot_wal_keep_size does (PostgreSQL invalidates it
// while its relays are cut off): judged as faultSlotLost, from Lost, when it was seen invalidated.
const faultSlotInvalidated = "slot-invalidated"

// gapLookback is how long before a slot's loss a transaction of its gap may have committed: the
// gap starts at the horizon recorded with the last acknowledged commit, which trails the relay by
// the ledger's 5 s recording and the horizon's 5 s sampling, and by the oldest transaction
// running when the horizon was sampled (a big transaction of 100,000 events runs for a minute
// on a loaded machine). Time when Kafka was away stretches it, as it does a replay's.
const gapLookback = 3 * time.Minute

// recoveryCommitSlack is how long after the slot's drop a writer may note a commit that came
// before it: the writer notes the acknowledgement a moment after the server's commit.
const recoveryCommitSlack = 2 * time.Second

// inRecoveredGap reports whether a repeat of event ei appended at again is the recovery of a lost
// slot publishing its gap again: the repeat appended from the loss's start to the window after
// its recovery ended, and the event's transaction committed before the slot was dropped and not
// longer than gapLookback before the fault began. Nothing else: a repeat of an event committed
// after the drop, or published again outside the window, is not the recovery's.
func (r *run) inRecoveredGap(ei int32, again time.Time) bool {
	t, _ := r.event(ei)
	committed := t.End
	if committed.IsZero() {
		committed = t.Start
	}
	for i, f := range r.recoveries {
		if f.Start.After(again) {
			break
		}
		w := r.recoveryWindows[i]
		lost := f.Lost
		if lost.IsZero() {
			lost = f.Start
		}
		if again.After(w.to) || committed.Before(w.from) || committed.After(lost.Add(recoveryCommitSlack)) {
			continue
		}
		return true
	}
	return false
}

func faultEnd(f history.Fault) time.Time {
	if f.End.Before(f.Start) {
		return f.Start
	}
	return f.End
}

// kafkaAway are the fault kinds during which relays cannot reach Kafka: nothing is acknowledged,
// so the slot's confirmed position stands still, and a replay cannot make progress.
var kafkaAway = map[string]bool{"broker-stop": true, "broker-pause": true, "cut-kafka": true, "cut-both": true, "net-oneway-kafka": true, "cut-heal-open": true,
	"broker-kill": true, "leader-change": true, "coordinator-move": true, "isr-shrink": true}

// awayCluster is a run of times when Kafka was away, near enough to each other that a replay's
// lookback (before) or window (after) around one reaches the next: raw is when Kafka was away,
// reach that widened by before and after.
type awayCluster struct{ raw, reach span }

// awayClusters merges the times Kafka was away (kafkaAway) into clusters, in time order.
func awayClusters(away []span, before, after time.Duration) []awayCluster {
	slices.SortFunc(away, func(a, b span) int { return a.from.Compare(b.from) })
	var out []awayCluster
	for _, a := range away {
		reach := span{a.from.Add(-before), a.to.Add(after)}
		if n := len(out); n > 0 && !reach.from.After(out[n-1].reach.to) {
			c := &out[n-1]
			c.raw.to = maxTime(c.raw.to, a.to)
			c.reach.to = maxTime(c.reach.to, reach.to)
			continue
		}
		out = append(out, awayCluster{raw: a, reach: reach})
	}
	return out
}

// stretch widens w by every cluster of Kafka's absence that it touches: a minute of replay
// lookback before a fault means a minute of Kafka being there, and so does the window after it.
func stretch(clusters []awayCluster, w span) span {
	for _, c := range clusters {
		if c.raw.to.Before(w.from) || c.raw.from.After(w.to) {
			continue
		}
		if c.reach.from.Before(w.from) {
			w.from = c.reach.from
		}
		w.to = maxTime(w.to, c.reach.to)
	}
	return w
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// noReplay are the fault kinds that are no replay: load, a big transaction, a schema change and a
// neighbour starting change what is written, not what is confirmed; a lost slot's recovery
// publishes its gap again, which inRecoveredGap judges by the gap's own bounds.
var noReplay = map[string]bool{"other-load": true, "big-tx": true, "add-column": true, "neighbour": true, faultSlotLost: true,
	faultSlotInvalidated: true, "prune": true, "standby-lag": true}

// replayLookback is how long before a fault an event's first copy may have been appended for a
// copy after the fault to be its replay: what was handed to Kafka but not confirmed to the slot
// when the fault began, which a standby's copy of the slot may trail by up to 30 s (an unsynced
// failover), or an unacknowledged exactly-once transaction held.
const replayLookback = time.Minute

// relayLookback is how long before a relay's fault an event's first copy may have been appended
// for a repeat to be that fault's replay (docs/guarantees.md, "Bounded duplicates"): what was
// acknowledged in the last status_interval before it reached PostgreSQL only with the next status
// update and once a publication check (every half status_interval) covered it, hence two; what
// was in flight may have been appended up to kafka.write_timeout before its acknowledgement was
// due; and replayCheckSlack for the check itself and the sampling of append times. The partly
// acknowledged transaction is excused by explainedBy; Kafka's absence stretches it as it does
// replayLookback. 0 when the history does not record the parts.
func relayLookback(st history.Settings) time.Duration {
	if st.StatusInterval <= 0 || st.KafkaWriteTimeout <= 0 {
		return 0
	}
	return 2*st.StatusInterval + st.KafkaWriteTimeout + replayCheckSlack
}

// replayCheckSlack: see relayLookback.
const replayCheckSlack = time.Second

// txnPublished is when the last event of event ei's transaction was first appended, by any
// consumer's reads (zero when none was read).
func (r *run) txnPublished(ei int32) time.Time {
	if r.txnFirst == nil {
		r.txnFirst = make([]time.Time, len(r.h.Txns))
		firsts := make([]time.Time, len(r.evs))
		for i := range r.h.Reads {
			rd := &r.h.Reads[i]
			if e, ok := r.byID[rd.EventID]; ok && (firsts[e].IsZero() || rd.Appended.Before(firsts[e])) {
				firsts[e] = rd.Appended
			}
		}
		for e, at := range firsts {
			t := r.evs[e].txn
			r.txnFirst[t] = maxTime(r.txnFirst[t], at)
		}
	}
	return r.txnFirst[r.evs[ei].txn]
}

// explained reports whether a repeat of an event appended at again, whose first copy was appended
// at first, is a replay of some fault: the repeat within the fault or ReplayWindow after it, the
// first copy before the fault ended (a replay publishes again what was already out) and not
// longer than replayLookback before it began. Time when Kafka was away does not count against
// either bound: the slot's position stands still then, and a replay waits (a broker's restart took
// a minute on a loaded machine, and a kill during the next outage replayed three minutes).
func (r *run) explained(first, again time.Time) bool {
	return r.explainedBy(first, again, -1) >= 0
}

// explainedBy is explained's fault: its index in r.replay, the latest to begin of those that
// explain the repeat (the one nearest to it); -1 when none does. With the event ei (-1: not
// known), a first copy before the lookback is still the fault's when a later event of its
// transaction was first published within it: the partly acknowledged transaction, which is
// confirmed only as a whole.
func (r *run) explainedBy(first, again time.Time, ei int32) int {
	by, _ := r.explainedByAll(first, again, ei)
	return by
}

// explainedByAll is explainedBy, and whether PostgreSQL's restart or failover (serverDies, whose
// replay checkReplaySizes does not size) explains the repeat too.
func (r *run) explainedByAll(first, again time.Time, ei int32) (by int, server bool) {
	by = -1
	for i, f := range r.replay {
		if f.Start.After(again) {
			break
		}
		w := r.windows[i]
		if again.After(w.to) {
			continue
		}
		if first.After(faultEnd(f).Add(replaySlack)) || (first.Before(w.from) && (ei < 0 || r.txnPublished(ei).Before(w.from))) {
			continue
		}
		by = i
		server = server || serverDies[f.Kind]
	}
	return by, server
}

// replaySlack is how long after a fault healed a copy sent during it may be appended: a broker
// resumed from SIGSTOP works off the requests queued on its sockets, seconds of them (a poller's
// retry appended 3 s after a 10 s freeze, next to its first copy, in a 30-minute run).
const replaySlack = 10 * time.Second

func (r *run) add(v Violation) {
	if len(v.Events) > maxEvents {
		v.Events = v.Events[:maxEvents]
	}
	r.vs = append(r.vs, v)
}

func (r *run) event(i int32) (*history.Txn, *history.Event) {
	e := r.evs[i]
	t := &r.h.Txns[e.txn]
	return t, &t.Events[e.ev]
}

// merge sorts spans and joins those that overlap or touch.
func merge(ss []span) []span {
	slices.SortFunc(ss, func(a, b span) int { return a.from.Compare(b.from) })
	out := ss[:0]
	for _, s := range ss {
		if n := len(out); n > 0 && !s.from.After(out[n-1].to) {
			if s.to.After(out[n-1].to) {
				out[n-1].to = s.to
			}
			continue
		}
		out = append(out, s)
	}
	return out
}
