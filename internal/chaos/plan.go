package chaos

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
)

// planner draws a whole schedule up front from a seed: times, kinds, modes, targets by role
// (resolved to a relay only when the fault applies), durations, details, big transactions'
// sizes. Nothing it draws depends on what happens in the run, so the same seed and options give
// the same plan, and a plan saved in a history runs again as it was (--replay).
type planner struct {
	opts     Options // what a kind's eligibility may depend on (never the run's state)
	rng      *rand.Rand
	kinds    []string
	modes    []Mode
	standby  bool
	recovers func(Mode) bool
	lease    time.Duration
	short    bool

	deck       []string // the kinds left in this round
	modeDeck   []Mode   // the modes left in this round
	columns    map[string]int
	neighbours map[string]bool
	// must are faults every run needs (history.Required): a kill and a zombie pause of each
	// mode's leader and a failover, dealt between the deck's kinds, one every other fault, until
	// none is left.
	must []history.PlannedFault
}

// drawPlan draws the schedule of a run with options o (defaults applied) for the fault period.
func drawPlan(o Options, standby bool, lease time.Duration) []history.PlannedFault {
	p := newPlanner(o, standby, lease)
	p.dealMust()
	var plan []history.PlannedFault
	at := time.Duration(0)
	for {
		gap := time.Duration(p.rng.ExpFloat64() * float64(o.Mean))
		at += min(max(gap, o.Mean/8), 3*o.Mean)
		if at >= o.Duration {
			return plan
		}
		var f history.PlannedFault
		var ok bool
		if len(p.must) > 0 && len(plan)%2 == 0 {
			f, p.must, ok = p.must[0], p.must[1:], true
		} else {
			f, ok = p.draw()
		}
		if !ok {
			continue // nothing can be drawn from these kinds any more
		}
		f.Seq, f.At = len(plan)+1, at
		plan = append(plan, f)
	}
}

func newPlanner(o Options, standby bool, lease time.Duration) *planner {
	return &planner{
		opts: o, rng: rand.New(rand.NewPCG(o.Seed, 0x706c616e)), kinds: o.Kinds, modes: o.Modes, standby: standby,
		recovers: func(m Mode) bool { return recovers(m, o.Kinds) }, lease: lease, short: o.Short,
		columns: make(map[string]int), neighbours: make(map[string]bool),
	}
}

// dealMust lists, in a drawn order, the faults a run must carry out: per mode a kill9 and a
// pause longer than the lease of its leader (of any relay where nobody leads), and one failover
// when the run has a standby; each only when its kind is drawn from.
func (p *planner) dealMust() {
	for _, m := range p.modes {
		role := history.RoleLeader
		if m.Poll {
			role = history.RoleAny
		}
		if slices.Contains(p.kinds, kindKill9) {
			d, detail := p.duration(kindKill9)
			p.must = append(p.must, history.PlannedFault{Kind: kindKill9, Mode: m.Name, Role: role, Duration: d, Detail: detail, Required: true})
		}
		if slices.Contains(p.kinds, kindPause) {
			d, detail := p.zombie()
			p.must = append(p.must, history.PlannedFault{Kind: kindPause, Mode: m.Name, Role: role, Duration: d, Detail: detail, Required: true})
		}
	}
	if p.standby && slices.Contains(p.kinds, kindFailoverSync) {
		p.must = append(p.must, history.PlannedFault{Kind: kindFailoverSync, Required: true})
	} else if p.standby && slices.Contains(p.kinds, kindFailoverLag) {
		p.must = append(p.must, history.PlannedFault{Kind: kindFailoverLag, Required: true})
	}
	p.rng.Shuffle(len(p.must), func(i, j int) { p.must[i], p.must[j] = p.must[j], p.must[i] })
}

// draw takes the next kind from the deck, every kind once per round in a shuffled order, and
// draws the rest of the fault; a kind that can never apply again (every neighbour started, every
// column added) leaves the deck. false when no kind can.
func (p *planner) draw() (history.PlannedFault, bool) {
	for range 2 {
		if len(p.deck) == 0 {
			p.deck = slices.Clone(p.kinds)
			p.rng.Shuffle(len(p.deck), func(i, j int) { p.deck[i], p.deck[j] = p.deck[j], p.deck[i] })
		}
		for len(p.deck) > 0 {
			kind := p.deck[0]
			p.deck = p.deck[1:]
			if f, ok := p.fault(kind); ok {
				return f, true
			}
		}
	}
	return history.PlannedFault{}, false
}

