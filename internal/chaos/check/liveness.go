package check

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// RuleUnavailable: a committed event delivered later than the liveness bound allows while the
// servers were there, or a window of the fault period without commits or deliveries.
const RuleUnavailable = "unavailable"

// liveWindow is the liveness rule's window: every one of the fault period has commits and
// deliveries, unless something the docs explain held them up.
const liveWindow = 10 * time.Second

// serverAway are the fault kinds during which PostgreSQL or the broker is away for everyone: no
// event can be committed or delivered then, so that time does not count against the bound.
var serverAway = map[string]bool{
	"broker-stop": true, "broker-pause": true, "pg-restart": true, "pg-restart-immediate": true,
	faultFailoverSynced: true, faultFailoverUnsynced: true,
	// A frozen primary answers nobody; a stopped standby that synchronized_standby_slots lists
	// holds every failover slot's walsender and every poller's batch until it streams again.
	"pg-freeze": true, "standby-stop": true,
	// Three brokers: below min.insync.replicas no write is acknowledged; a killed broker's or the
	// coordinator's partitions wait for the controller to fence it (4.5 s) and elect another.
	"isr-shrink": true, "broker-kill": true, "coordinator-move": true, "leader-change": true,
}

// brokerFenced is how long a broker that stops answering on three brokers keeps its partitions:
// the controller fences it after broker.session.timeout.ms (4.5 s, internal/chaos/cluster) and
// elects another in-sync replica, which the producer finds at its next metadata refresh. A
// broker stopped cleanly hands its leaderships over at once; this bound covers it too.
const brokerFenced = 6 * time.Second

// replicatedAway are the fault kinds that take one broker of three away: the two others go on,
// so only the election counts as away, not the whole time until the broker restarts (a relay
// stuck on the dead leader for the rest of it is the bug a three-broker cluster is there to
// catch). Node 1 is the only KRaft controller: while it is away nothing is elected, and its own
// partitions wait for its return.
var replicatedAway = map[string]bool{"broker-kill": true, "broker-stop": true, "broker-pause": true, "coordinator-move": true}

// awayUntil is when a server fault stops excusing a wait: its end, or for one broker of three
// (Target broker-N, which the nemesis sets only then) other than the controller's, the election.
func awayUntil(f history.Fault) time.Time {
	end := faultEnd(f)
	node, ok := strings.CutPrefix(f.Target, "broker-")
	if !replicatedAway[f.Kind] || !ok || node == "1" {
		return end
	}
	if elected := f.Start.Add(brokerFenced); elected.Before(end) {
		return elected
	}
	return end
}

// relayDown are the fault kinds that take one relay out (killed, stopped, frozen, cut off): when
// every relay of a mode is out at once, nobody can publish. A relay whose path is slowed (to 64
// KiB/s at worst) or whose replies are lost publishes nothing that counts either.
var relayDown = map[string]bool{"kill9": true, "sigterm": true, "pause": true, "cut-pg": true, "cut-kafka": true, "cut-both": true,
	"net-slow": true, "net-oneway-kafka": true, "net-oneway-pg": true, "cut-heal-open": true, "cut-leader-lock": true,
	"oom": true}

// bigTxnEvents is the size from which a transaction is a big one (the big-tx fault; writers
// commit one to four events otherwise): its events, and what commits behind it, wait until the
// relay has published it (PostgreSQL hands a transaction over only once it commits, and the
// relay publishes in commit order), which takes as long as its size does.
const bigTxnEvents = 100

// liveBound is how long after its commit an event may reach Kafka while the servers are there: a
// leader cut off from Kafka alone keeps the lock for leader_kafka_timeout (a paused or silent
// leader for its lease), the standby takes it at its next try (leader_retry_interval), and
// republishes; a request under way when the fault came may take kafka.write_timeout before it is
// retried (docs/guarantees.md, "What happens on each fault"). 0: the history does not record the
// parts, and the rule is not applied.
func liveBound(st history.Settings) time.Duration {
	if st.LeaderRetry <= 0 || st.KafkaWriteTimeout <= 0 {
		return 0
	}
	return max(st.Lease, st.LeaderKafkaTimeout) + st.LeaderRetry + st.KafkaWriteTimeout + st.LiveSlack
}

// stall is one event's wait that counts: from its commit (or from when what it waited behind
// legitimately was out) to its first delivery, less the time the servers or every relay were away.
type stall struct {
	ev        int32
	committed time.Time
	delivered time.Time
	counted   time.Duration
}

