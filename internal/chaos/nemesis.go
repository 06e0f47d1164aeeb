package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/cluster"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
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
	return append(ShortKinds(), kindSlotLost, kindOneWayPG)
}

// ShortKinds lists the kinds of the short schedule make test runs: every kind but the lost slot,
// whose recovery publishes a whole gap again and is left to the long runs of make chaos, and the
// one-way cut of PostgreSQL, which a relay meets as it does cut-pg (a timeout) but for statements
// applied unanswered.
func ShortKinds() []string {
	return []string{kindKill9, kindSigterm, kindPause, kindCutPG, kindCutKafka, kindCutBoth, kindBrokerStop,
		kindBrokerPause, kindPGRestart, kindPGImmediate, kindFailoverSync, kindFailoverLag, kindOtherLoad,
		kindBigTx, kindAddColumn, kindNeighbour,
		kindNetSlow, kindOneWayKafka, kindCutHealOpen, kindCutLeaderLock}
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
	case kindKill9, kindSigterm, kindPause, kindCutPG, kindCutKafka, kindCutBoth:
		return scopeRelay
	case kindNetSlow, kindOneWayKafka, kindOneWayPG, kindCutHealOpen, kindCutLeaderLock:
		return scopeRelay
	case kindBigTx, kindAddColumn, kindNeighbour, kindOtherLoad, kindSlotLost:
		return scopeMode
	}
	return scopeCluster
}

// nemesis draws faults from a seed and applies them, overlapping, until its context ends.
type nemesis struct {
	run   *runner
	rng   *rand.Rand
	kinds []string
	mean  time.Duration // mean time between two fault starts

	mu       sync.Mutex
	active   map[string]int  // faults running per exclusion group
	busy     map[string]bool // relays under a fault
	columns  map[string]int  // columns added per mode
	deck     []string        // the kinds left in this round
	modeDeck []*modeRun      // the modes left in this round
	wg       sync.WaitGroup
	sequence int
}

// group is what two faults must not share at once: the broker, PostgreSQL (restarts, failovers,
// and a neighbour's start, which creates a slot: one created while a failover waits for the
// standby's copies is missed by that wait and lost at the promotion, which the relay rightly
// refuses to paper over), a mode's big transaction or other load. A lost slot's recovery counts
// as PostgreSQL's too, until it has ended: a failover before the replacement slot's copy is
// persisted would lose that slot as well, which is another fault than the one drawn.
func group(kind, mode string) string {
	switch kind {
	case kindBrokerStop, kindBrokerPause:
		return "broker"
	case kindPGRestart, kindPGImmediate, kindFailoverSync, kindFailoverLag, kindNeighbour, kindSlotLost:
		return "postgres"
	case kindBigTx, kindOtherLoad, kindAddColumn:
		return kind + "/" + mode
	}
	return ""
}

// loop starts a fault every so often (exponentially distributed gaps) until ctx ends, then waits
// for the running ones to heal.
func (n *nemesis) loop(ctx context.Context) {
	defer n.wg.Wait()
	for {
		gap := time.Duration(n.rng.ExpFloat64() * float64(n.mean))
		gap = min(max(gap, n.mean/8), 3*n.mean)
		if !sleep(ctx, gap) {
			return
		}
		n.startOne(ctx)
	}
}

// startOne draws the next eligible fault and applies it in the background. Kinds come from a
// shuffled deck, every kind once per round, so that a short schedule still applies each of them;
// a kind that cannot apply now goes to the back of the round.
func (n *nemesis) startOne(ctx context.Context) {
	f := n.draw()
	if f == nil {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer n.release(f)
		n.apply(ctx, f)
	}()
}

// draw takes the next kind that can apply now from the deck and picks its target; nil when
// none can. When nothing left in this round can apply (those kinds wait for a fault of their
// group to heal, or can never apply again), the next round's kinds join the deck.
func (n *nemesis) draw() *fault {
	for round := 0; round < 2; round++ {
		if round == 1 || len(n.deck) == 0 {
			next := append([]string(nil), n.kinds...)
			n.rng.Shuffle(len(next), func(i, j int) { next[i], next[j] = next[j], next[i] })
			for _, k := range next {
				if !slices.Contains(n.deck, k) {
					n.deck = append(n.deck, k)
				}
			}
		}
		for range len(n.deck) {
			kind := n.deck[0]
			n.deck = n.deck[1:]
			if f, ok := n.pick(kind); ok {
				return f
			}
			n.deck = append(n.deck, kind)
		}
	}
	return nil
}

