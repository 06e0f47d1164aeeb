package check

import (
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// relayFaults are the fault kinds aimed at one relay: they can make the mode publish something
// again only when that relay was streaming, that is led within one lease before the fault (a
// standby has nothing in flight), and a SIGTERM only when it was no clean stop.
var relayFaults = map[string]bool{"kill9": true, "sigterm": true, "pause": true, "cut-pg": true, "cut-kafka": true, "cut-both": true,
	"net-slow": true, "net-oneway-kafka": true, "net-oneway-pg": true, "cut-heal-open": true, "cut-leader-lock": true,
	"oom": true}

// canReplay reports whether fault f can cause a replay (docs/guarantees.md, "Bounded
// duplicates"): a fault that ends or freezes a server always can; one aimed at a relay only if the
// relay led within one lease before it (every poller publishes, so in a mode without leadership
// every relay counts), and a SIGTERM only if the process did not stop cleanly within
// shutdown_timeout (a clean stop publishes nothing twice).
func (r *run) canReplay(f history.Fault) bool {
	if !relayFaults[f.Kind] {
		return true
	}
	h := r.h
	if f.Kind == "sigterm" {
		for _, s := range h.Stops {
			if s.Relay != f.Target || s.Signal.Before(f.Start.Add(-time.Second)) || s.Signal.After(faultEnd(f)) {
				continue
			}
			if !s.Exited.IsZero() && s.Code == 0 && s.Exited.Sub(s.Signal) <= h.Settings.ShutdownTimeout {
				return false
			}
		}
	}
	return r.ledBefore(f)
}

// ledBefore reports whether relay fault f's target led within one lease before the fault began;
// in a mode without leadership (poll: every poller publishes) every relay counts.
func (r *run) ledBefore(f history.Fault) bool {
	h := r.h
	if strings.HasSuffix(f.Target, neighbourSuffix) {
		// A neighbour's relay is the one relay of its slot, always streaming it, and not
		// sampled (h.Relays holds the mode's own).
		return true
	}
	anyLeader := false
	for _, s := range h.Relays {
		if !s.Leader {
			continue
		}
		anyLeader = true
		if s.Relay == f.Target && !s.At.Before(f.Start.Add(-h.Settings.Lease)) && !s.At.After(f.Start) {
			return true
		}
	}
	return !anyLeader
}

// ledDuring reports whether relay fault f's target led from one lease before the fault began
// until it ended (a standby cut off may take over meanwhile); in a mode without leadership every
// relay counts.
func (r *run) ledDuring(f history.Fault) bool {
	if r.ledBefore(f) {
		return true
	}
	for _, s := range r.h.Relays {
		if s.Leader && s.Relay == f.Target && !s.At.Before(f.Start) && !s.At.After(faultEnd(f)) {
			return true
		}
	}
	return false
}

// countReplay notes that fault by of r.replay explains a repeat of event ei read by c; sized
// says whether the repeat counts towards by's replay size (checkReplaySizes): not when
// PostgreSQL's restart or failover explains it too, whose replay the docs bound by a checkpoint
// interval instead (a relay killed just after an immediate restart must not be charged with the
// restart's replay).
func (r *run) countReplay(c *consumer, by int, ei int32, sized bool) {
	if r.replayed == nil {
		r.replayed, r.replayTxn = make(map[string][]int), make(map[string][]int)
	}
	if r.replayed[c.name] == nil {
		r.replayed[c.name], r.replayTxn[c.name] = make([]int, len(r.replay)), make([]int, len(r.replay))
	}
	r.byCause[r.replay[by].Kind]++
	if !sized {
		return
	}
	r.replayed[c.name][by]++
	t, _ := r.event(ei)
	r.replayTxn[c.name][by] = max(r.replayTxn[c.name][by], len(t.Events))
}

// checkReplaySizes holds each relay fault's replay to the documented bound: at most what was in
// flight (max_in_flight_events), plus what was acknowledged in the last status_interval before it
// (counted as the consumer's first deliveries in two status intervals before the fault, and until
// the lease after it, by which the relay fenced itself when cut off), plus the partly acknowledged
// transaction. A server's restart or failover replays what its saved slot position lags by, which
// the docs bound by a checkpoint interval, not by this: they are not sized.
func (r *run) checkReplaySizes() {
	h := r.h
	st := h.Settings
	if st.MaxInFlightEvents <= 0 || st.StatusInterval <= 0 {
		return
	}
	for _, c := range r.consumers {
		counts := r.replayed[c.name]
		if counts == nil {
			continue
		}
		var firsts []time.Time
		for i := range r.evs {
			if c.seen[i] {
				firsts = append(firsts, h.Reads[c.first[i]].Appended)
			}
		}
		for fi, n := range counts {
			f := r.replay[fi]
			if n == 0 || !relayFaults[f.Kind] {
				continue
			}
			from, to := f.Start.Add(-2*st.StatusInterval), f.Start.Add(st.Lease)
			acked := 0
			for _, a := range firsts {
				if !a.Before(from) && !a.After(to) {
					acked++
				}
			}
			bound := st.MaxInFlightEvents + acked + r.replayTxn[c.name][fi]
			if n > bound {
				r.add(Violation{Rule: RuleDuplicate, At: f.Start,
					Message: fmt.Sprintf("%s of %s at %s: consumer %s read %d events again, more than the documented bound %d (in flight %d + acknowledged around it %d + a partial transaction %d)",
						f.Kind, f.Target, offset(h, f.Start), c.name, n, bound, st.MaxInFlightEvents, acked, r.replayTxn[c.name][fi])})
			}
		}
	}
}