// checkLiveness applies the liveness rule (see RuleUnavailable) and keeps the worst stall.
func (r *run) checkLiveness() {
	h := r.h
	bound := liveBound(h.Settings)
	if bound <= 0 || len(r.consumers) == 0 {
		return
	}
	away := r.awaySpans(r.mainRelays())
	nbAway := r.awaySpans([]string{r.h.Mode + neighbourSuffix})
	mainSlot := ""
	if len(h.Slots) > 0 {
		mainSlot = h.Slots[0].Slot
	}
	clear := r.legitimateWaits()
	var over []stall
	for i := range r.evs {
		ei := int32(i)
		if r.evs[i].pos < 0 {
			continue
		}
		at := r.delivered[ei]
		if at.IsZero() {
			continue // lost: the lost rule's
		}
		t, _ := r.event(ei)
		from := t.End
		if from.Before(h.FaultsFrom) {
			from = h.FaultsFrom // before the faults began the relays were still starting
		}
		var held []span // big transactions' publications this event waited behind
		for _, c := range clear {
			if !c.holds(t.End) {
				continue
			}
			if c.publishing.to.IsZero() {
				from = maxTime(from, c.until)
			} else {
				held = append(held, c.publishing)
			}
		}
		if !at.After(from) {
			continue
		}
		gone := away
		if t.Slot != "" && mainSlot != "" && t.Slot != mainSlot {
			gone = nbAway // a neighbour's transaction: its own relay streams it
		}
		if len(held) > 0 {
			gone = merge(append(slices.Clone(gone), held...))
		}
		counted := at.Sub(from) - covered(gone, span{from, at})
		s := stall{ev: ei, committed: t.End, delivered: at, counted: counted}
		if counted > r.worst.counted {
			r.worst = s
		}
		if counted > bound {
			over = append(over, s)
		}
	}
	r.reportStalls(over, bound)
	r.checkWindows(away, clear, bound)
}

// neighbourSuffix ends the name of a mode's neighbour relay (the neighbour fault), the one relay
// that streams the neighbour's database and slot.
const neighbourSuffix = "-nb"

// mainRelays are the relays of the mode's own slot: those sampled.
func (r *run) mainRelays() []string {
	var relays []string
	for name := range samplesByRelay(r.h.Relays) {
		relays = append(relays, name)
	}
	slices.Sort(relays)
	return relays
}

// awaySpans are the merged times when PostgreSQL or the broker was away, or every one of relays
// (the relays that stream one slot) was out.
func (r *run) awaySpans(relays []string) []span {
	h := r.h
	var away []span
	down := make(map[string][]span)
	for _, f := range h.Faults {
		switch {
		case serverAway[f.Kind]:
			away = append(away, span{f.Start, awayUntil(f)})
		case relayDown[f.Kind]:
			down[f.Target] = append(down[f.Target], span{f.Start, faultEnd(f)})
		}
	}
	if len(relays) > 0 {
		all := merge(down[relays[0]])
		for _, name := range relays[1:] {
			all = intersect(all, merge(down[name]))
		}
		away = append(away, all...)
	}
	return merge(away)
}

// legit is a wait the docs explain: an event committed in [from, to] (a big transaction's own
// events, whatever it was published ahead of, a lost slot's gap and what committed during its
// recovery) may wait until until.
type legit struct {
	from, to, until time.Time
	what            string
	// publishing is the time the wait itself takes: for a big transaction from its first event's
	// delivery to its last's, for a recovery from the fault's start to the recovery's end. What
	// waits behind it is excused that time, not the wait before it (which the bound holds it to
	// like any event's). Zero: everything until until is excused.
	publishing span
}

func (l legit) holds(committed time.Time) bool {
	return !committed.Before(l.from) && !committed.After(l.to)
}

// legitimateWaits lists the documented waits: a big transaction is published in commit order once
// it committed, so what committed from its start until its last event reached Kafka waits for it;
// a lost slot's gap, and what committed during its recovery, wait until the recovery ended (the
// gap is published from the table first).
func (r *run) legitimateWaits() []legit {
	h := r.h
	var out []legit
	for ti := range h.Txns {
		t := &h.Txns[ti]
		if t.Outcome != history.Committed || len(t.Events) < bigTxnEvents {
			continue
		}
		var first, last time.Time
		for ei := range t.Events {
			if i, ok := r.byID[t.Events[ei].ID]; ok && !r.delivered[i].IsZero() {
				last = maxTime(last, r.delivered[i])
				if first.IsZero() || r.delivered[i].Before(first) {
					first = r.delivered[i]
				}
			}
		}
		if last.IsZero() {
			continue
		}
		out = append(out, legit{from: t.Start, to: last, until: last, publishing: span{first, last},
			what: fmt.Sprintf("big transaction %s (%d events)", t.ID, len(t.Events))})
	}
	for i, f := range r.recoveries {
		// What waits for the recovery is excused the recovery's own time, from the fault's start
		// to its end, not what it waited before the slot was lost (a stall before the loss is
		// one like any other).
		out = append(out, legit{from: r.recoveryWindows[i].from, to: faultEnd(f), until: faultEnd(f),
			publishing: span{f.Start, faultEnd(f)}, what: "lost slot's recovery"})
	}
	return out
}

