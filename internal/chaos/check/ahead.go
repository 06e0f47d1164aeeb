package check

import (
	"fmt"
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// RuleSlotAheadOfKafka: a slot confirmed past a committed transaction whose events were not yet
// readable in Kafka (guarantee 1: the confirmed position never passes what Kafka acknowledged).
const RuleSlotAheadOfKafka = "slot-ahead-of-kafka"

// checkSlotBehind holds every slot sample to the no-loss guarantee: its confirmed LSN at or below
// the commit LSN of the oldest committed transaction of its database not yet readable in Kafka at
// that moment.
//
// The writers record an upper bound of each commit's end (history.Txn.CommitLSN), so no false
// alarm is possible: a relay that keeps the guarantee confirms at most the end of the last
// transaction before X that Kafka acknowledged, which lies at or before X's commit record, which
// ends at or before X's recorded bound. What the bound costs is sensitivity: a slot confirmed
// just to X's own end, with no other WAL before the writer's read, goes unseen; a slot further
// ahead does not. Readable is the broker's append time of the first copy a consumer read (under
// exactly-once, a read_committed consumer's: the records are readable only once their Kafka
// transaction commits, later still): at or before the acknowledgement, which came before the
// relay confirmed, which came before the sample (taken after its query returned), so a correct
// relay is never caught by it either.
//
// Failovers: a transaction that survived a failover has the same LSN on the new timeline (its
// WAL was replicated), one that vanished is not committed and not compared; a commit read from
// a server that went away is not recorded. A lost slot's replacement starts at the server's
// current position, past its gap, which the recovery publishes from the table: from the drop on,
// the transactions committed before it are not held against the slot (the lost rule still is).
func (r *run) checkSlotBehind() {
	h := r.h
	if len(h.Slots) == 0 {
		return
	}
	type txn struct {
		lsn      uint64
		end      time.Time
		readable time.Time // zero: never
		slot     string
		id       string
	}
	var txns []txn
	for ti := range h.Txns {
		t := &h.Txns[ti]
		if t.Outcome != history.Committed || t.CommitLSN == 0 || len(t.Events) == 0 {
			continue
		}
		x := txn{lsn: t.CommitLSN, end: t.End, slot: t.Slot, id: t.ID}
		for ei := range t.Events {
			i, ok := r.byID[t.Events[ei].ID]
			if !ok {
				continue
			}
			at := r.readableAt(i)
			if at.IsZero() {
				x.readable = time.Time{}
				break
			}
			x.readable = maxTime(x.readable, at)
		}
		txns = append(txns, x)
	}
	// Per sample, the recoveries' excuse: transactions committed up to this time may be in a lost
	// slot's gap (zero: none). The gap runs to the replacement slot's creation, which the first
	// sample after the drop shows done (no sample reads a slot that does not exist): a
	// transaction committed after that sample is the replacement's to stream.
	type recovery struct{ lost, created time.Time }
	var recs []recovery
	for _, f := range r.recoveries {
		lost := f.Lost
		if lost.IsZero() {
			lost = f.Start
		}
		// A failover during the recovery (the slot-invalidated fault's variant) may lose the
		// replacement too: the recovery begins again on the new primary with another slot, whose
		// gap runs from the first drop to that slot's creation, after the failover.
		for _, o := range h.Faults {
			if (o.Kind == faultFailoverSynced || o.Kind == faultFailoverUnsynced) && o.Start.After(lost) && !o.Start.After(faultEnd(f)) {
				lost = maxTime(lost, o.Start)
			}
		}
		created := faultEnd(f)
		for _, s := range h.Slots {
			if s.At.After(lost) && s.At.Before(created) {
				created = s.At
			}
		}
		recs = append(recs, recovery{f.Lost, created})
		if recs[len(recs)-1].lost.IsZero() {
			recs[len(recs)-1].lost = f.Start
		}
	}
	excuseUntil := func(at time.Time) time.Time {
		var until time.Time
		for _, rc := range recs {
			if !at.Before(rc.lost) {
				until = maxTime(until, rc.created.Add(recoveryCommitSlack))
			}
		}
		return until
	}
	samples := slices.Clone(h.Slots)
	slices.SortFunc(samples, func(a, b history.SlotSample) int { return b.At.Compare(a.At) }) // latest first
	// The transactions not yet readable at a sample are those readable after it (or never):
	// walking the samples from the latest back, that set only grows.
	slices.SortFunc(txns, func(a, b txn) int {
		switch {
		case a.readable.IsZero() && b.readable.IsZero():
			return 0
		case a.readable.IsZero():
			return -1
		case b.readable.IsZero():
			return 1
		}
		return b.readable.Compare(a.readable)
	})
	reported := make(map[string]bool)
	for _, slot := range slotNames(samples) {
		// One sweep per distinct excuse, so that the running minimum never holds an excused one.
		for _, excused := range distinctExcuses(samples, excuseUntil) {
			j := 0
			var oldest *txn
			for si := range samples {
				s := &samples[si]
				if s.Slot != slot || !excuseUntil(s.At).Equal(excused) {
					continue
				}
				for ; j < len(txns) && (txns[j].readable.IsZero() || txns[j].readable.After(s.At)); j++ {
					x := &txns[j]
					if (x.slot != "" && x.slot != slot) || (!excused.IsZero() && !x.end.After(excused)) {
						continue
					}
					if oldest == nil || x.lsn < oldest.lsn {
						oldest = x
					}
				}
				if oldest == nil || s.ConfirmedLSN <= oldest.lsn || reported[slot+oldest.id] {
					continue
				}
				reported[slot+oldest.id] = true
				state := "never read"
				if !oldest.readable.IsZero() {
					state = fmt.Sprintf("first readable %v later", oldest.readable.Sub(s.At).Round(time.Millisecond))
				}
				r.add(Violation{Rule: RuleSlotAheadOfKafka, At: s.At,
					Message: fmt.Sprintf("slot %s confirmed %s, past txn %s (committed by %s, at or before %s), not yet readable in Kafka (%s)",
						slot, lsn(s.ConfirmedLSN), oldest.id, offset(h, oldest.end), lsn(oldest.lsn), state)})
			}
		}
	}
}

// readableAt is when event i could first be read: the earliest append time among its consumers'
// first copies (any consumer under at-least-once; read_committed ones under exactly-once, which
// findDeliveries already restricts delivered to).
func (r *run) readableAt(i int32) time.Time {
	if r.h.Settings.Delivery == history.ExactlyOnce {
		return r.delivered[i]
	}
	var at time.Time
	for _, c := range r.consumers {
		if !c.seen[i] {
			continue
		}
		if a := r.h.Reads[c.first[i]].Appended; at.IsZero() || a.Before(at) {
			at = a
		}
	}
	return at
}

func slotNames(ss []history.SlotSample) []string {
	var out []string
	for _, s := range ss {
		if !slices.Contains(out, s.Slot) {
			out = append(out, s.Slot)
		}
	}
	return out
}

func distinctExcuses(ss []history.SlotSample, excuse func(time.Time) time.Time) []time.Time {
	var out []time.Time
	for _, s := range ss {
		e := excuse(s.At)
		if !slices.ContainsFunc(out, e.Equal) {
			out = append(out, e)
		}
	}
	return out
}
