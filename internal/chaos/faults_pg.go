package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/cluster"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
)

// PostgreSQL's faults beyond restarts and failovers (issue 39, item 11). Each holds PostgreSQL's
// exclusion group but prune, which only deletes rows.
const (
	// kindSlotInvalidated cuts a recovering mode's relays off PostgreSQL, has max_slot_wal_keep_size
	// invalidate their slot (wal_status lost), heals the cuts and lasts until the slot ledger
	// records the recovery; its variant fails over (synchronized) while the recovery runs.
	kindSlotInvalidated = "slot-invalidated"
	// kindStandbyStop stops the standby for a while: with synchronized_standby_slots listing it,
	// the walsenders of failover slots wait for it.
	kindStandbyStop = "standby-stop"
	// kindStandbyLag delays the standby's replay (recovery_min_apply_delay) for a while.
	kindStandbyLag = "standby-lag"
	// kindPGFreeze freezes the primary with SIGSTOP, then SIGCONT.
	kindPGFreeze = "pg-freeze"
	// kindPrune runs `outbox-relay prune` against a mode's database while its relays run.
	kindPrune = "prune"
)

// longPGKinds are the kinds of this file left to make chaos's long runs (see ShortKinds).
var longPGKinds = []string{kindSlotInvalidated, kindStandbyStop, kindStandbyLag}

// variantFailoverDuringRecovery is the slot-invalidated variant that fails over while the
// recovery runs.
const variantFailoverDuringRecovery = "a failover during the recovery"

// Variants of the neighbour fault whose relay starts, and creates its slot, under a PostgreSQL
// fault of its own (a failover is not one of them: a slot created while a failover waits for
// the standby's copies is missed by that wait and lost at the promotion, which the relay rightly
// refuses; docs/guarantees.md).
const (
	variantNeighbourRestart = "its slot created across an immediate restart"
	variantNeighbourFreeze  = "its slot created across a frozen primary"
)

// pgEligible reports whether a kind of this file can target mode m (nil for cluster kinds) in a
// run with these options: the planner asks, from the options alone.
func pgEligible(kind string, m *Mode, standby bool, recovers func(Mode) bool) bool {
	switch kind {
	case kindSlotInvalidated:
		return m != nil && recovers(*m)
	case kindPrune:
		return m != nil && m.Shape != workload.Messages
	case kindStandbyStop, kindStandbyLag:
		return standby
	}
	return true
}

// pgDuration draws how long a kind of this file (or oom, or a neighbour's start) lasts and which
// variant.
func pgDuration(kind string, rng *rand.Rand, between func(lo, hi time.Duration) time.Duration, standby bool) (time.Duration, string) {
	switch kind {
	case kindSlotInvalidated:
		d := between(2*time.Second, 5*time.Second) // the cut, before the invalidation
		if standby && rng.IntN(3) == 0 {
			return d, variantFailoverDuringRecovery
		}
		return d, ""
	case kindStandbyStop:
		return between(2*time.Second, 15*time.Second), ""
	case kindStandbyLag:
		d := between(5*time.Second, 20*time.Second)
		return d, fmt.Sprintf("replay %s behind", standbyDelay(d))
	case kindPGFreeze:
		// Past leader_check_timeout (2 s) the leader fences itself; past the lease a standby relay
		// would take over, were the server not frozen for it too.
		return between(time.Second, 12*time.Second), ""
	case kindPrune:
		// Rows older than this go (0: every committed row), but those a lost slot's recovery needs.
		return between(0, 10*time.Second).Round(time.Second), ""
	case kindOOM:
		return between(5*time.Second, 20*time.Second), "" // the wait for the kill
	case kindNeighbour:
		switch rng.IntN(3) {
		case 0:
			return 0, variantNeighbourRestart
		case 1:
			return between(time.Second, 5*time.Second), variantNeighbourFreeze
		}
	}
	return 0, ""
}

// standbyDelay is the replay delay of a standby-lag fault that lasts d: a quarter of it.
func standbyDelay(d time.Duration) time.Duration { return (d / 4).Round(100 * time.Millisecond) }

