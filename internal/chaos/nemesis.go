package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/cluster"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// The fault kinds, as history.Fault.Kind names them. The checker knows "pause" (a zombie when
// longer than the lease) and the two failovers (which say whether lost transactions may be in
// Kafka).
const (
	kindKill9        = "kill9"
	kindSigterm      = "sigterm"
	kindPause        = "pause"
	kindCutPG        = "cut-pg"
	kindCutKafka     = "cut-kafka"
	kindCutBoth      = "cut-both"
	kindBrokerStop   = "broker-stop"
	kindBrokerPause  = "broker-pause"
	kindPGRestart    = "pg-restart"
	kindPGImmediate  = "pg-restart-immediate"
	kindFailoverSync = "failover-synced"
	kindFailoverLag  = "failover-unsynced"
	kindOtherLoad    = "other-load"
	kindBigTx        = "big-tx"
	kindAddColumn    = "add-column"
	kindNeighbour    = "neighbour"
	kindSlotLost     = "slot-lost"
	// The network faults beyond a clean cut (faults_net.go).
	kindNetSlow, kindOneWayKafka, kindOneWayPG, kindCutHealOpen, kindCutLeaderLock = "net-slow", "net-oneway-kafka", "net-oneway-pg", "cut-heal-open", "cut-leader-lock"
)

// FaultKinds lists every kind the nemesis can apply.
func FaultKinds() []string {
	return append(append(append(ShortKinds(), kindSlotLost, kindOneWayPG), longPGKinds...), procKinds...)
}

// ShortKinds lists the kinds of the short schedule make test runs: every kind but the lost slot,
// whose recovery publishes a whole gap again and is left to the long runs of make chaos, and the
// one-way cut of PostgreSQL, which a relay meets as it does cut-pg (a timeout) but for statements
// applied unanswered; nor slot-invalidated, standby-stop, standby-lag and oom (faults_pg.go,
// faults_proc.go say why).
func ShortKinds() []string {
	return []string{kindKill9, kindSigterm, kindPause, kindCutPG, kindCutKafka, kindCutBoth, kindBrokerStop,
		kindBrokerPause, kindPGRestart, kindPGImmediate, kindFailoverSync, kindFailoverLag, kindOtherLoad,
		kindBigTx, kindAddColumn, kindNeighbour,
		kindNetSlow, kindOneWayKafka, kindCutHealOpen, kindCutLeaderLock, kindPGFreeze, kindPrune,
		kindBrokerKill, kindLeaderChange, kindCoordinatorMove, kindISRShrink}
}

// kindScope says what a kind targets: a relay of a mode, a mode (its writers, its table), or the
// servers everyone shares.
type kindScope int

const (
	scopeRelay kindScope = iota
	scopeMode
	scopeCluster
)

func scopeOf(kind string) kindScope {
	switch kind {
	case kindKill9, kindSigterm, kindPause, kindCutPG, kindCutKafka, kindCutBoth, kindOOM:
		return scopeRelay
	case kindNetSlow, kindOneWayKafka, kindOneWayPG, kindCutHealOpen, kindCutLeaderLock:
		return scopeRelay
	case kindBigTx, kindAddColumn, kindNeighbour, kindOtherLoad, kindSlotLost, kindSlotInvalidated, kindPrune:
		return scopeMode
	}
	return scopeCluster
}

// group is what two faults must not share at once: the broker, PostgreSQL (restarts, failovers,
// and a neighbour's start, which creates a slot: one created while a failover waits for the
// standby's copies is missed by that wait and lost at the promotion, which the relay rightly
// refuses to paper over), a mode's big transaction or other load. A lost slot's recovery counts
// as PostgreSQL's too, until it has ended: a failover before the replacement slot's copy is
// persisted would lose that slot as well, which is another fault than the one drawn.
func group(kind, mode string) string {
	switch kind {
	case kindBrokerStop, kindBrokerPause, kindBrokerKill, kindLeaderChange, kindCoordinatorMove, kindISRShrink:
		return "broker"
	case kindPGRestart, kindPGImmediate, kindFailoverSync, kindFailoverLag, kindNeighbour, kindSlotLost,
		kindSlotInvalidated, kindStandbyStop, kindStandbyLag, kindPGFreeze:
		return "postgres"
	case kindBigTx, kindOtherLoad, kindAddColumn, kindPrune:
		return kind + "/" + mode
	}
	return ""
}

