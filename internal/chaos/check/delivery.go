package check

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// Fault kinds of the two failovers: with synchronized_standby_slots PostgreSQL never hands the relay
// a transaction the standby lacks, so what the failover loses was never delivered.
const (
	faultFailoverSynced   = "failover-synced"
	faultFailoverUnsynced = "failover-unsynced"
)

// checkTxns indexes the events the writers wrote, flags what contradicts itself, and settles which
// vanished transactions must not have been delivered.
func (r *run) checkTxns() {
	h := r.h
	var failovers []history.Fault
	for _, f := range h.Faults {
		if f.Kind == faultFailoverSynced || f.Kind == faultFailoverUnsynced {
			failovers = append(failovers, f)
		}
	}
	slices.SortStableFunc(failovers, func(a, b history.Fault) int { return a.Start.Compare(b.Start) })

	txnAt := make(map[string]int, len(h.Txns))
	n := 0
	for _, t := range h.Txns {
		n += len(t.Events)
	}
	r.byID = make(map[string]int32, n)
	r.evs = make([]evInfo, 0, n)
	keyIDs := make(map[string]int32)
	for ti := range h.Txns {
		t := &h.Txns[ti]
		if first, dup := txnAt[t.ID]; dup {
			r.add(Violation{Rule: RuleHarness, At: t.Start,
				Message: fmt.Sprintf("txn %s listed twice (writers %s and %s)", t.ID, h.Txns[first].Writer, t.Writer)})
		} else {
			txnAt[t.ID] = ti
		}
		synced, maybe := false, false
		switch t.Outcome {
		case history.Committed, history.InDoubt:
		case history.RolledBack:
			// Settled from a marker row the surviving timeline lacks, after a COMMIT cut off by the
			// kill of a failover: it may have committed on the old primary, been delivered from
			// there, and vanished with it. Only the unsynced failover may hand such a one on.
			if i := failoverAfter(failovers, t.Start); t.Resolved && i < len(failovers) &&
				!failovers[i].Start.After(t.End.Add(inDoubtSlack)) {
				maybe = failovers[i].Kind == faultFailoverUnsynced
			}
		case history.Vanished:
			// The failover that lost it is the first one whose kill came after the transaction
			// began: its COMMIT was acknowledged before that kill, but the writer may note the
			// acknowledgement (End) a moment after it, when it is slow to be scheduled.
			i := failoverAfter(failovers, t.Start)
			if i == len(failovers) {
				r.add(Violation{Rule: RuleHarness, At: t.End, Events: eventIDs(t.Events),
					Message: fmt.Sprintf("txn %s (writer %s, %d events) vanished without a failover: the harness or the database lost a committed transaction",
						t.ID, t.Writer, len(t.Events))})
			} else {
				synced = failovers[i].Kind == faultFailoverSynced
			}
		default:
			r.add(Violation{Rule: RuleHarness, At: t.End,
				Message: fmt.Sprintf("txn %s (writer %s) has an unknown outcome %q", t.ID, t.Writer, t.Outcome)})
		}
		for ei := range t.Events {
			e := &t.Events[ei]
			if e.ID == "" {
				r.add(Violation{Rule: RuleHarness, At: t.Start,
					Message: fmt.Sprintf("txn %s writes an event without an id (key %s seq %d)", t.ID, e.Key, e.Seq)})
				continue
			}
			if prev, dup := r.byID[e.ID]; dup {
				r.add(Violation{Rule: RuleHarness, At: t.Start, Events: []string{e.ID},
					Message: fmt.Sprintf("event %s written by txn %s and again by txn %s", e.ID, h.Txns[r.evs[prev].txn].ID, t.ID)})
				continue
			}
			k, ok := keyIDs[e.Key]
			if !ok {
				k = int32(len(r.keys))
				keyIDs[e.Key] = k
				r.keys = append(r.keys, e.Key)
				r.committed = append(r.committed, nil)
			}
			i := int32(len(r.evs))
			r.byID[e.ID] = i
			r.evs = append(r.evs, evInfo{txn: int32(ti), ev: int32(ei), key: k, pos: -1, vanishedSynced: synced, maybe: maybe})
			if t.Outcome == history.Committed {
				r.committed[k] = append(r.committed[k], i)
			}
		}
	}
	for k, list := range r.committed {
		slices.SortStableFunc(list, func(a, b int32) int {
			_, ea := r.event(a)
			_, eb := r.event(b)
			return cmp.Compare(ea.Seq, eb.Seq)
		})
		for p, i := range list {
			r.evs[i].pos = int32(p)
			if p > 0 {
				ta, ea := r.event(list[p-1])
				tb, eb := r.event(i)
				if ea.Seq == eb.Seq {
					r.add(Violation{Rule: RuleHarness, At: tb.Start, Events: []string{ea.ID, eb.ID},
						Message: fmt.Sprintf("key %s: committed events %s (txn %s) and %s (txn %s) both have seq %d",
							r.keys[k], ea.ID, ta.ID, eb.ID, tb.ID, eb.Seq)})
				}
			}
		}
	}
}

