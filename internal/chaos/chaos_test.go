package chaos_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
)

// shortSeeds are the schedules make test runs, one a day in turn (CHAOS_SEED picks another):
// each has been run to the end without a violation, so a failure is news about the relay.
var shortSeeds = []uint64{7, 1201, 31337}

// TestShortScheduleOfEveryMode runs every mode side by side on one PostgreSQL 18 primary with a
// standby and three replicated brokers, with two relays each, under a short schedule of overlapping faults of
// every kind, and fails on any broken rule (package check), printing the seed and the schedule.
// `make chaos` runs the same harness for as long as asked.
func TestShortScheduleOfEveryMode(t *testing.T) {
	if err := devenv.KafkaLibReady(devenv.DefaultKafkaLib()); err != nil {
		t.Fatal(err)
	}
	seed := shortSeeds[time.Now().UTC().YearDay()%len(shortSeeds)]
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		seed = s
	}
	dir := t.TempDir()
	if keep := os.Getenv("CHAOS_KEEP"); keep != "" {
		dir = keep
	}
	kinds := chaos.ShortKinds()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	res, err := chaos.Run(ctx, chaos.Options{
		Seed: seed, Duration: 90 * time.Second, Dir: dir, RelayBin: relayproc.PlainBinary(t),
		Relays: 2, Brokers: 3, Writers: 2, Rate: 5, Mean: 2 * time.Second, Drain: 2 * time.Minute, Short: true, Kinds: kinds,
		Log: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]int{}
	for _, m := range res.Modes {
		if len(m.Violations) > 0 {
			t.Errorf("%s:\n%s", m.Mode, m.Text)
		}
		for _, c := range m.Crashes {
			t.Errorf("%s: %s", m.Mode, c)
		}
		if m.Summary.Committed == 0 {
			t.Errorf("%s: no transaction committed: the run exercised nothing", m.Mode)
		}
		for kind, n := range m.Summary.Faults {
			applied[kind] += n
		}
	}
	// The deck deals every kind at least twice in 90 s; one that never took effect means a fault
	// that does nothing. PostgreSQL's faults (restarts, failovers, a neighbour's start) exclude
	// each other, and a failover may hold them for half a minute waiting for the standby, so of
	// those at least one must have taken effect. The six broker kinds exclude each other too, and
	// four restart a broker's JVM (10-20 s on this machine): each is drawn as soon as the broker is
	// free, and all but one must have taken effect (the last may find no time left under load).
	postgres, brokerMissed := 0, []string{}
	for _, kind := range kinds {
		switch {
		case strings.HasPrefix(kind, "failover-"), strings.HasPrefix(kind, "pg-restart"), kind == "neighbour":
			postgres += applied[kind]
		case slices.Contains([]string{"broker-stop", "broker-pause", "broker-kill", "leader-change", "coordinator-move", "isr-shrink"}, kind):
			if applied[kind] == 0 {
				brokerMissed = append(brokerMissed, kind)
			}
		case applied[kind] == 0:
			t.Errorf("no %s fault took effect in any mode", kind)
		}
	}
	if postgres == 0 {
		t.Errorf("no PostgreSQL fault (restart, failover, neighbour) took effect")
	}
	switch {
	case len(brokerMissed) > 1:
		t.Errorf("no %v fault took effect in any mode: of the broker's kinds at most one may miss", brokerMissed)
	case len(brokerMissed) == 1:
		t.Logf("no %s fault took effect: the broker's last kind found no time left", brokerMissed[0])
	}
	t.Logf("faults applied: %v", applied)
}