// fault is one planned fault as it is applied: the plan's entry and what it resolved to.
type fault struct {
	kind   string
	mode   *modeRun // nil for cluster faults
	relay  *relay   // relay faults: resolved at the moment the fault applies
	role   string   // relay faults: history.RoleLeader, RoleFollower, RoleAny
	pick   int
	leader bool // the relay reported leadership when the fault applied
	d      time.Duration
	detail string
	events int // of a big transaction
	group  string
	seq    int
	// required: one of the faults every run must carry out; a leader's waits for a leader.
	required bool
}

// nemesis applies a plan (drawn up front by a planner, or read from an earlier run's history)
// until its context ends, overlapping.
type nemesis struct {
	run  *runner
	plan []history.PlannedFault

	mu   sync.Mutex
	busy map[string]bool // relays under a fault
}

// turn orders the faults that share a key (a server's group, a mode's relays): each waits for
// the one before it, so that the order in which they apply is the plan's.
type turn struct {
	started, done chan struct{}
}

// loop applies every planned fault at its time, then waits for the running ones to heal. Faults
// of one group (the broker, PostgreSQL, a mode's load) apply one at a time in the plan's order:
// one whose time comes while its group is busy waits for it. Relay faults of a mode start in the
// plan's order; each waits while the relay its role resolves to is under another fault. A fault
// still waiting when the fault period ends is recorded as skipped.
func (n *nemesis) loop(ctx context.Context) {
	start := time.Now()
	var wg sync.WaitGroup
	last := make(map[string]*turn)
	for _, p := range n.plan {
		f, ok := n.fault(p)
		if !ok {
			continue // a mode this run does not run (a replay of one mode)
		}
		key := f.group
		if scopeOf(f.kind) == scopeRelay {
			key = "relays/" + f.mode.mode.Name
		}
		prev := last[key]
		me := &turn{started: make(chan struct{}), done: make(chan struct{})}
		if key != "" {
			last[key] = me
		}
		at := start.Add(p.At)
		wg.Go(func() {
			defer close(me.done)
			n.applyAt(ctx, f, at, prev, me)
		})
	}
	wg.Wait()
}

// fault turns a planned fault into one of this run's; false when its mode is not in the run.
// A fault of a mode the run leaves out that also acts on the servers every mode shares keeps
// that part: a neighbour's start across an immediate restart or a frozen primary is, for the
// modes replayed, that restart or freeze (their histories recorded it as such), in its turn.
func (n *nemesis) fault(p history.PlannedFault) (*fault, bool) {
	f := &fault{kind: p.Kind, role: p.Role, pick: p.Pick, d: p.Duration, detail: p.Detail, events: p.Events, seq: p.Seq, required: p.Required}
	if p.Mode != "" {
		for _, m := range n.run.modes {
			if m.mode.Name == p.Mode {
				f.mode = m
			}
		}
		if f.mode == nil {
			switch {
			case p.Kind == kindNeighbour && p.Detail == variantNeighbourRestart:
				f.kind = kindPGImmediate
			case p.Kind == kindNeighbour && p.Detail == variantNeighbourFreeze:
				f.kind = kindPGFreeze
			default:
				return nil, false
			}
			f.detail = "under " + p.Mode + "'s neighbour start (its mode not replayed)"
			f.group = group(p.Kind, p.Mode)
			return f, true
		}
	}
	f.group = group(p.Kind, p.Mode)
	return f, true
}

// applyAt waits for f's time and its turn, resolves its target and applies it.
func (n *nemesis) applyAt(ctx context.Context, f *fault, at time.Time, prev, me *turn) {
	started := sync.OnceFunc(func() { close(me.started) })
	defer started()
	if !sleep(ctx, time.Until(at)) {
		return // the fault period ended before the fault was due
	}
	if prev != nil {
		wait := prev.done
		if scopeOf(f.kind) == scopeRelay {
			wait = prev.started // relays of a mode may be under several faults at once
		}
		select {
		case <-wait:
		case <-ctx.Done():
			n.skip(f, "its group was busy until the fault period ended")
			return
		}
	}
	if scopeOf(f.kind) == scopeRelay {
		if err := n.resolve(ctx, f); err != nil {
			n.skip(f, err.Error())
			return
		}
		defer n.release(f)
	}
	started()
	n.apply(ctx, f)
}