// inDoubtSlack is how long before a failover's kill is recorded a writer may already have seen its
// COMMIT cut off by it: the kill is timed once the process is gone.
const inDoubtSlack = 2 * time.Second

// failoverAfter is the index of the first of the sorted failovers that began after at;
// len(failovers) when none did.
func failoverAfter(failovers []history.Fault, at time.Time) int {
	i, _ := slices.BinarySearchFunc(failovers, at, func(f history.Fault, at time.Time) int {
		if f.Start.After(at) {
			return 1
		}
		return -1
	})
	return i
}

// scanReads groups the reads by consumer and checks each read against the event written: does it
// exist, is it what was written, may it be delivered at all.
func (r *run) scanReads() {
	h := r.h
	byName := make(map[string]*consumer)
	reported := make(map[string]bool) // event ids already reported as phantom, rolled back or vanished
	var empty int
	var emptyFirst *history.Read
	// The consumers the run started, first: one that read nothing at all has lost everything.
	for _, hc := range h.Consumers {
		if byName[hc.Name] == nil {
			c := &consumer{name: hc.Name, isolation: hc.Isolation, seen: make([]bool, len(r.evs)), first: make([]int32, len(r.evs))}
			byName[hc.Name] = c
			r.consumers = append(r.consumers, c)
		}
	}
	for i := range h.Reads {
		rd := &h.Reads[i]
		c := byName[rd.Consumer]
		if c == nil {
			c = &consumer{name: rd.Consumer, isolation: rd.Isolation, seen: make([]bool, len(r.evs)), first: make([]int32, len(r.evs))}
			byName[rd.Consumer] = c
			r.consumers = append(r.consumers, c)
		} else if rd.Isolation != c.isolation && !c.mixed {
			c.mixed = true
			r.add(Violation{Rule: RuleHarness, At: rd.Appended,
				Message: fmt.Sprintf("consumer %s reads as both %s and %s", c.name, c.isolation, rd.Isolation)})
		}
		if rd.EventID == "" {
			if empty == 0 {
				emptyFirst = rd
			}
			empty++
			continue
		}
		ei, ok := r.byID[rd.EventID]
		if !ok {
			if !reported[rd.EventID] {
				reported[rd.EventID] = true
				r.add(Violation{Rule: RulePhantom, At: rd.Appended, Events: []string{rd.EventID},
					Message: fmt.Sprintf("consumer %s read event %s (key %s seq %d at %s) that no transaction wrote",
						c.name, rd.EventID, rd.Key, rd.Seq, where(rd))})
			}
			continue
		}
		c.reads = append(c.reads, readRef{read: int32(i), ev: ei})
		t, e := r.event(ei)
		if rd.Topic != e.Topic || rd.Key != e.Key || rd.Seq != e.Seq {
			if !reported[rd.EventID] {
				reported[rd.EventID] = true
				r.add(Violation{Rule: RulePhantom, At: rd.Appended, Events: []string{rd.EventID},
					Message: fmt.Sprintf("consumer %s read event %s as topic %s key %s seq %d (at %s); txn %s wrote topic %s key %s seq %d",
						c.name, e.ID, rd.Topic, rd.Key, rd.Seq, where(rd), t.ID, e.Topic, e.Key, e.Seq)})
			}
		}
		r.checkContent(c, rd, t, e, reported)
		switch {
		case t.Outcome == history.RolledBack && !r.evs[ei].maybe && !reported[e.ID]:
			reported[e.ID] = true
			r.add(Violation{Rule: RuleRolledBack, At: rd.Appended, Events: []string{e.ID},
				Message: fmt.Sprintf("consumer %s (%s) read event %s (key %s seq %d at %s) of txn %s, which rolled back",
					c.name, c.isolation, e.ID, e.Key, e.Seq, where(rd), t.ID)})
		case r.evs[ei].vanishedSynced && !reported[e.ID]:
			reported[e.ID] = true
			r.add(Violation{Rule: RuleVanishedDelivered, At: rd.Appended, Events: []string{e.ID},
				Message: fmt.Sprintf("consumer %s read event %s (key %s seq %d at %s) of txn %s, which a failover with synchronized_standby_slots lost",
					c.name, e.ID, e.Key, e.Seq, where(rd), t.ID)})
		}
	}
	if empty > 0 {
		r.add(Violation{Rule: RuleHarness, At: emptyFirst.Appended,
			Message: fmt.Sprintf("%d reads without an event id, the first by consumer %s at %s", empty, emptyFirst.Consumer, where(emptyFirst))})
	}
	slices.SortFunc(r.consumers, func(a, b *consumer) int { return cmp.Compare(a.name, b.name) })
}

