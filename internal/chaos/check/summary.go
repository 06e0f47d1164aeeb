package check

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// Summary is what a run did, in the figures docs/guarantees.md reports per mode.
type Summary struct {
	Seed     uint64
	Mode     string
	Delivery string
	Duration time.Duration

	Txns     map[history.Outcome]int // transactions by outcome
	Resolved int                     // transactions whose outcome was settled from the marker row

	Committed int // events of committed transactions
	InDoubt   int // events of transactions still in doubt: may or may not be delivered
	Vanished  int // events of transactions a failover lost
	Delivered int // committed events every consumer read
	Lost      int // committed events some consumer never read
	// Duplicates counts repeated deliveries (an event id a consumer had already read), by the
	// consumer's isolation.
	Duplicates map[string]int
	// Recovered counts, of Duplicates, the events of a lost slot's gap published again by its
	// recovery, by isolation.
	Recovered map[string]int
	// ByCause counts, of Duplicates outside exactly-once's read_committed, the repeats a fault's
	// replay explains, by the fault's kind (a repeat explained by several faults counts for the latest to begin).
	ByCause   map[string]int
	Reordered int // first deliveries that came after a later Seq of their key
	Gaps      int // exactly-once deliveries that skipped a committed event of their key

	Faults        map[string]int // faults by kind
	LeaderChanges int            // times the relay reporting leadership changed
	MaxRSS        int64          // bytes, over every relay sample
	LongestStop   time.Duration  // the longest SIGTERM-to-exit among the stops that exited
	Unstopped     int            // SIGTERMs after which the relay had not exited
	// WorstStall is the longest wait of a committed event for its first delivery that counted
	// against the liveness bound (time when the servers or every relay were away, and documented
	// waits, do not); Stall describes it with the faults around it.
	WorstStall time.Duration
	Stall      string
	Violations int
}

// Summarize counts what h holds and what Check finds in it.
func Summarize(h *history.History) Summary {
	r := analyze(h)
	h = r.h // the faults that took effect
	s := Summary{
		Seed: h.Seed, Mode: h.Mode, Delivery: h.Settings.Delivery, Duration: h.End.Sub(h.Start),
		Txns: make(map[history.Outcome]int), Faults: make(map[string]int),
		Committed: r.committedEvents, Lost: r.lost,
		Duplicates: r.duplicates, Recovered: r.recovered, ByCause: r.byCause, Reordered: r.reordered, Gaps: r.gaps,
		Violations: len(r.vs), WorstStall: r.worst.counted, Stall: r.stallText(),
	}
	if len(r.consumers) > 0 {
		s.Delivered = r.committedEvents - r.lost
	}
	for _, t := range h.Txns {
		s.Txns[t.Outcome]++
		if t.Resolved {
			s.Resolved++
		}
		switch t.Outcome {
		case history.InDoubt:
			s.InDoubt += len(t.Events)
		case history.Vanished:
			s.Vanished += len(t.Events)
		}
	}
	for _, f := range h.Faults {
		s.Faults[f.Kind]++
	}
	s.LeaderChanges = leaderChanges(h.Relays)
	for _, rs := range h.Relays {
		s.MaxRSS = max(s.MaxRSS, rs.RSS)
	}
	for _, st := range h.Stops {
		if st.Exited.IsZero() {
			s.Unstopped++
			continue
		}
		s.LongestStop = max(s.LongestStop, st.Exited.Sub(st.Signal))
	}
	return s
}

// leaderChanges counts the stretches of leadership that began on another relay than the stretch
// before them: samples of two relays taken a moment apart around a handover count once.
func leaderChanges(samples []history.RelaySample) int {
	var all []leadership
	for name, ss := range samplesByRelay(samples) {
		for _, s := range leaderships(ss) {
			all = append(all, leadership{relay: name, from: s.from, to: s.to})
		}
	}
	slices.SortFunc(all, func(a, b leadership) int {
		if c := a.from.Compare(b.from); c != 0 {
			return c
		}
		return strings.Compare(a.relay, b.relay)
	})
	n := 0
	for i := 1; i < len(all); i++ {
		if all[i].relay != all[i-1].relay {
			n++
		}
	}
	return n
}

// String prints s as a compact table.
func (s Summary) String() string {
	var b strings.Builder
	row := func(name, format string, args ...any) {
		fmt.Fprintf(&b, "%-11s %s\n", name, fmt.Sprintf(format, args...))
	}
	row("run", "seed %d, mode %s, %s, %v", s.Seed, s.Mode, s.Delivery, s.Duration.Round(time.Second))
	row("txns", "%d committed, %d rolled back, %d in doubt, %d vanished (%d resolved afterwards)",
		s.Txns[history.Committed], s.Txns[history.RolledBack], s.Txns[history.InDoubt], s.Txns[history.Vanished], s.Resolved)
	row("events", "%d committed: %d delivered, %d lost, %d reordered, %d gaps; %d in doubt, %d vanished",
		s.Committed, s.Delivered, s.Lost, s.Reordered, s.Gaps, s.InDoubt, s.Vanished)
	row("duplicates", "%s", counts(s.Duplicates))
	if len(s.Recovered) > 0 {
		row("", "of them a lost slot's gap published again: %s", counts(s.Recovered))
	}
	if len(s.ByCause) > 0 {
		row("", "of them replays, by the fault that caused them: %s", counts(s.ByCause))
	}
	row("faults", "%s", counts(s.Faults))
	row("relays", "%d leader changes, max RSS %s, longest SIGTERM stop %v, %d not stopped",
		s.LeaderChanges, mib(s.MaxRSS), s.LongestStop.Round(time.Millisecond), s.Unstopped)
	if s.Stall != "" {
		row("worst stall", "%s", s.Stall)
	}
	row("violations", "%d", s.Violations)
	return b.String()
}

// counts prints a map's entries sorted by key, "none" when empty.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	total := 0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		total += m[k]
	}
	return fmt.Sprintf("%s (total %d)", strings.Join(parts, ", "), total)
}