// resolve finds the relay of f's mode that fits its role now, reading leadership from the
// relays at this moment (a scrape of each, not the sampler's last view), and marks it busy. It
// waits while the relay that fits is under another fault or not running. A leader's fault whose
// mode has no leader for twice the lease (a takeover under way, every relay cut off) goes to a
// follower, recorded as such, unless it is a required one: that waits for a leader until the
// fault period ends (a follower's kill proves nothing the requirement asks).
func (n *nemesis) resolve(ctx context.Context, f *fault) error {
	noLeaderUntil := time.Now().Add(2 * n.run.lease)
	for {
		leaders, others := n.roles(ctx, f.mode)
		n.mu.Lock()
		free := func(rs []*relay) []*relay {
			return slices.DeleteFunc(slices.Clone(rs), func(rl *relay) bool { return n.busy[rl.name] })
		}
		var target *relay
		switch f.role {
		case history.RoleLeader:
			if len(leaders) > 0 {
				if !n.busy[leaders[0].name] {
					target, f.leader = leaders[0], true
				}
			} else if !f.required && time.Now().After(noLeaderUntil) {
				if c := free(others); len(c) > 0 {
					target = c[f.pick%len(c)]
				}
			}
		case history.RoleFollower:
			if c := free(others); len(c) > 0 {
				target = c[f.pick%len(c)]
			}
		default:
			if c := free(append(leaders, others...)); len(c) > 0 {
				target = c[f.pick%len(c)]
				f.leader = slices.Contains(leaders, target)
			}
		}
		if target != nil {
			n.busy[target.name] = true
			f.relay = target
		}
		n.mu.Unlock()
		if target != nil {
			return nil
		}
		if !sleep(ctx, 250*time.Millisecond) {
			return fmt.Errorf("no %s of %s free until the fault period ended", f.role, f.mode.mode.Name)
		}
	}
}

// roles scrapes the running relays of m now: those that report leadership (the mode's own
// relays; a neighbour leads a slot of its own) and the rest, each in name order.
func (n *nemesis) roles(ctx context.Context, m *modeRun) (leaders, others []*relay) {
	all := m.allRelays()
	lead := make([]bool, len(all))
	up := make([]bool, len(all))
	var wg sync.WaitGroup
	for i, rl := range all {
		if !rl.Running() || rl.paused() {
			continue
		}
		wg.Go(func() {
			var l bool
			up[i], l = rl.scrape(ctx, n.run.http)
			lead[i] = l && !m.mode.Poll && slices.Contains(m.relays, rl)
		})
	}
	wg.Wait()
	for i, rl := range all {
		switch {
		case lead[i]:
			leaders = append(leaders, rl)
		case up[i]:
			others = append(others, rl)
		}
	}
	return leaders, others
}

func (n *nemesis) release(f *fault) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.busy, f.relay.name)
}

// skip records a fault that never applied.
func (n *nemesis) skip(f *fault, why string) {
	now := time.Now()
	rec := history.Fault{Kind: f.kind, Target: targetOf(f), Start: now, End: now, Seq: f.seq, Role: f.role, Skipped: why}
	n.run.logf("fault #%d %s %s skipped: %s", f.seq, f.kind, rec.Target, why)
	n.run.recordFault(f.mode, rec)
}