// entry is one read of a known event, in the order the order rules walk them: by key, then by
// place in the log.
type entry struct {
	key   int32
	part  int32
	topic string
	off   int64
	readRef
}

// checkConsumers walks each consumer's reads key by key in log order: duplicates, order, gaps.
// The first read of an event in log order is its first delivery; later ones are repeats.
func (r *run) checkConsumers() {
	h := r.h
	for _, c := range r.consumers {
		strict := h.Settings.Delivery == history.ExactlyOnce && c.isolation == history.ReadCommitted
		es := make([]entry, len(c.reads))
		for j, ref := range c.reads {
			rd := &h.Reads[ref.read]
			es[j] = entry{key: r.evs[ref.ev].key, part: int32(rd.Partition), topic: rd.Topic, off: rd.Offset, readRef: ref}
		}
		c.reads = nil
		slices.SortFunc(es, func(a, b entry) int {
			if c := cmp.Compare(a.key, b.key); c != 0 {
				return c
			}
			if c := strings.Compare(a.topic, b.topic); c != 0 {
				return c
			}
			if c := cmp.Compare(a.part, b.part); c != 0 {
				return c
			}
			if c := cmp.Compare(a.off, b.off); c != 0 {
				return c
			}
			return cmp.Compare(a.read, b.read)
		})
		dupReported := make(map[int32]bool)
		for lo := 0; lo < len(es); {
			hi := lo + 1
			for hi < len(es) && es[hi].key == es[lo].key {
				hi++
			}
			r.walkKey(c, strict, es[lo:hi], dupReported)
			lo = hi
		}
	}
}

