package check

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// around is how far before and after a violation a fault is shown as its context: long enough to
// include the failover or pause that set it up, short enough to stay readable.
const around = 30 * time.Second

// Format prints a report of vs for a person: the seed and the command that reproduces the run,
// then each violation (at most limit; limit <= 0 prints all) with its time from the run's start, its
// events and the faults scheduled around it.
func Format(h *history.History, vs []Violation, limit int) string {
	var b strings.Builder
	d := h.End.Sub(h.Start)
	fmt.Fprintf(&b, "chaos run: seed %d, mode %s, %s, %v: ", h.Seed, h.Mode, h.Settings.Delivery, d.Round(time.Second))
	if len(vs) == 0 {
		b.WriteString("no violations\n")
	} else {
		fmt.Fprintf(&b, "%d violations\n", len(vs))
	}
	if h.Plan != nil {
		// The seed draws the schedule over every mode of the run: one mode alone is replayed from
		// the plan its history holds.
		fmt.Fprintf(&b, "reproduce: make chaos REPLAY=<this mode's history.json> MODE=%s; the whole run: %s\n", h.Mode, h.Plan.Options.Command())
	} else {
		fmt.Fprintf(&b, "reproduce: make chaos SEED=%d MODE=%s DURATION=%s\n", h.Seed, h.Mode, roundDuration(d))
	}
	for i, v := range vs {
		if limit > 0 && i == limit {
			fmt.Fprintf(&b, "... and %d more\n", len(vs)-limit)
			break
		}
		fmt.Fprintf(&b, "\n%d. [%s] %s  %s\n", i+1, v.Rule, offset(h, v.At), v.Message)
		if len(v.Events) > 0 {
			fmt.Fprintf(&b, "   events: %s\n", strings.Join(v.Events, " "))
		}
		var near []history.Fault
		for _, f := range h.Faults {
			if !v.At.Before(f.Start.Add(-around)) && !v.At.After(f.End.Add(around)) {
				near = append(near, f)
			}
		}
		slices.SortStableFunc(near, func(a, b history.Fault) int { return a.Start.Compare(b.Start) })
		if len(near) == 0 {
			fmt.Fprintf(&b, "   no fault within %v of it\n", around)
			continue
		}
		fmt.Fprintf(&b, "   the schedule around it:\n")
		for _, f := range near {
			fmt.Fprintf(&b, "     %s %s %s", offset(h, f.Start), f.Kind, f.Target)
			if f.End.After(f.Start) {
				fmt.Fprintf(&b, " until %s (%v)", offset(h, f.End), f.End.Sub(f.Start).Round(100*time.Millisecond))
			}
			if f.Detail != "" {
				fmt.Fprintf(&b, ": %s", f.Detail)
			}
			switch {
			case f.Failed != "":
				fmt.Fprintf(&b, " [failed, excuses nothing: %s]", f.Failed)
			case f.Skipped != "":
				fmt.Fprintf(&b, " [skipped: %s]", f.Skipped)
			case f.Leader:
				b.WriteString(" [leading]")
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// offset prints t as seconds from the run's start, "+73.2s".
func offset(h *history.History, t time.Time) string {
	return fmt.Sprintf("%+.1fs", t.Sub(h.Start).Seconds())
}

// roundDuration prints a run's duration the way make chaos takes it: whole minutes (hours when
// exact), or whole seconds for runs under a minute.
func roundDuration(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%ds", max(1, int(d.Round(time.Second)/time.Second)))
	}
	m := d.Round(time.Minute)
	if m%time.Hour == 0 {
		return fmt.Sprintf("%dh", m/time.Hour)
	}
	return fmt.Sprintf("%dm", m/time.Minute)
}
