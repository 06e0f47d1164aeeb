package chaos

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/cluster"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// kindOOM moves a relay into a memory cgroup of its own whose limit is just above what it uses
// (issue 39, item 12): the kernel OOM-kills it as a container's limit would once it grows, and the
// nemesis starts it again, as after kill9. Where the machine has no writable cgroup v1 memory
// controller the fault is skipped, and the checker's RSS rule (history.Settings.RSSBound) is
// what bounds memory.
const kindOOM = "oom"

// procKinds are the process kinds make chaos draws besides ShortKinds.
var procKinds = []string{kindOOM}

const (
	// oomHeadroom is how far above the relay's charge its limit is set: a few of its batches.
	oomHeadroom = 2 << 20
	// oomRestart is how long an OOM-killed relay stays down, as an orchestrator's restart delay.
	oomRestart = time.Second
)

// actProc does the work of a process kind.
func (n *nemesis) actProc(ctx context.Context, f *fault, rec *history.Fault, heal func(func(context.Context) error)) error {
	r := n.run
	rl := f.relay
	pid := rl.pid()
	if pid == 0 || rl.paused() {
		return fmt.Errorf("%w: %s is not running", errSkipped, rl.name)
	}
	g, err := cluster.NewMemoryCgroup(fmt.Sprintf("chaos-%d-%s", f.seq, rl.name))
	if err != nil {
		return fmt.Errorf("%w: %v (the RSS rule bounds memory instead)", errSkipped, err)
	}
	defer func() {
		// The cgroup lingers a moment after its last process exits.
		for i := 0; ; i++ {
			err := g.Close()
			if err == nil || i == 50 {
				if err != nil {
					r.note("fault #%d %s %s: %v", f.seq, f.kind, rl.name, err)
				}
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	rl.expectOwnEnd(true)
	if err := g.Add(pid); err != nil {
		rl.expectOwnEnd(false)
		return err
	}
	usage, err := g.Usage()
	if err != nil {
		rl.expectOwnEnd(false)
		return err
	}
	limit := usage + oomHeadroom
	if err := g.Limit(limit); err != nil {
		rl.expectOwnEnd(false)
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, f.d)
	code, err := rl.wait(wctx)
	cancel()
	if err != nil {
		// Still running: it stayed under the limit. The limit is lifted and it goes back.
		rl.expectOwnEnd(false)
		return fmt.Errorf("%w: %s stayed under a limit of %.1f MiB for %s", errSkipped, rl.name, float64(limit)/(1<<20), f.d.Round(100*time.Millisecond))
	}
	kills, kerr := g.OOMKills()
	rec.Detail = fmt.Sprintf("killed (exit %d, %d OOM kills) at a limit of %.1f MiB after %s", code, kills,
		float64(limit)/(1<<20), time.Since(rec.Start).Round(100*time.Millisecond))
	sleep(ctx, oomRestart)
	heal(func(context.Context) error { return rl.start() })
	if kerr != nil || kills == 0 {
		return errors.Join(fmt.Errorf("chaos: %s ended inside its memory cgroup, but not by the OOM killer", rl.name), kerr)
	}
	return nil
}

// expectOwnEnd marks the current process's next exit as the nemesis's doing (on) or not (off):
// an OOM kill the fault waits for is no exit of the relay's own accord.
// The OOM killer's signal is SIGKILL: the exit is recorded as one (history.ExitSigkill).
func (r *relay) expectOwnEnd(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expectExit = on
	r.sent = 0
	if on {
		r.sent = syscall.SIGKILL
	}
}