// walkKey checks one key's reads by one consumer, sorted in log order.
func (r *run) walkKey(c *consumer, strict bool, es []entry, dupReported map[int32]bool) {
	h := r.h
	key := r.keys[es[0].key]
	first := &h.Reads[es[0].read]
	split := false
	var prev *history.Read // the delivered committed event of highest Seq so far
	prevPos := int32(-1)
	var bad, reorders, gaps int
	var badAt *history.Read
	var badMsg string
	var badEvents []string
	var recovered []int // the places in es of repeats that were a lost slot's gap published again
	for j, en := range es {
		rd := &h.Reads[en.read]
		if !split && (rd.Topic != first.Topic || rd.Partition != first.Partition) {
			split = true
			r.add(Violation{Rule: RuleOrder, At: rd.Appended, Events: []string{first.EventID, rd.EventID},
				Message: fmt.Sprintf("key %s: consumer %s read it in two partitions: %s (event %s) and %s (event %s)",
					key, c.name, where(first), first.EventID, where(rd), rd.EventID)})
		}
		ei := en.ev
		if c.seen[ei] {
			r.duplicates[c.isolation]++
			first := &h.Reads[c.first[ei]]
			by, server := -1, false
			if !strict {
				by, server = r.explainedByAll(first.Appended, rd.Appended, ei)
			}
			replay := by >= 0
			if replay {
				r.countReplay(c, by, ei, !server)
			}
			if r.inRecoveredGap(ei, rd.Appended) {
				// A lost slot's gap, published again from the table: at least once under every
				// delivery. Unless another fault's replay may have sent it, it must be the key's
				// whole suffix from there (checked below).
				r.recovered[c.isolation]++
				if !replay {
					recovered = append(recovered, j)
				}
				continue
			}
			if dupReported[ei] {
				continue
			}
			if strict {
				dupReported[ei] = true
				r.add(Violation{Rule: RuleDuplicate, At: rd.Appended, Events: []string{rd.EventID},
					Message: fmt.Sprintf("key %s: consumer %s (exactly-once, read_committed) read event %s (seq %d) again at %s",
						key, c.name, rd.EventID, rd.Seq, where(rd))})
			} else if !replay {
				dupReported[ei] = true
				r.add(Violation{Rule: RuleDuplicate, At: rd.Appended, Events: []string{rd.EventID},
					Message: fmt.Sprintf("key %s: consumer %s (%s) read event %s (seq %d) again at %s (first at %s, %s earlier), not the replay of any fault",
						key, c.name, c.isolation, rd.EventID, rd.Seq, where(rd), where(first), rd.Appended.Sub(first.Appended).Round(time.Millisecond))})
			}
			continue
		}
		c.seen[ei], c.first[ei] = true, en.read
		pos := r.evs[ei].pos
		if pos < 0 {
			continue // not committed: rolled back (reported), vanished or in doubt (ignored)
		}
		_, e := r.event(ei)
		if prev != nil {
			switch {
			case pos < prevPos:
				reorders++
				bad++
				if badAt == nil {
					badAt = rd
					badMsg = fmt.Sprintf("key %s: consumer %s read seq %d (event %s at %s) after seq %d (event %s at %s)",
						key, c.name, e.Seq, e.ID, where(rd), r.seqOf(prev), prev.EventID, where(prev))
					badEvents = []string{prev.EventID, e.ID}
				}
			case strict && pos > prevPos+1:
				gaps++
				bad++
				if badAt == nil {
					skipped := r.committed[es[0].key][prevPos+1 : pos]
					_, s := r.event(skipped[0])
					badAt = rd
					badMsg = fmt.Sprintf("key %s: consumer %s read seq %d (event %s at %s) right after seq %d (event %s at %s), skipping committed seq %d (event %s)",
						key, c.name, e.Seq, e.ID, where(rd), r.seqOf(prev), prev.EventID, where(prev), s.Seq, s.ID)
					if len(skipped) > 1 {
						badMsg += fmt.Sprintf(" and %d more", len(skipped)-1)
					}
					badEvents = []string{prev.EventID, e.ID}
					for _, s := range skipped {
						_, se := r.event(s)
						badEvents = append(badEvents, se.ID)
					}
				}
			}
		}
		if pos > prevPos {
			prev, prevPos = rd, pos
		}
	}
	r.reordered += reorders
	r.gaps += gaps
	if bad > 1 {
		badMsg += fmt.Sprintf("; %d reads of this key out of order, %d gaps", reorders, gaps)
	}
	if badAt != nil {
		r.add(Violation{Rule: RuleOrder, At: badAt.Appended, Message: badMsg, Events: badEvents})
	}
	if len(recovered) > 0 {
		r.checkGapSuffix(c, key, es, recovered)
	}
}