// covered is how much of s the merged, sorted spans cover.
func covered(ss []span, s span) time.Duration {
	var d time.Duration
	for _, a := range ss {
		if !a.to.After(s.from) {
			continue
		}
		if !a.from.Before(s.to) {
			break
		}
		from, to := maxTime(a.from, s.from), a.to
		if s.to.Before(to) {
			to = s.to
		}
		d += to.Sub(from)
	}
	return d
}

// intersect is the intersection of two merged, sorted span lists.
func intersect(a, b []span) []span {
	var out []span
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		from, to := maxTime(a[i].from, b[j].from), a[i].to
		if b[j].to.Before(to) {
			to = b[j].to
		}
		if from.Before(to) {
			out = append(out, span{from, to})
		}
		if a[i].to.Before(b[j].to) {
			i++
		} else {
			j++
		}
	}
	return out
}

// reportStalls reports the events over the bound, one violation per stall: events whose waits
// overlap are one stall.
func (r *run) reportStalls(over []stall, bound time.Duration) {
	slices.SortFunc(over, func(a, b stall) int { return a.committed.Compare(b.committed) })
	for lo := 0; lo < len(over); {
		hi, until, worst := lo+1, over[lo].delivered, over[lo]
		for hi < len(over) && !over[hi].committed.After(until) {
			until = maxTime(until, over[hi].delivered)
			if over[hi].counted > worst.counted {
				worst = over[hi]
			}
			hi++
		}
		var ids []int32
		for _, s := range over[lo:min(hi, lo+maxEvents)] {
			ids = append(ids, s.ev)
		}
		_, e := r.event(worst.ev)
		r.add(Violation{Rule: RuleUnavailable, At: over[lo].committed, Events: r.ids(ids),
			Message: fmt.Sprintf("%d committed events waited longer than the liveness bound %v while the servers were there; the worst, %s (key %s seq %d), committed at %s and first delivered %v later (%v of it counted)",
				hi-lo, bound, e.ID, e.Key, e.Seq, offset(r.h, worst.committed), worst.delivered.Sub(worst.committed).Round(100*time.Millisecond), worst.counted.Round(100*time.Millisecond))})
		lo = hi
	}
}

// checkWindows requires every liveWindow of the fault period to have commits and deliveries
// (windows tiling each stretch of it at least that long that nothing excuses), unless PostgreSQL, the broker or every relay was away during it, a documented wait (a big
// transaction, a recovery) or a takeover may explain it. A takeover follows a fault of the relay
// that led (in poll, of any poller, for the fault and the bound after it): after a kill, a stop,
// a pause or a cut from PostgreSQL the standby leads within the lease and its next try, and
// publishes within a write timeout (takeover); after a cut from Kafka, within the whole bound
// (leader_kafka_timeout). A window without a commit is not a stall when the writers tried
// nothing in it (idle or paused); one without a delivery is not when nothing committed waited
// through it.
func (r *run) checkWindows(away []span, clear []legit, bound time.Duration) {
	h := r.h
	if h.FaultsFrom.IsZero() || !h.FaultsTo.After(h.FaultsFrom) {
		return
	}
	excused := slices.Clone(away)
	for _, c := range clear {
		if !c.publishing.to.IsZero() {
			excused = append(excused, c.publishing)
			continue
		}
		excused = append(excused, span{c.from, c.until})
	}
	st := h.Settings
	leaders := false
	for _, s := range h.Relays {
		leaders = leaders || s.Leader
	}
	for _, f := range h.Faults {
		switch {
		case !relayDown[f.Kind] || !r.ledBefore(f) || strings.HasSuffix(f.Target, neighbourSuffix):
			// (A neighbour's relay streams another slot: its outage excuses none of the mode's windows.)
		case !leaders:
			excused = append(excused, span{f.Start, faultEnd(f).Add(bound)})
		case f.Kind == "cut-kafka" || f.Kind == "cut-both" || f.Kind == "net-oneway-kafka":
			// Cut off from Kafka (its replies lost, too) the leader keeps its lock until
			// leader_kafka_timeout: the takeover comes within the whole bound.
			excused = append(excused, span{f.Start, f.Start.Add(bound)})
		default:
			excused = append(excused, span{f.Start, f.Start.Add(st.Lease + st.LeaderRetry + st.KafkaWriteTimeout)})
		}
	}
	excused = merge(excused)
	var commits, attempts []span
	for ti := range h.Txns {
		t := &h.Txns[ti]
		attempts = append(attempts, span{t.Start, maxTime(t.Start, t.End)})
		if t.Outcome == history.Committed && len(t.Events) > 0 {
			commits = append(commits, span{t.End, t.End})
		}
	}
	slices.SortFunc(commits, func(a, b span) int { return a.from.Compare(b.from) })
	attempts = merge(attempts)
	var deliveries []time.Time
	for i := range r.evs {
		if !r.delivered[i].IsZero() {
			deliveries = append(deliveries, r.delivered[i])
		}
	}
	slices.SortFunc(deliveries, func(a, b time.Time) int { return a.Compare(b) })
	for _, w := range windows(subtract([]span{{h.FaultsFrom, h.FaultsTo}}, excused)) {
		var missing []string
		if !anyIn(commits, w) && covered(attempts, w) > 0 {
			missing = append(missing, "no transaction committed although the writers were writing")
		}
		if !anyTimeIn(deliveries, w) && r.waitedThrough(w) {
			missing = append(missing, "no event delivered although a committed event waited through it")
		}
		if len(missing) > 0 {
			r.add(Violation{Rule: RuleUnavailable, At: w.from,
				Message: fmt.Sprintf("the window %s to %s of the fault period: %s, with PostgreSQL, the broker and a relay there",
					offset(h, w.from), offset(h, w.to), strings.Join(missing, "; "))})
		}
	}
}