// fault draws a fault of kind: its mode and role, duration and details; false when it cannot
// apply in this run any more.
func (p *planner) fault(kind string) (history.PlannedFault, bool) {
	f := history.PlannedFault{Kind: kind}
	switch scopeOf(kind) {
	case scopeRelay:
		// Pollers elect no leader: they have no leader lock to cut.
		m, ok := p.nextMode(func(m Mode) bool { return kind != kindCutLeaderLock || !m.Poll })
		if !ok {
			return f, false
		}
		f.Mode = m.Name
		switch {
		case m.Poll:
			f.Role = history.RoleAny // pollers share the table: nobody leads
		case p.rng.Float64() < 0.6: // the leader is the interesting target more often than not
			f.Role = history.RoleLeader
		default:
			f.Role = history.RoleFollower
		}
		f.Pick = p.rng.IntN(1 << 16)
	case scopeMode:
		m, ok := p.nextMode(func(m Mode) bool {
			switch kind {
			case kindNeighbour:
				return m.Delivery == history.ExactlyOnce && !p.neighbours[m.Name]
			case kindAddColumn:
				return m.Shape != workload.Messages && p.columns[m.Name] < 3
			case kindSlotLost:
				return p.recovers(m)
			}
			return pgEligible(kind, &m, p.standby, p.recovers)
		})
		if !ok {
			return f, false
		}
		f.Mode = m.Name
		switch kind {
		case kindNeighbour:
			p.neighbours[m.Name] = true
		case kindAddColumn:
			p.columns[m.Name]++
			f.Detail = fmt.Sprintf("chaos_c%d", p.columns[m.Name])
		case kindBigTx:
			f.Events = 20_000 + p.rng.IntN(80_000)
			if p.short {
				f.Events = 3_000
			}
		}
	case scopeCluster:
		// Whether a cluster kind can apply is decided here, from the options alone; what only
		// the moment can tell (a standby not ready) is act's to skip.
		if (kind == kindFailoverSync || kind == kindFailoverLag) && !p.standby || !pgEligible(kind, nil, p.standby, p.recovers) {
			return f, false
		}
	}
	if node := brokerNode(kind, p.opts.Brokers, p.rng); node > 0 {
		f.Pick = node
	}
	d, detail := p.duration(kind)
	f.Duration = d
	if detail != "" {
		f.Detail = detail
	}
	return f, true
}

// nextMode draws the mode a relay or mode fault goes to from a deck of its own (each mode once
// per round), among those ok accepts.
func (p *planner) nextMode(ok func(Mode) bool) (Mode, bool) {
	for range 2 {
		if len(p.modeDeck) == 0 {
			p.modeDeck = slices.Clone(p.modes)
			p.rng.Shuffle(len(p.modeDeck), func(i, j int) { p.modeDeck[i], p.modeDeck[j] = p.modeDeck[j], p.modeDeck[i] })
		}
		for i, m := range p.modeDeck {
			if ok(m) {
				p.modeDeck = slices.Delete(p.modeDeck, i, i+1)
				return m, true
			}
		}
		p.modeDeck = nil // none of this round fits: a new round
	}
	return Mode{}, false
}

// duration draws how long a kind lasts; detail says which variant was drawn.
func (p *planner) duration(kind string) (time.Duration, string) {
	switch kind {
	case kindKill9, kindSigterm:
		return p.between(200*time.Millisecond, 4*time.Second), "" // until the restart
	case kindPause:
		if p.rng.IntN(2) == 0 {
			return p.between(time.Second, p.lease*8/10), "shorter than the lease"
		}
		return p.zombie()
	case kindCutPG, kindCutKafka, kindCutBoth:
		return p.between(2*time.Second, 20*time.Second), ""
	case kindBrokerStop:
		if p.short { // six kinds share the broker in 90 s
			return p.between(2*time.Second, 10*time.Second), ""
		}
		return p.between(2*time.Second, 25*time.Second), ""
	case kindBrokerPause:
		// Past broker.session.timeout.ms (9 s; 4.5 s with three brokers) the broker fences itself
		// on waking, and its partitions are without a leader for a moment: a transaction
		// coordinator then drops their markers (docs/guarantees.md, "Lost transaction markers").
		if p.short {
			return p.between(time.Second, 10*time.Second), ""
		}
		return p.between(time.Second, 15*time.Second), ""
	case kindBrokerKill, kindCoordinatorMove, kindISRShrink:
		return brokerDuration(p.short, p.between), ""
	case kindOtherLoad:
		return p.between(5*time.Second, 30*time.Second), ""
	case kindNetSlow, kindOneWayKafka, kindOneWayPG, kindCutHealOpen, kindCutLeaderLock:
		return netDuration(kind, p.rng, p.between)
	case kindSlotInvalidated, kindStandbyStop, kindStandbyLag, kindPGFreeze, kindPrune, kindNeighbour, kindOOM:
		return pgDuration(kind, p.rng, p.between, p.standby)
	}
	return 0, ""
}

// zombie draws a pause longer than the lease: the relay resumes after another took over.
func (p *planner) zombie() (time.Duration, string) {
	return p.between(p.lease*13/10, p.lease*5/2), "longer than the lease (a zombie)"
}

func (p *planner) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(p.rng.Float64()*float64(hi-lo))
}

// modeSeed is the seed of a mode's writers: from the run's seed and the mode's name alone, so
// that a replay of one mode writes what that mode wrote in the whole run.
func modeSeed(seed uint64, mode string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(mode))
	return rand.New(rand.NewPCG(seed, h.Sum64())).Uint64()
}