// nextMode draws the mode a relay or mode fault goes to from a deck of its own (each mode once
// per round), among those ok accepts.
func (n *nemesis) nextMode(ok func(*modeRun) bool) *modeRun {
	for range 2 {
		if len(n.modeDeck) == 0 {
			n.modeDeck = append([]*modeRun(nil), n.run.modes...)
			n.rng.Shuffle(len(n.modeDeck), func(i, j int) { n.modeDeck[i], n.modeDeck[j] = n.modeDeck[j], n.modeDeck[i] })
		}
		for i, m := range n.modeDeck {
			if ok(m) {
				n.modeDeck = append(n.modeDeck[:i:i], n.modeDeck[i+1:]...)
				return m
			}
		}
		n.modeDeck = nil // none of this round fits: a new round
	}
	return nil
}

// fault is one drawn fault before it is applied.
type fault struct {
	kind   string
	mode   *modeRun // nil for cluster faults
	relay  *relay   // relay faults
	d      time.Duration
	detail string
	events int // of a big transaction
	group  string
	seq    int
}

// pick draws a target and a duration for kind, if the kind can apply now.
func (n *nemesis) pick(kind string) (*fault, bool) {
	r := n.run
	n.mu.Lock()
	defer n.mu.Unlock()
	f := &fault{kind: kind}
	switch scopeOf(kind) {
	case scopeRelay:
		free := func(m *modeRun) []*relay {
			var out []*relay
			for _, rl := range m.allRelays() {
				if !n.busy[rl.name] {
					out = append(out, rl)
				}
			}
			return out
		}
		m := n.nextMode(func(m *modeRun) bool { return len(free(m)) > 0 && (kind != kindCutLeaderLock || !m.mode.Poll) })
		if m == nil {
			return nil, false
		}
		candidates := free(m)
		f.relay = candidates[n.rng.IntN(len(candidates))]
		// The leader is the interesting target more often than not.
		if l := m.leader(); l != nil && !n.busy[l.name] && n.rng.Float64() < 0.6 {
			f.relay = l
		}
		f.mode = m
	case scopeMode:
		f.mode = n.nextMode(func(m *modeRun) bool {
			switch kind {
			case kindNeighbour:
				return m.neighbour != nil && !m.neighbourStarted
			case kindAddColumn:
				return m.mode.Shape != workload.Messages && n.columns[m.mode.Name] < 3
			case kindSlotLost:
				return r.recovers(m.mode)
			}
			return true
		})
		if f.mode == nil {
			return nil, false
		}
	case scopeCluster:
		switch kind {
		case kindFailoverSync, kindFailoverLag:
			if !r.standby {
				return nil, false
			}
		}
	}
	modeName := ""
	if f.mode != nil {
		modeName = f.mode.mode.Name
	}
	f.group = group(kind, modeName)
	if f.group != "" && n.active[f.group] > 0 {
		return nil, false
	}
	f.d, f.detail = n.duration(kind)
	if kind == kindBigTx {
		f.events = 20_000 + n.rng.IntN(80_000)
		if r.opts.Short {
			f.events = 3_000
		}
	}
	if f.group != "" {
		n.active[f.group]++
	}
	if f.relay != nil {
		n.busy[f.relay.name] = true
	}
	if kind == kindAddColumn {
		n.columns[modeName]++
	}
	if kind == kindNeighbour {
		f.mode.neighbourStarted = true
	}
	n.sequence++
	f.seq = n.sequence
	return f, true
}

func (n *nemesis) release(f *fault) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f.group != "" {
		n.active[f.group]--
	}
	if f.relay != nil {
		delete(n.busy, f.relay.name)
	}
}

