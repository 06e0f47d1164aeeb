package chaos

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// A replay of one mode keeps the plan's faults of that mode and the cluster's (nemesis.fault),
// but a fault of another mode may act on the servers every mode shares: a neighbour's start
// across an immediate restart or a frozen primary restarts or freezes the one PostgreSQL (and
// is recorded, as that server fault, in every mode's history), and slot-invalidated's variant
// fails over. Dropped from the replay, the mode replayed meets fewer server faults than its
// history shows, and the postgres group's later faults apply earlier (they no longer wait their
// turn behind it): the replay is not the schedule the mode ran.
func TestReviewAReplayOfOneModeKeepsTheServerFaultsOfOtherModes(t *testing.T) {
	alo, _ := modeNamed("alo-table")
	for seed := uint64(1); seed <= 200; seed++ {
		o := shortOptions(seed)
		plan := drawPlan(o, true, testLease)
		r := &runner{lease: testLease}
		r.modes = []*modeRun{{mode: alo}}
		n := &nemesis{run: r, plan: plan}
		for _, p := range plan {
			if p.Kind != kindNeighbour || (p.Detail != variantNeighbourRestart && p.Detail != variantNeighbourFreeze) {
				continue
			}
			f, ok := n.fault(p)
			if !ok {
				t.Fatalf("seed %d: fault #%d %s of %s (%s) acts on the shared PostgreSQL, and a replay of alo-table drops it", seed, p.Seq, p.Kind, p.Mode, p.Detail)
			}
			want := kindPGFreeze
			if p.Detail == variantNeighbourRestart {
				want = kindPGImmediate
			}
			if f.kind != want || f.mode != nil || f.group != "postgres" || f.d != p.Duration {
				t.Fatalf("seed %d: fault #%d replayed as %s (mode %v, group %q, %v), want %s of the cluster in the postgres group for %v", seed, p.Seq, f.kind, f.mode, f.group, f.d, want, p.Duration)
			}
			return
		}
	}
	t.Fatal("no seed of 1..200 drew a neighbour's start under a server fault: the plan no longer draws what this test checks; widen the seeds or draw it another way")
}

// A replay of the poll mode alone runs against the cluster the whole run had: with the standby
// that its batches waited for and its failovers hit (the WAL modes beside it asked for it).
func TestReviewAReplayOfThePollModeAloneKeepsTheStandby(t *testing.T) {
	o := shortOptions(5)
	if !withStandby(o, 18) {
		t.Fatal("the short run of every mode has no standby")
	}
	poll, _ := ParseModes("poll")
	plan := &history.Plan{Options: planOptions(o), Faults: drawPlan(o, true, testLease)}
	replay, err := replayOptions(Options{Plan: plan, Modes: poll})
	if err != nil {
		t.Fatal(err)
	}
	if !withStandby(replay, 18) {
		t.Error("a replay of the poll mode alone runs without the standby its run had")
	}
	alone := o
	alone.Modes = poll
	if withStandby(alone, 18) {
		t.Error("a run of the poll mode alone (no replay) has a standby no slot needs")
	}
}

// During an oom fault the relay's next exit is taken for the OOM killer's SIGKILL
// (expectOwnEnd): an exit of its own accord in that window (an error, status 1) was recorded as
// a SIGKILL and escaped the exit rule. Only a process that SIGKILL ended is the fault's.
func TestReviewAnOwnExitDuringAnOOMFaultIsStillOwn(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "relay.sh")
	script := "#!/bin/sh\necho ready\nsleep 0.3\necho 'outbox-relay: something fatal' >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rl, err := newRelay("m-r1", bin, nil, nil, filepath.Join(dir, "r1.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rl.start(); err != nil {
		t.Fatal(err)
	}
	rl.expectOwnEnd(true) // the oom fault moved it into its cgroup and waits for the kill
	if _, err := rl.wait(ctx); err != nil {
		t.Fatal(err)
	}
	exits := rl.takeExits()
	if len(exits) != 1 || exits[0].Cause != history.ExitOwn || exits[0].Code != 1 {
		t.Fatalf("exits %+v, want one of the relay's own accord with status 1", exits)
	}
}