// apply applies f, waits its duration (or until ctx ends) and heals it, recording it: as failed
// when its action failed, as skipped when it could not apply.
func (n *nemesis) apply(ctx context.Context, f *fault) {
	r := n.run
	rec := history.Fault{Kind: f.kind, Detail: f.detail, Start: time.Now(), Target: targetOf(f), Seq: f.seq, Role: f.role, Leader: f.leader}
	leading := ""
	if f.leader {
		leading = ", leading"
	}
	r.logf("fault #%d %s %s%s%s", f.seq, f.kind, rec.Target, leading, detailSuffix(f))
	// heal runs whatever ends the fault with a context of its own: the run's end cancels ctx,
	// and every fault must still be healed then.
	heal := func(fn func(context.Context) error) {
		hctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := fn(hctx); err != nil {
			r.note("fault #%d %s %s: heal: %v", f.seq, f.kind, rec.Target, err)
			r.mu.Lock()
			r.unhealed = append(r.unhealed, fmt.Sprintf("fault #%d %s %s: %v", f.seq, f.kind, rec.Target, err))
			r.mu.Unlock()
		}
	}
	err := n.act(ctx, f, &rec, heal)
	rec.End = time.Now()
	switch {
	case errors.Is(err, errSkipped):
		rec.Skipped = strings.TrimPrefix(err.Error(), errSkipped.Error()+": ")
		if scopeOf(f.kind) == scopeCluster {
			r.note("fault #%d %s skipped: %s", f.seq, f.kind, rec.Skipped) // a failover the standby was not ready for
		} else {
			r.logf("fault #%d %s skipped: %s", f.seq, f.kind, rec.Skipped)
		}
	case err != nil:
		rec.Failed = err.Error()
		r.note("fault #%d %s %s failed (it counts for nothing): %v", f.seq, f.kind, rec.Target, err)
	default:
		r.logf("fault #%d %s %s healed after %s", f.seq, f.kind, rec.Target, rec.End.Sub(rec.Start).Round(100*time.Millisecond))
	}
	r.recordFault(f.mode, rec)
}

var errSkipped = errors.New("skipped")

func detailSuffix(f *fault) string {
	s := ""
	if f.d > 0 {
		s += fmt.Sprintf(" for %s", f.d.Round(100*time.Millisecond))
	}
	if f.detail != "" {
		s += " (" + f.detail + ")"
	}
	return s
}

// targetOf names f's target: its relay, its mode (or the role it waits for), or the server.
func targetOf(f *fault) string {
	switch {
	case f.relay != nil:
		return f.relay.name
	case f.mode != nil && scopeOf(f.kind) == scopeRelay:
		return f.role + " of " + f.mode.mode.Name
	case f.mode != nil:
		return f.mode.mode.Name
	}
	switch f.kind {
	case kindBrokerStop, kindBrokerPause, kindBrokerKill, kindLeaderChange, kindCoordinatorMove, kindISRShrink:
		return "broker"
	}
	return "postgres"
}

