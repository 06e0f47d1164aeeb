package check

import (
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// RuleRequirement names a requirement of History.Required the run did not meet: the schedule
// did not exercise what it had to, so its passing says less than it claims.
const RuleRequirement = "requirement"

// Unmet returns one line for each of h.Required that the faults that took effect (and the
// relays' samples, for a leader change) do not meet; none when every one is met. A fault
// counts only if it took effect, and a leader's fault only if its target reported leadership
// at the moment it applied (history.Fault.Leader), not as drawn.
func Unmet(h *history.History) []string {
	var kills, leaderKills, zombies, leaderZombies, failovers int
	for _, f := range h.Faults {
		if !f.TookEffect() {
			continue
		}
		switch {
		case f.Kind == "kill9":
			kills++
			if f.Leader {
				leaderKills++
			}
		case f.Kind == "pause" && f.End.Sub(f.Start) > h.Settings.Lease:
			zombies++
			if f.Leader {
				leaderZombies++
			}
		case strings.HasPrefix(f.Kind, "failover-"):
			failovers++
		}
	}
	var out []string
	for _, req := range h.Required {
		var missing string
		switch req {
		case history.RequireLeaderKill:
			if leaderKills == 0 {
				missing = fmt.Sprintf("no kill9 of the relay leading at that moment took effect (%d kill9 of followers)", kills-leaderKills)
			}
		case history.RequireLeaderZombie:
			if leaderZombies == 0 {
				missing = fmt.Sprintf("no pause longer than the lease (%v) of the relay leading at that moment took effect (%d of followers)", h.Settings.Lease, zombies-leaderZombies)
			}
		case history.RequireRelayKill:
			if kills == 0 {
				missing = "no kill9 of a relay took effect"
			}
		case history.RequireRelayZombie:
			if zombies == 0 {
				missing = fmt.Sprintf("no pause longer than the lease (%v) of a relay took effect", h.Settings.Lease)
			}
		case history.RequireLeaderChange:
			if leaderChanges(h.Relays) == 0 {
				missing = "leadership never passed from one relay to another"
			}
		case history.RequireFailover:
			if failovers == 0 {
				missing = "no failover took effect (every one skipped or failed, or none drawn)"
			}
		default:
			missing = fmt.Sprintf("unknown requirement %q (a history from a newer harness?)", req)
		}
		if missing != "" {
			out = append(out, req+": "+missing)
		}
	}
	return out
}
