package chaos_test

import (
	"context"
	"fmt"
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

// todaysSeed is the schedule make test runs: a new one each day (the date, e.g. 20261206), so
// that the guard keeps looking where it has not looked; CHAOS_SEED picks another. A failure is
// news about the relay or the harness, and its seed replays it.
func todaysSeed(now time.Time) uint64 {
	y, m, d := now.UTC().Date()
	return uint64(y*10000 + int(m)*100 + d)
}

// TestShortScheduleOfEveryMode runs every mode side by side on one PostgreSQL 18 primary with a
// standby and three replicated brokers, with two relays each, under a short schedule of
// overlapping faults of every kind, and fails on any broken rule (package check), printing the
// seed and the schedule.
// `make chaos` runs the same harness for as long as asked.
func TestShortScheduleOfEveryMode(t *testing.T) {
	if err := devenv.KafkaLibReady(devenv.DefaultKafkaLib()); err != nil {
		t.Fatal(err)
	}
	seed := todaysSeed(time.Now())
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		seed = s
	}
	// First, on stderr: a test timeout that ends the binary must not swallow the seed.
	fmt.Fprintf(os.Stderr, "TestShortScheduleOfEveryMode: CHAOS_SEED=%d\n", seed)
	t.Logf("CHAOS_SEED=%d", seed)
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
		// The schedule must have killed and paused past its lease the relay leading at that
		// moment, passed leadership on and failed over (check.Unmet): a run that did not
		// exercise those proves little.
		for _, u := range m.Unmet {
			t.Errorf("%s: requirement not met: %s", m.Mode, u)
		}
		if t.Failed() {
			t.Logf("%s: replay: %s (CHAOS_KEEP=<dir> keeps the history)", m.Mode, m.Replay)
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
	// The deck deals most kinds twice in 90 s; one planned that never took effect means a fault
	// that does nothing. PostgreSQL's faults (restarts, failovers, a neighbour's start, the
	// standby's stop and lag, a freeze) exclude
	// each other, and a failover may hold them for half a minute waiting for the standby, so of
	// those at least one must have taken effect. So do the broker's six kinds, four of which
	// restart a broker's JVM (10-20 s each): of the dozen planned in 90 s the first few apply and
	// the rest wait past the fault period, so of those too at least one must have taken effect
	// (internal/chaos/cluster's tests apply each of them).
	postgres, broker := 0, 0
	for _, kind := range kinds {
		switch {
		case strings.HasPrefix(kind, "failover-"), strings.HasPrefix(kind, "pg-restart"), kind == "neighbour",
			strings.HasPrefix(kind, "standby-"), kind == "pg-freeze":
			postgres += applied[kind]
		case slices.Contains([]string{"broker-stop", "broker-pause", "broker-kill", "leader-change", "coordinator-move", "isr-shrink"}, kind):
			broker += applied[kind]
		case applied[kind] == 0 && res.Planned[kind] > 0:
			t.Errorf("no %s fault took effect in any mode (%d planned)", kind, res.Planned[kind])
		}
	}
	if postgres == 0 {
		t.Errorf("no PostgreSQL fault (restart, failover, neighbour, standby, freeze) took effect")
	}
	if broker == 0 {
		t.Errorf("no broker fault (stop, pause, kill, leader change, coordinator move, ISR shrink) took effect")
	}
	t.Logf("faults applied: %v; the same schedule again: %s", applied, res.Command)
}
