package check

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// minResolution is the floor of the leader metric's sampling resolution: below it, two relays'
// samples taken a moment apart cannot tell a handover from an overlap.
const minResolution = 500 * time.Millisecond

// checkSlots: the slot never confirms WAL the server has not written.
func (r *run) checkSlots() {
	for _, s := range r.h.Slots {
		if s.ConfirmedLSN > s.WALEnd {
			r.add(Violation{Rule: RuleSlotAhead, At: s.At,
				Message: fmt.Sprintf("slot %s confirmed %s, beyond the server's WAL end %s", s.Slot, lsn(s.ConfirmedLSN), lsn(s.WALEnd))})
		}
	}
}

func lsn(v uint64) string { return fmt.Sprintf("%X/%X", v>>32, uint32(v)) }

// checkStops: every SIGTERM ends within shutdown_timeout (and the slack the harness allows).
func (r *run) checkStops() {
	st := r.h.Settings
	limit := st.ShutdownTimeout + st.StopSlack
	for _, s := range r.h.Stops {
		switch took := s.Exited.Sub(s.Signal); {
		case s.Exited.IsZero():
			r.add(Violation{Rule: RuleSlowStop, At: s.Signal,
				Message: fmt.Sprintf("relay %s had not exited when the harness gave up waiting after SIGTERM (shutdown_timeout %v)", s.Relay, st.ShutdownTimeout)})
		case took > limit:
			r.add(Violation{Rule: RuleSlowStop, At: s.Signal,
				Message: fmt.Sprintf("relay %s took %v to exit after SIGTERM (code %d), more than shutdown_timeout %v + slack %v",
					s.Relay, took.Round(time.Millisecond), s.Code, st.ShutdownTimeout, st.StopSlack)})
		}
	}
}

