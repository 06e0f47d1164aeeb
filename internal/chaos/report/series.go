package report

import (
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// series is a run reduced to one-second bins: bin i holds what happened in [Start+i s, Start+i+1 s).
// A 30-minute run has 1,800 bins whatever its number of reads, so drawing stays cheap; a point per
// record would make a long run's SVG tens of megabytes and no easier to read.
type series struct {
	bins      int
	written   []float64            // events of committed transactions, by the transaction's End
	delivered map[string][]float64 // per consumer: first deliveries, by Appended
	dups      map[string][]float64 // per consumer: duplicate reads so far, at the end of each bin
	consumers []string             // sorted
}

// span is how many seconds the time axis covers: the run's End, or the latest thing recorded if
// that is later (or End is unset), so nothing recorded falls off the right edge.
func span(h *history.History) float64 {
	last := h.End
	later := func(t time.Time) {
		if t.After(last) {
			last = t
		}
	}
	for i := range h.Txns {
		later(h.Txns[i].End)
	}
	for i := range h.Reads {
		later(h.Reads[i].Appended)
	}
	for i := range h.Faults {
		later(h.Faults[i].End)
	}
	for i := range h.Relays {
		later(h.Relays[i].At)
	}
	for i := range h.Slots {
		later(h.Slots[i].At)
	}
	s := last.Sub(h.Start).Seconds()
	if s < 1 {
		return 1
	}
	return s
}

// bin is the index of t's one-second bin, false when t is outside [Start, Start+n s).
func bin(start, t time.Time, n int) (int, bool) {
	d := t.Sub(start)
	if d < 0 {
		return 0, false
	}
	i := int(d / time.Second)
	return i, i < n
}

// perSecond bins the run's writes, deliveries and duplicates. It makes one pass over the reads and
// keeps one set of event ids per consumer: a read is a duplicate when its consumer has already read
// that event id, whichever partition or offset it came from (a replay lands at a new offset).
func perSecond(h *history.History, bins int) *series {
	s := &series{
		bins:      bins,
		written:   make([]float64, bins),
		delivered: map[string][]float64{},
		dups:      map[string][]float64{},
	}
	for i := range h.Txns {
		tx := &h.Txns[i]
		if tx.Outcome != history.Committed || len(tx.Events) == 0 {
			continue // rolled back, still in doubt, or an outcome this package does not know
		}
		if b, ok := bin(h.Start, tx.End, bins); ok {
			s.written[b] += float64(len(tx.Events))
		}
	}
	seen := map[string]map[string]struct{}{}
	for i := range h.Reads {
		r := &h.Reads[i]
		ids, ok := seen[r.Consumer]
		if !ok {
			ids = make(map[string]struct{}, len(h.Reads)/2)
			seen[r.Consumer] = ids
			s.delivered[r.Consumer] = make([]float64, bins)
			s.dups[r.Consumer] = make([]float64, bins)
			s.consumers = append(s.consumers, r.Consumer)
		}
		_, dup := ids[r.EventID]
		if !dup {
			ids[r.EventID] = struct{}{}
		}
		b, ok := bin(h.Start, r.Appended, bins)
		if !ok {
			continue
		}
		if dup {
			s.dups[r.Consumer][b]++
		} else {
			s.delivered[r.Consumer][b]++
		}
	}
	for _, d := range s.dups {
		for i := 1; i < len(d); i++ {
			d[i] += d[i-1]
		}
	}
	slices.Sort(s.consumers)
	return s
}

// point is one point of a line, in seconds since Start.
type point struct{ x, y float64 }

// maxPerSecond reduces n samples to the largest value seen in each second, per series name: sampled
// gauges (slot lag, RSS) are drawn from this, and the largest value is the one a bound is about.
// at returns sample i, ok false to leave it out. Bins without a sample are left out rather than
// drawn as zero.
func maxPerSecond(start time.Time, bins int, n int, at func(int) (name string, t time.Time, v float64, ok bool)) (map[string][]point, []string) {
	type acc struct {
		v   []float64
		has []bool
	}
	accs := map[string]*acc{}
	var names []string
	for i := range n {
		name, t, v, ok := at(i)
		if !ok {
			continue
		}
		b, ok := bin(start, t, bins)
		if !ok {
			continue
		}
		a := accs[name]
		if a == nil {
			a = &acc{v: make([]float64, bins), has: make([]bool, bins)}
			accs[name] = a
			names = append(names, name)
		}
		if !a.has[b] || v > a.v[b] {
			a.v[b], a.has[b] = v, true
		}
	}
	out := make(map[string][]point, len(accs))
	for name, a := range accs {
		var pts []point
		for b := range a.v {
			if a.has[b] {
				pts = append(pts, point{float64(b) + 0.5, a.v[b]})
			}
		}
		out[name] = pts
	}
	slices.Sort(names)
	return out, names
}

// leaderState is what a relay was doing between two of its samples.
type leaderState int

const (
	down leaderState = iota
	follower
	leading
)

// stateRun is one stretch of a relay in one state, in seconds since Start.
type stateRun struct {
	from, to float64
	state    leaderState
}

// leadership turns each relay's samples into runs of one state: a sample's state holds until the
// relay's next sample. Consecutive samples in the same state merge, so a 30-minute run draws a
// handful of segments per relay, not one per scrape.
func leadership(h *history.History) (map[string][]stateRun, []string) {
	byRelay := map[string][]history.RelaySample{}
	var names []string
	for _, s := range h.Relays {
		if _, ok := byRelay[s.Relay]; !ok {
			names = append(names, s.Relay)
		}
		byRelay[s.Relay] = append(byRelay[s.Relay], s)
	}
	slices.Sort(names)
	out := make(map[string][]stateRun, len(byRelay))
	for name, ss := range byRelay {
		slices.SortStableFunc(ss, func(a, b history.RelaySample) int { return a.At.Compare(b.At) })
		var runs []stateRun
		for i := 0; i+1 < len(ss); i++ {
			st := down
			switch {
			case ss[i].Up && ss[i].Leader:
				st = leading
			case ss[i].Up:
				st = follower
			}
			from := ss[i].At.Sub(h.Start).Seconds()
			to := ss[i+1].At.Sub(h.Start).Seconds()
			if n := len(runs); n > 0 && runs[n-1].state == st && runs[n-1].to == from {
				runs[n-1].to = to
				continue
			}
			runs = append(runs, stateRun{from: from, to: to, state: st})
		}
		out[name] = runs
	}
	return out, names
}