// windows tiles each of the free spans at least liveWindow long with windows of liveWindow, the
// last one ending where its span ends (overlapping the one before it).
func windows(free []span) []span {
	var out []span
	for _, f := range free {
		if f.to.Sub(f.from) < liveWindow {
			continue
		}
		from := f.from
		for ; !from.Add(liveWindow).After(f.to); from = from.Add(liveWindow) {
			out = append(out, span{from, from.Add(liveWindow)})
		}
		if from.Before(f.to) {
			out = append(out, span{f.to.Add(-liveWindow), f.to})
		}
	}
	return out
}

func anyIn(sorted []span, w span) bool {
	i, _ := slices.BinarySearchFunc(sorted, w.from, func(s span, t time.Time) int { return s.from.Compare(t) })
	return i < len(sorted) && sorted[i].from.Before(w.to)
}

func anyTimeIn(sorted []time.Time, w span) bool {
	i, _ := slices.BinarySearchFunc(sorted, w.from, func(s, t time.Time) int { return s.Compare(t) })
	return i < len(sorted) && sorted[i].Before(w.to)
}

// waitedThrough reports whether some committed event was committed by the middle of w and first
// delivered only after its end (or never): it waited at least half a window, and the window
// delivered nothing at all.
func (r *run) waitedThrough(w span) bool {
	mid := w.from.Add(w.to.Sub(w.from) / 2)
	for i := range r.evs {
		if r.evs[i].pos < 0 {
			continue
		}
		t, _ := r.event(int32(i))
		if t.End.After(mid) {
			continue
		}
		if at := r.delivered[i]; at.IsZero() || !at.Before(w.to) {
			return true
		}
	}
	return false
}

// findDeliveries sets r.delivered: each committed event's first delivery, the earliest append
// time of the copies its consumers read first, counting under exactly-once only read_committed
// consumers (a read_uncommitted one also sees copies of aborted Kafka transactions).
func (r *run) findDeliveries() {
	h := r.h
	r.delivered = make([]time.Time, len(r.evs))
	for _, c := range r.consumers {
		if h.Settings.Delivery == history.ExactlyOnce && c.isolation != history.ReadCommitted {
			continue
		}
		for i := range r.evs {
			if !c.seen[i] {
				continue
			}
			at := h.Reads[c.first[i]].Appended
			if r.delivered[i].IsZero() || at.Before(r.delivered[i]) {
				r.delivered[i] = at
			}
		}
	}
}

// stallContext is how long before a stalled event's commit a fault that had ended by then is
// still named with it: what set the stall up, not the whole schedule.
const stallContext = 5 * time.Second

// stallText describes the worst stall for the summary, with the faults around it.
func (r *run) stallText() string {
	s := r.worst
	if s.counted <= 0 {
		return ""
	}
	h := r.h
	_, e := r.event(s.ev)
	var b strings.Builder
	fmt.Fprintf(&b, "%v counted (event %s, key %s, committed %s, delivered %v later)",
		s.counted.Round(100*time.Millisecond), e.ID, e.Key, offset(h, s.committed), s.delivered.Sub(s.committed).Round(100*time.Millisecond))
	var near []string
	for _, f := range h.Faults {
		if f.Start.Before(s.delivered) && faultEnd(f).After(s.committed.Add(-stallContext)) {
			near = append(near, fmt.Sprintf("%s %s %s", offset(h, f.Start), f.Kind, f.Target))
		}
	}
	if len(near) > 0 {
		fmt.Fprintf(&b, "; faults around it: %s", strings.Join(near, ", "))
	}
	return b.String()
}