// actPG does the work of a kind of this file.
func (n *nemesis) actPG(ctx context.Context, f *fault, rec *history.Fault, heal func(func(context.Context) error)) error {
	r := n.run
	c := r.cluster
	switch f.kind {
	case kindSlotInvalidated:
		return n.invalidateSlot(ctx, f, rec, heal)
	case kindStandbyStop:
		if err := c.StopStandby(ctx); err != nil {
			heal(c.StartStandby)
			return err
		}
		sleep(ctx, f.d)
		heal(c.StartStandby)
	case kindStandbyLag:
		if err := c.DelayStandby(ctx, standbyDelay(f.d)); err != nil {
			heal(func(hctx context.Context) error { return c.DelayStandby(hctx, 0) })
			return err
		}
		sleep(ctx, f.d)
		heal(func(hctx context.Context) error { return c.DelayStandby(hctx, 0) })
	case kindPGFreeze:
		if err := c.FreezePrimary(); err != nil {
			heal(func(context.Context) error { return c.ThawPrimary() })
			return err
		}
		sleep(ctx, f.d)
		heal(func(context.Context) error { return c.ThawPrimary() })
	case kindPrune:
		rec.Detail = "rows older than " + f.d.String()
		// The relays' margin (recoveryMargin), not the default hour: a run of minutes has rows
		// to delete, and a recovery is held to the margin its pruning kept.
		args := []string{"prune", "--older-than=" + f.d.String(), "--slot=" + f.mode.slot, "--slot-recovery-margin=" + recoveryMargin.String()}
		if f.mode.mode.Poll {
			args = append(args, "--source=poll")
		}
		if recovers(f.mode.mode, r.opts.Kinds) {
			args = append(args, "--on-slot-lost=recover")
		}
		// Prune overlaps PostgreSQL's other faults on purpose; one that finds no primary to
		// connect to (a restart, a failover under way) tries again for a minute, as an operator's
		// cron job would at its next run.
		var out string
		var err error
		for try := time.Now(); ; {
			out, err = runCommandOutput(ctx, r.opts.RelayBin, args, []string{"OUTBOX_PG_DSN=" + f.mode.dsn})
			if err == nil || !strings.Contains(err.Error(), "connect to PostgreSQL") || time.Since(try) > time.Minute || !sleep(ctx, time.Second) {
				break
			}
		}
		if err != nil {
			return err
		}
		rec.Detail += ": " + out
	case kindNeighbour:
		return n.neighbourUnderFault(ctx, f, heal)
	}
	return nil
}

// invalidateSlot is the slot-invalidated fault.
func (n *nemesis) invalidateSlot(ctx context.Context, f *fault, rec *history.Fault, heal func(func(context.Context) error)) error {
	r := n.run
	c := r.cluster
	m := f.mode
	if err := c.RecoveryReady(ctx, m.db, m.slot); err != nil {
		return fmt.Errorf("%w: %v", errSkipped, err)
	}
	m.mu.Lock()
	relays := append([]*relay(nil), m.relays...)
	m.mu.Unlock()
	for _, rl := range relays {
		c.CutPostgres(rl.name)
	}
	healCuts := func(context.Context) error {
		for _, rl := range relays {
			c.HealPostgres(rl.name)
		}
		return nil
	}
	// The leader's last confirmations settle before its slot is left behind.
	sleep(ctx, f.d)
	lost, err := c.InvalidateSlot(ctx, m.db, m.slot)
	heal(healCuts)
	if errors.Is(err, cluster.ErrNotSeparable) || (err != nil && ctx.Err() != nil) {
		// Also the schedule's end while the slot was being left behind: nothing was lost.
		return fmt.Errorf("%w: %v", errSkipped, err)
	}
	if err != nil {
		return err
	}
	rec.Lost = lost
	r.logf("fault #%d %s %s: slot %s invalidated %s after the fault began", f.seq, f.kind, rec.Target, m.slot, lost.Sub(rec.Start).Round(time.Millisecond))
	if f.detail == variantFailoverDuringRecovery {
		heal(func(hctx context.Context) error { return n.failoverDuringRecovery(hctx, f, lost) })
	}
	// The fault lasts until the relays have recovered: the checker's window for the gap's second
	// copies runs from its end.
	heal(func(hctx context.Context) error {
		rcv, err := c.WaitSlotRecovered(hctx, m.db, m.slot, lost)
		if err == nil {
			rec.Detail = strings.TrimPrefix(rec.Detail+"; ", "; ") + fmt.Sprintf("recovered %d events by rule %s after %s",
				rcv.Events, rcv.Rule, rcv.At.Sub(lost).Round(100*time.Millisecond))
		}
		return err
	})
	return nil
}