// duration draws how long a kind lasts; detail says which variant was drawn.
func (n *nemesis) duration(kind string) (time.Duration, string) {
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(n.rng.Float64()*float64(hi-lo))
	}
	lease := n.run.lease
	switch kind {
	case kindKill9, kindSigterm:
		return between(200*time.Millisecond, 4*time.Second), "" // until the restart
	case kindPause:
		if n.rng.IntN(2) == 0 {
			return between(time.Second, lease*8/10), "shorter than the lease"
		}
		return between(lease*13/10, lease*5/2), "longer than the lease (a zombie)"
	case kindCutPG, kindCutKafka, kindCutBoth:
		return between(2*time.Second, 20*time.Second), ""
	case kindBrokerStop:
		return between(2*time.Second, 25*time.Second), ""
	case kindBrokerPause:
		// Past broker.session.timeout.ms (9 s) the broker fences itself on waking, and its
		// partitions are without a leader for a moment: a transaction coordinator then drops their
		// markers (docs/guarantees.md, "Lost transaction markers").
		return between(time.Second, 15*time.Second), ""
	case kindOtherLoad:
		return between(5*time.Second, 30*time.Second), ""
	case kindNetSlow, kindOneWayKafka, kindOneWayPG, kindCutHealOpen, kindCutLeaderLock:
		return netDuration(kind, n.rng, between)
	}
	return 0, ""
}

// apply applies f, waits its duration (or until ctx ends) and heals it, recording it.
func (n *nemesis) apply(ctx context.Context, f *fault) {
	r := n.run
	rec := history.Fault{Kind: f.kind, Detail: f.detail, Start: time.Now()}
	switch {
	case f.relay != nil:
		rec.Target = f.relay.name
	case f.mode != nil:
		rec.Target = f.mode.mode.Name
	default:
		rec.Target = targetOf(f.kind)
	}
	r.logf("fault #%d %s %s%s", f.seq, f.kind, rec.Target, detailSuffix(f))
	// heal runs whatever ends the fault with a context of its own: the run's end cancels ctx,
	// and every fault must still be healed then.
	heal := func(fn func(context.Context) error) {
		hctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := fn(hctx); err != nil {
			r.note("fault #%d %s %s: heal: %v", f.seq, f.kind, rec.Target, err)
		}
	}
	err := n.act(ctx, f, &rec, heal)
	switch {
	case errors.Is(err, errSkipped):
		if scopeOf(f.kind) == scopeCluster {
			r.note("fault #%d %s skipped: %v", f.seq, f.kind, err) // a failover the standby was not ready for
		} else {
			r.logf("fault #%d %s skipped: %v", f.seq, f.kind, err)
		}
		return
	case err != nil:
		r.note("fault #%d %s %s: %v", f.seq, f.kind, rec.Target, err)
	}
	rec.End = time.Now()
	r.logf("fault #%d %s %s healed after %s", f.seq, f.kind, rec.Target, rec.End.Sub(rec.Start).Round(100*time.Millisecond))
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

func targetOf(kind string) string {
	switch kind {
	case kindBrokerStop, kindBrokerPause:
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
	case kindBrokerStop:
		if err := c.StopBroker(ctx); err != nil {
			heal(c.StartBroker)
			return err
		}
		sleep(ctx, f.d)
		heal(c.StartBroker)
	case kindBrokerPause:
		if err := c.PauseBroker(); err != nil {
			return err
		}
		sleep(ctx, f.d)
		heal(func(context.Context) error { return c.ResumeBroker() })
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
		return err
	case kindOtherLoad:
		return f.mode.writers.OtherLoad(ctx, f.d, 200)
	case kindBigTx:
		rec.Detail = fmt.Sprintf("%d events", f.events)
		return f.mode.writers.BigTransaction(ctx, f.events)
	case kindAddColumn:
		n.mu.Lock()
		col := fmt.Sprintf("chaos_c%d", n.columns[f.mode.mode.Name])
		n.mu.Unlock()
		rec.Detail = col
		// PostgreSQL may be restarting or failing over: an operator would try again.
		var err error
		for range 30 {
			if err = c.AddColumn(ctx, f.mode.db, f.mode.table, col); err == nil || !sleep(ctx, time.Second) {
				break
			}
		}
		return err
	case kindNeighbour:
		return r.startNeighbour(ctx, f.mode)
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