// checkGapSuffix requires each copy a recovery published again to be followed by a copy of every
// later event of the key that Kafka held before it: a recovery publishes the key's events from
// the gap's start on, in insertion order, and then streams, so a consumer that keeps each event's
// last copy ends in the right state. A gap that started too late or skipped an event leaves that
// event's last copy before the gap's copy of an earlier one. (A zombie's or a replay's repeats
// are other faults', and may come back older than what follows them: not checked here.)
func (r *run) checkGapSuffix(c *consumer, key string, es []entry, recovered []int) {
	h := r.h
	list := r.committed[es[0].key]
	last := make(map[int32]int, len(es)) // event -> place in es of its last copy
	for j, en := range es {
		last[en.ev] = j
	}
	// minAfter[p]: of the events after place p in commit order, the one whose last copy comes
	// first (-1: none delivered).
	minAfter := make([]int32, len(list))
	best := int32(-1)
	for p := len(list) - 1; p >= 0; p-- {
		minAfter[p] = best
		if j, ok := last[list[p]]; ok && (best < 0 || j < last[best]) {
			best = list[p]
		}
	}
	for _, j := range recovered {
		ei := es[j].ev
		pos := r.evs[ei].pos
		if pos < 0 {
			continue
		}
		later := minAfter[pos]
		if later < 0 || last[later] > j {
			continue
		}
		rd, lrd := &h.Reads[es[j].read], &h.Reads[es[last[later]].read]
		_, e := r.event(ei)
		_, le := r.event(later)
		r.reordered++
		r.add(Violation{Rule: RuleOrder, At: rd.Appended, Events: []string{e.ID, le.ID},
			Message: fmt.Sprintf("key %s: consumer %s read seq %d (event %s) again at %s, published again by a lost slot's recovery, but the last copy of the later seq %d (event %s) came before it, at %s: the gap missed an event Kafka already held",
				key, c.name, e.Seq, e.ID, where(rd), le.Seq, le.ID, where(lrd))})
		return
	}
}

func (r *run) seqOf(rd *history.Read) int {
	_, e := r.event(r.byID[rd.EventID])
	return e.Seq
}

// checkLost reports, per consumer, the committed events it never read.
func (r *run) checkLost() {
	h := r.h
	missing := make([][]int32, len(r.consumers))
	counts := make([]int, len(r.consumers))
	var nobody []int32
	for i := range r.evs {
		if r.evs[i].pos < 0 {
			continue
		}
		r.committedEvents++
		lost := len(r.consumers) == 0
		if lost && len(nobody) < maxEvents {
			nobody = append(nobody, int32(i))
		}
		for ci, c := range r.consumers {
			if !c.seen[i] {
				lost = true
				counts[ci]++
				if len(missing[ci]) < maxEvents {
					missing[ci] = append(missing[ci], int32(i))
				}
			}
		}
		if lost {
			r.lost++
		}
	}
	if len(r.consumers) == 0 && r.lost > 0 {
		r.add(Violation{Rule: RuleLost, At: h.End, Events: r.ids(nobody),
			Message: fmt.Sprintf("no consumer read anything: %d committed events never delivered: %s", r.lost, r.describe(nobody))})
	}
	for ci, c := range r.consumers {
		if counts[ci] == 0 {
			continue
		}
		r.add(Violation{Rule: RuleLost, At: h.End, Events: r.ids(missing[ci]),
			Message: fmt.Sprintf("consumer %s (%s) never read %d of %d committed events: %s",
				c.name, c.isolation, counts[ci], r.committedEvents, r.describe(missing[ci]))})
	}
}

func (r *run) ids(evs []int32) []string {
	out := make([]string, len(evs))
	for i, ei := range evs {
		_, e := r.event(ei)
		out[i] = e.ID
	}
	return out
}

// describe names the first few events of evs with their key, seq and transaction.
func (r *run) describe(evs []int32) string {
	const shown = 3
	var b strings.Builder
	for i, ei := range evs {
		if i == shown {
			b.WriteString(", ...")
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		t, e := r.event(ei)
		fmt.Fprintf(&b, "%s (key %s seq %d, txn %s)", e.ID, e.Key, e.Seq, t.ID)
	}
	return b.String()
}

// where is a read's place in the log, topic/partition@offset.
func where(rd *history.Read) string {
	return fmt.Sprintf("%s/%d@%d", rd.Topic, rd.Partition, rd.Offset)
}

func eventIDs(es []history.Event) []string {
	n := min(len(es), maxEvents)
	out := make([]string, n)
	for i := range n {
		out[i] = es[i].ID
	}
	return out
}