// failoverDuringRecovery fails over (synchronized) once the relays have begun to recover the slot
// lost at lost, and records the failover as a fault of its own, as failover-synced is: the
// checker judges what it may lose or repeat as any synchronized failover's.
func (n *nemesis) failoverDuringRecovery(ctx context.Context, f *fault, lost time.Time) error {
	r := n.run
	c := r.cluster
	// A recovery under way is marked in the ledger (recovery_since): the failover comes then, or
	// after 5 s if none was seen (a recovery takes a tenth of a second and may end between two
	// looks). Failover itself then waits for the standby's persisted copy of the replacement slot,
	// so the kill lands as the recovery ends at the earliest: before, the promotion would lose the
	// replacement slot too, which is another fault.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := c.RecoveryReady(wctx, f.mode.db, f.mode.slot)
	for err == nil || !errors.Is(err, cluster.ErrNoHorizon) {
		if !sleep(wctx, 100*time.Millisecond) {
			break
		}
		err = c.RecoveryReady(wctx, f.mode.db, f.mode.slot)
	}
	cancel()
	res, err := c.Failover(ctx, true)
	if errors.Is(err, cluster.ErrNotReady) || res.Killed.IsZero() {
		r.note("fault #%d %s: %s not made: %v", f.seq, f.kind, variantFailoverDuringRecovery, err)
		return nil
	}
	fo := history.Fault{Kind: kindFailoverSync, Target: "postgres", Start: res.Killed, End: time.Now(), Seq: f.seq,
		Detail: fmt.Sprintf("during the recovery of %s (slot lost %s before the kill)", f.mode.slot, res.Killed.Sub(lost).Round(100*time.Millisecond))}
	r.logf("fault #%d %s: failover %s", f.seq, f.kind, fo.Detail)
	r.recordFault(nil, fo)
	return err
}

// neighbourUnderFault starts a mode's neighbour relay, which creates its slot, while the primary
// restarts (immediate: crash recovery) or is frozen: the slot's creation is cut short and made
// again. The neighbour's writers start only once the slot has a confirmed position (waitSlot), so
// nothing committed before is the neighbour's to publish.
func (n *nemesis) neighbourUnderFault(ctx context.Context, f *fault, heal func(func(context.Context) error)) error {
	r := n.run
	c := r.cluster
	started := make(chan error, 1)
	go func() { started <- r.startNeighbour(ctx, f.mode) }()
	// The relay's first steps (connect, leader lock, the ledger read) take a moment: the fault
	// lands while it creates or first streams its slot. Every mode's relays see the fault: it is
	// recorded as the kind it is, for the checker, besides the neighbour's start.
	sleep(ctx, 500*time.Millisecond)
	server := history.Fault{Target: "postgres", Start: time.Now(), Seq: f.seq, Detail: "under " + f.mode.mode.Name + "'s neighbour start"}
	switch f.detail {
	case variantNeighbourRestart:
		server.Kind = kindPGImmediate
		var err error
		heal(func(hctx context.Context) error {
			err = c.RestartPostgres(hctx, true)
			return nil
		})
		if err != nil {
			r.note("fault #%d %s: restart: %v", f.seq, f.kind, err)
		}
	case variantNeighbourFreeze:
		server.Kind = kindPGFreeze
		if err := c.FreezePrimary(); err != nil {
			r.note("fault #%d %s: freeze: %v", f.seq, f.kind, err)
		}
		sleep(ctx, f.d)
		heal(func(context.Context) error { return c.ThawPrimary() })
	}
	server.End = time.Now()
	r.recordFault(nil, server)
	return <-started
}

// runCommandOutput runs the relay binary for a one-shot command (prune) with a bound and returns
// its last line of output.
func runCommandOutput(ctx context.Context, bin string, args, env []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, text)
	}
	if i := strings.LastIndexByte(text, '\n'); i >= 0 {
		text = text[i+1:]
	}
	return text, nil
}