// checkRSS reports, per relay, the first sample above the bound and how far above it went.
func (r *run) checkRSS() {
	bound := r.h.Settings.RSSBound
	if bound <= 0 {
		return
	}
	type over struct {
		first time.Time
		n     int
		max   int64
	}
	by := make(map[string]*over)
	var relays []string
	for _, s := range r.h.Relays {
		if s.RSS <= bound {
			continue
		}
		o := by[s.Relay]
		if o == nil {
			o = &over{first: s.At}
			by[s.Relay] = o
			relays = append(relays, s.Relay)
		}
		if s.At.Before(o.first) {
			o.first = s.At
		}
		o.n++
		o.max = max(o.max, s.RSS)
	}
	for _, name := range relays {
		o := by[name]
		r.add(Violation{Rule: RuleRSS, At: o.first,
			Message: fmt.Sprintf("relay %s RSS above the bound of %s in %d samples, at most %s", name, mib(bound), o.n, mib(o.max))})
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// leadership is a stretch of time during which one relay said it was the leader.
type leadership struct {
	relay    string
	from, to time.Time
}

// serverDies are the fault kinds that end the primary's sessions, the leader lock's among them.
var serverDies = map[string]bool{"failover-synced": true, "failover-unsynced": true, "pg-restart": true, "pg-restart-immediate": true}

// checkLeaders: never two relays streaming at once. Each relay's leadership is the union of
// [a Leader=true sample, its next sample); two relays' stretches may overlap by up to the sampling
// resolution (their scrapes are taken at different moments), not more. A paused relay, and one
// resumed after a pause longer than its lease for the zombie grace, is exempt: that zombie window
// is documented (the next lease check fences it).
func (r *run) checkLeaders() {
	h := r.h
	by := samplesByRelay(h.Relays)
	threshold := resolution(by) * 3 / 2

	var all []leadership
	for _, name := range slices.Sorted(maps.Keys(by)) {
		mine := leaderships(by[name])
		var exempt []span
		for _, f := range h.Faults {
			if f.Kind != "pause" || f.Target != name {
				continue
			}
			to := f.End
			if f.End.Sub(f.Start) > h.Settings.Lease {
				to = f.End.Add(h.Settings.ZombieGrace)
			}
			exempt = append(exempt, span{f.Start, to})
		}
		// A primary that dies (killed for a failover, restarted) takes the leader's lock session
		// and its stream with it: a standby may lead on the next server at once, while the old
		// leader believes it leads until its next check fails, within the lease. It streams
		// nothing meanwhile (its server is gone), so the belief of a stretch begun before such a
		// fault is not held against it for Lease after the fault began; longer is.
		for _, f := range h.Faults {
			if !serverDies[f.Kind] {
				continue
			}
			for _, s := range mine {
				if s.from.Before(f.Start) && s.to.After(f.Start) {
					exempt = append(exempt, span{f.Start, f.Start.Add(h.Settings.Lease)})
				}
			}
		}
		for _, s := range subtract(mine, merge(exempt)) {
			all = append(all, leadership{relay: name, from: s.from, to: s.to})
		}
	}
	slices.SortStableFunc(all, func(a, b leadership) int {
		if c := a.from.Compare(b.from); c != 0 {
			return c
		}
		return cmp.Compare(a.relay, b.relay)
	})
	// A relay's own stretches are disjoint, so at most one per relay is active at a time.
	var active []leadership
	for _, l := range all {
		active = slices.DeleteFunc(active, func(a leadership) bool { return !a.to.After(l.from) })
		for _, a := range active {
			if a.relay == l.relay {
				continue
			}
			to := a.to
			if l.to.Before(to) {
				to = l.to
			}
			if d := to.Sub(l.from); d > threshold {
				r.add(Violation{Rule: RuleTwoLeaders, At: l.from,
					Message: fmt.Sprintf("relays %s and %s both reported leadership for %v (sampling resolution allows %v)",
						a.relay, l.relay, d.Round(time.Millisecond), threshold.Round(time.Millisecond))})
			}
		}
		active = append(active, l)
	}
}

// leaderships is the union of [a Leader=true sample, the relay's next sample) over a relay's
// samples sorted by time: when it said it was the leader.
func leaderships(ss []history.RelaySample) []span {
	var mine []span
	for i, s := range ss {
		if !s.Up || !s.Leader {
			continue
		}
		to := s.At
		if i+1 < len(ss) {
			to = ss[i+1].At
		}
		if n := len(mine); n > 0 && !s.At.After(mine[n-1].to) {
			mine[n-1].to = to
			continue
		}
		mine = append(mine, span{s.At, to})
	}
	return mine
}

func samplesByRelay(ss []history.RelaySample) map[string][]history.RelaySample {
	by := make(map[string][]history.RelaySample)
	for _, s := range ss {
		by[s.Relay] = append(by[s.Relay], s)
	}
	for _, list := range by {
		slices.SortStableFunc(list, func(a, b history.RelaySample) int { return a.At.Compare(b.At) })
	}
	return by
}

// resolution is the 95th percentile of the intervals between a relay's consecutive samples, at
// least minResolution: the data's own sampling period, tolerant of the odd slow scrape.
func resolution(by map[string][]history.RelaySample) time.Duration {
	var gaps []time.Duration
	for _, ss := range by {
		for i := 1; i < len(ss); i++ {
			gaps = append(gaps, ss[i].At.Sub(ss[i-1].At))
		}
	}
	if len(gaps) == 0 {
		return minResolution
	}
	slices.Sort(gaps)
	return max(gaps[(len(gaps)-1)*95/100], minResolution)
}

// subtract removes the merged, sorted spans cut from the sorted, disjoint spans ss.
func subtract(ss, cut []span) []span {
	var out []span
	j := 0
	for _, s := range ss {
		for j < len(cut) && !cut[j].to.After(s.from) {
			j++
		}
		from := s.from
		for k := j; k < len(cut) && cut[k].from.Before(s.to); k++ {
			if cut[k].from.After(from) {
				out = append(out, span{from, cut[k].from})
			}
			if cut[k].to.After(from) {
				from = cut[k].to
			}
		}
		if from.Before(s.to) {
			out = append(out, span{from, s.to})
		}
	}
	return out
}