// act does the fault's work.
func (n *nemesis) act(ctx context.Context, f *fault, rec *history.Fault, heal func(func(context.Context) error)) error {
	r := n.run
	c := r.cluster
	switch f.kind {
	case kindKill9:
		if !f.relay.Running() {
			return fmt.Errorf("%w: %s is not running", errSkipped, f.relay.name)
		}
		if err := f.relay.kill(ctx); err != nil {
			return err
		}
		sleep(ctx, f.d)
		heal(func(context.Context) error { return f.relay.start() })
	case kindSigterm:
		if !f.relay.Running() || f.relay.paused() {
			return fmt.Errorf("%w: %s is not running", errSkipped, f.relay.name)
		}
		signalled, exited, code, err := f.relay.terminate(context.Background(), r.shutdownTimeout+r.stopSlack+15*time.Second)
		if err != nil {
			return err
		}
		r.recordStop(f.mode, history.Stop{Relay: f.relay.name, Signal: signalled, Exited: exited, Code: code})
		sleep(ctx, f.d)
		heal(func(context.Context) error { return f.relay.start() })
	case kindPause:
		if !f.relay.Running() {
			return fmt.Errorf("%w: %s is not running", errSkipped, f.relay.name)
		}
		if err := f.relay.signal(syscall.SIGSTOP); err != nil {
			return err
		}
		sleep(ctx, f.d)
		heal(func(context.Context) error {
			if !f.relay.Running() {
				return nil
			}
			return f.relay.signal(syscall.SIGCONT)
		})
	case kindCutPG, kindCutKafka, kindCutBoth:
		if f.kind != kindCutKafka {
			c.CutPostgres(f.relay.name)
		}
		if f.kind != kindCutPG {
			c.CutKafka(f.relay.name)
		}
		sleep(ctx, f.d)
		heal(func(context.Context) error {
			if f.kind != kindCutKafka {
				c.HealPostgres(f.relay.name)
			}
			if f.kind != kindCutPG {
				c.HealKafka(f.relay.name)
			}
			return nil
		})
	case kindBrokerStop, kindBrokerPause, kindBrokerKill, kindLeaderChange, kindCoordinatorMove, kindISRShrink:
		return n.brokerFault(ctx, f, rec, heal)
	case kindPGRestart, kindPGImmediate:
		var err error
		heal(func(hctx context.Context) error {
			err = c.RestartPostgres(hctx, f.kind == kindPGImmediate)
			return nil
		})
		return err
	case kindFailoverSync, kindFailoverLag:
		// The setting protects what walsenders send from the moment it is in force: armed a few
		// seconds ahead, everything the standby lacks at the kill was sent under it.
		// The checker pins a lost transaction to the failover by the time of its kill: a failover
		// recorded without one would take the blame for another's losses, and one recorded at
		// the time it was drawn would miss the transactions begun in the seconds before the kill.
		if !r.standby {
			return fmt.Errorf("%w: the run has no standby (PostgreSQL before 17, or no WAL mode)", errSkipped)
		}
		synced := f.kind == kindFailoverSync
		if err := c.SetSynchronized(ctx, synced); err != nil {
			r.note("fault #%d %s: nothing killed: %v", f.seq, f.kind, err)
			return fmt.Errorf("%w: %v", errSkipped, err)
		}
		sleep(ctx, 3*time.Second)
		var err error
		var res cluster.FailoverResult
		heal(func(hctx context.Context) error {
			res, err = c.Failover(hctx, synced)
			if err == nil {
				rec.Detail = fmt.Sprintf("promoted after %s, next standby after %s",
					res.Promoted.Sub(res.Killed).Round(time.Millisecond), res.NewStandbyReady.Sub(res.Killed).Round(100*time.Millisecond))
			}
			return nil
		})
		switch {
		case errors.Is(err, cluster.ErrNotReady):
			return fmt.Errorf("%w: %v", errSkipped, err)
		case res.Killed.IsZero():
			if err != nil {
				r.note("fault #%d %s: nothing killed: %v", f.seq, f.kind, err)
			}
			return fmt.Errorf("%w: %v", errSkipped, err)
		}
		rec.Start = res.Killed
		if err != nil {
			// The primary was killed: the fault took effect, whatever step failed after.
			r.note("fault #%d %s: after the kill: %v", f.seq, f.kind, err)
		}
		return nil
	case kindOtherLoad:
		return f.mode.writers.OtherLoad(ctx, f.d, 200)
	case kindBigTx:
		rec.Detail = fmt.Sprintf("%d events", f.events)
		return f.mode.writers.BigTransaction(ctx, f.events)
	case kindAddColumn:
		col := f.detail // drawn in the plan: chaos_c1, chaos_c2, ...
		// PostgreSQL may be restarting or failing over: an operator would try again.
		var err error
		for range 30 {
			if err = c.AddColumn(ctx, f.mode.db, f.mode.table, col); err == nil || !sleep(ctx, time.Second) {
				break
			}
		}
		return err
	case kindNeighbour:
		if f.detail != "" {
			return n.actPG(ctx, f, rec, heal) // a variant under a PostgreSQL fault
		}
		return r.startNeighbour(ctx, f.mode)
	case kindSlotInvalidated, kindStandbyStop, kindStandbyLag, kindPGFreeze, kindPrune:
		return n.actPG(ctx, f, rec, heal)
	case kindOOM:
		return n.actProc(ctx, f, rec, heal)
	case kindNetSlow, kindOneWayKafka, kindOneWayPG, kindCutHealOpen, kindCutLeaderLock:
		return actNet(ctx, c, f, heal)
	case kindSlotLost:
		lost, err := c.LoseSlot(ctx, f.mode.db, f.mode.slot)
		if errors.Is(err, cluster.ErrNoHorizon) {
			return fmt.Errorf("%w: %v", errSkipped, err)
		}
		if err != nil {
			return err
		}
		rec.Lost = lost
		r.logf("fault #%d %s %s: slot %s dropped %s after the fault began", f.seq, f.kind, rec.Target, f.mode.slot, lost.Sub(rec.Start).Round(time.Millisecond))
		// The fault lasts until the relays have recovered: the checker's window for the gap's
		// second copies runs from its end.
		heal(func(hctx context.Context) error {
			rcv, err := c.WaitSlotRecovered(hctx, f.mode.db, f.mode.slot, lost)
			if err == nil {
				rec.Detail = fmt.Sprintf("recovered %d events by rule %s after %s", rcv.Events, rcv.Rule, rcv.At.Sub(lost).Round(100*time.Millisecond))
			}
			return err
		})
	}
	return nil
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
