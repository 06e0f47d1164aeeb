package chaos

import (
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
)

// Mode is one way of running the relay that the nemesis tests: a delivery mode and a source.
type Mode struct {
	Name     string
	Delivery string         // history.AtLeastOnce or history.ExactlyOnce
	Shape    workload.Shape // how the writers write events
	Poll     bool           // source: poll (several pollers, no slot, no leader election)
	// Recover: the relays run with on_slot_lost: recover when the slot-lost fault is drawn from,
	// which loses the slot under them. Only an outbox table can be recovered from (a messages
	// outbox's gap is stored nowhere but the WAL; poll has no slot); a partitioned one is left out
	// while no fault test proves its recovery.
	Recover bool
}

// Modes are every mode the nemesis knows, in the order `make chaos` runs them.
var modes = []Mode{
	{Name: "alo-table", Delivery: history.AtLeastOnce, Shape: workload.Table, Recover: true},
	{Name: "eo-table", Delivery: history.ExactlyOnce, Shape: workload.Table, Recover: true},
	{Name: "alo-partitioned", Delivery: history.AtLeastOnce, Shape: workload.PartitionedTable},
	{Name: "eo-partitioned", Delivery: history.ExactlyOnce, Shape: workload.PartitionedTable},
	{Name: "alo-messages", Delivery: history.AtLeastOnce, Shape: workload.Messages},
	{Name: "eo-messages", Delivery: history.ExactlyOnce, Shape: workload.Messages},
	{Name: "poll", Delivery: history.AtLeastOnce, Shape: workload.Table, Poll: true},
}

// AllModes returns the names of every mode.
func AllModes() []string {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.Name
	}
	return names
}

// ParseModes turns a comma-separated list of mode names ("all" for every mode) into modes.
func ParseModes(list string) ([]Mode, error) {
	if strings.TrimSpace(list) == "" || list == "all" {
		return append([]Mode(nil), modes...), nil
	}
	var out []Mode
	seen := make(map[string]bool)
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		m, ok := modeNamed(name)
		if !ok {
			return nil, fmt.Errorf("chaos: unknown mode %q (modes: %s, or all)", name, strings.Join(AllModes(), ", "))
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, m)
		}
	}
	return out, nil
}

func modeNamed(name string) (Mode, bool) {
	for _, m := range modes {
		if m.Name == name {
			return m, true
		}
	}
	return Mode{}, false
}

// id is the mode's name as a PostgreSQL and topic identifier.
func (m Mode) id() string { return strings.ReplaceAll(m.Name, "-", "_") }
