package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/config"
)

// A sweep (Config.Sweep, BENCH_SWEEP) measures the relay's steady state at several settings of
// the knob between latency and cost, kafka.linger (and, for exactly-once, transaction_interval,
// its upper bound on a Kafka transaction's length), in the same run and the same rounds as the
// sides it is compared with: each setting's p99 against the broker's and the relay's CPU per event
// is one point of a curve (sweepTable, writeSweepChart).

// sweepPoint is one setting of a sweep. A zero Interval leaves transaction_interval at the relay's
// default.
type sweepPoint struct {
	Linger   time.Duration
	Interval time.Duration
}

// defaultSweep is what BENCH_SWEEP=on measures: from a linger that sends almost at once to one
// whose p99 is Debezium-like cheapness territory, with the default among them.
const defaultSweep = "5ms,15ms,25ms,40ms,80ms/200ms"

// relayDefaults are the relay's own defaults of the swept keys and their flags, read from its
// configuration's table so the chart marks what a user actually gets.
type relayDefaults struct {
	linger, interval         time.Duration
	lingerFlag, intervalFlag string
}

func defaultsOfTheRelay() (relayDefaults, error) {
	var d relayDefaults
	for _, k := range config.Keys() {
		var dst *time.Duration
		switch k.Name {
		case "kafka.linger":
			dst, d.lingerFlag = &d.linger, k.Flag()
		case "transaction_interval":
			dst, d.intervalFlag = &d.interval, k.Flag()
		default:
			continue
		}
		v, err := time.ParseDuration(k.Default)
		if err != nil {
			return d, fmt.Errorf("the relay's default of %s, %q, is not a duration: %w", k.Name, k.Default, err)
		}
		*dst = v
	}
	if d.lingerFlag == "" || d.intervalFlag == "" {
		return d, fmt.Errorf("the relay's configuration has no kafka.linger or transaction_interval key")
	}
	return d, nil
}

// parseSweep reads BENCH_SWEEP: empty or "off" for none, "on" for defaultSweep, else a
// comma-separated list of kafka.linger values, each optionally followed by /transaction_interval.
func parseSweep(s string) ([]sweepPoint, error) {
	switch strings.TrimSpace(s) {
	case "", "off", "false", "0":
		return nil, nil
	case "on", "true", "1":
		s = defaultSweep
	}
	var out []sweepPoint
	for _, item := range splitList(s) {
		l, iv, hasInterval := strings.Cut(item, "/")
		var p sweepPoint
		var err error
		if p.Linger, err = time.ParseDuration(l); err != nil || p.Linger < 0 {
			return nil, fmt.Errorf("sweep point %q: kafka.linger %q is not a non-negative duration such as 15ms (BENCH_SWEEP takes e.g. %s)", item, l, defaultSweep)
		}
		if hasInterval {
			if p.Interval, err = time.ParseDuration(iv); err != nil || p.Interval < 10*time.Millisecond {
				return nil, fmt.Errorf("sweep point %q: transaction_interval %q is not a duration of at least 10ms (BENCH_SWEEP takes e.g. %s)", item, iv, defaultSweep)
			}
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("sweep point %q is listed twice", item)
		}
		out = append(out, p)
	}
	return out, nil
}

// swept says whether a steady-state side is measured at every point of a sweep: the relay in both
// delivery modes. Debezium and the poller keep their own settings (one point each per round).
func swept(side string) bool { return side == sideRelay || side == sideRelayEOS }

// pointsFor is side's settings in round (rotated by the round, so no setting always runs first):
// at-least-once has no transactions, so its points are the distinct lingers.
func (b *bench) pointsFor(side string) []sweepPoint {
	var out []sweepPoint
	for _, p := range b.cfg.Sweep {
		if side != sideRelayEOS {
			p.Interval = 0
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	if len(out) > 0 {
		k := b.round % len(out)
		out = append(out[k:], out[:k]...)
	}
	return out
}

// args are the relay's flags for p on side.
func (d relayDefaults) args(side string, p sweepPoint) []string {
	out := []string{d.lingerFlag + "=" + p.Linger.String()}
	if side == sideRelayEOS && p.Interval > 0 {
		out = append(out, d.intervalFlag+"="+p.Interval.String())
	}
	return out
}

// isDefault says whether p on side is what the relay does when told nothing.
func (d relayDefaults) isDefault(side string, p sweepPoint) bool {
	if p.Linger != d.linger {
		return false
	}
	return side != sideRelayEOS || p.Interval == 0 || p.Interval == d.interval
}

// name tells p's slot, topics and log apart from the other points': l15ms, l80ms-t200ms.
func (p sweepPoint) name() string {
	s := "l" + p.Linger.String()
	if p.Interval > 0 {
		s += "-t" + p.Interval.String()
	}
	return strings.ReplaceAll(s, ".", "_")
}

// label is p as the tables show it.
func (p sweepPoint) label(side string, d relayDefaults) string {
	s := "linger " + fmtDuration(p.Linger)
	if side == sideRelayEOS {
		iv := p.Interval
		if iv == 0 {
			iv = d.interval
		}
		s += ", transaction_interval " + fmtDuration(iv)
	}
	if d.isDefault(side, p) {
		s += " (default)"
	}
	return s
}

func fmtDuration(d time.Duration) string {
	if d%time.Millisecond == 0 {
		return fmt.Sprintf("%d ms", d/time.Millisecond)
	}
	return d.String()
}

// steadyPhase runs the steady states: each round runs every swept side at every point (points
// outside, sides inside, so the two modes at one setting run next to each other), then the other
// sides; without a sweep, every side once per round as before.
func (b *bench) steadyPhase(ctx context.Context, rep *Report) error {
	defer func() { b.round = 0 }()
	add := func(r SteadyResult) {
		r.Round = b.round
		rep.Steady = append(rep.Steady, r)
		b.logf("%s", r.line())
	}
	for round := range b.rounds() {
		b.round = round
		var rest []string
		var sweptSides []string
		for _, s := range b.cfg.Steady {
			if round > 0 && !interleavedSteady(s) {
				continue
			}
			if len(b.cfg.Sweep) > 0 && swept(s) {
				sweptSides = append(sweptSides, s)
			} else {
				rest = append(rest, s)
			}
		}
		if len(sweptSides) > 0 {
			// Exactly-once's points when it is swept (the whole list), else at-least-once's, in
			// this round's rotated order; at-least-once skips a point whose linger it has
			// measured this round (it has no transaction_interval).
			points := b.pointsFor(sweptSides[len(sweptSides)-1])
			done := map[string]map[sweepPoint]bool{}
			for _, p := range points {
				for _, s := range sweptSides {
					q := p
					if s != sideRelayEOS {
						q.Interval = 0
					}
					if done[s][q] {
						continue
					}
					if done[s] == nil {
						done[s] = map[sweepPoint]bool{}
					}
					done[s][q] = true
					add(b.steady(ctx, s, &q))
					if ctx.Err() != nil {
						return ctx.Err()
					}
				}
			}
		}
		for _, s := range rest {
			add(b.steady(ctx, s, nil))
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	return nil
}

// curvePoint is one setting of one side over the rounds: medians and ranges.
type curvePoint struct {
	side     string
	point    *sweepPoint // nil: the side's own settings
	label    string
	isDef    bool
	p99      spread // ms
	broker   spread // µs per event
	sideCPU  spread // µs per event
	rounds   int
	failures int
}

// curves groups the steady results by side and setting, in the order of the sides, then by linger.
func (r *Report) curves() []curvePoint {
	type key struct {
		side  string
		point sweepPoint
		swept bool
	}
	byKey := map[key][]SteadyResult{}
	var keys []key
	for _, s := range r.Steady {
		k := key{side: s.Side}
		if s.Point != nil {
			k.point, k.swept = *s.Point, true
		}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], s)
	}
	order := func(side string) int {
		if i := slices.Index(allSteadySides, side); i >= 0 {
			return i
		}
		return len(allSteadySides)
	}
	slices.SortStableFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(order(a.side), order(b.side)), cmp.Compare(a.point.Linger, b.point.Linger), cmp.Compare(a.point.Interval, b.point.Interval))
	})
	var out []curvePoint
	for _, k := range keys {
		c := curvePoint{side: k.side, label: label(k.side), isDef: true}
		if k.swept {
			p := k.point
			c.point, c.label, c.isDef = &p, p.label(k.side, r.relayDefaults()), r.relayDefaults().isDefault(k.side, p)
		}
		var p99, broker, cpu []float64
		for _, s := range byKey[k] {
			if s.Err != nil {
				c.failures++
				continue
			}
			w := float64(max(s.Written, 1))
			p99 = append(p99, msf(s.P99))
			broker = append(broker, float64(s.BrokerCPU.Microseconds())/w)
			cpu = append(cpu, float64(s.CPU.Microseconds())/w)
		}
		c.rounds = len(p99)
		c.p99, _ = spreadOf(p99)
		c.broker, _ = spreadOf(broker)
		c.sideCPU, _ = spreadOf(cpu)
		out = append(out, c)
	}
	return out
}

// sweepTable renders the curves: per side and setting, the medians (ranges) over the rounds.
func (r *Report) sweepTable(b *strings.Builder) {
	if len(r.Config.Sweep) == 0 {
		return
	}
	fmt.Fprintf(b, "\nSweep: the steady state (%d events/s, %s a round) at each setting, medians (range) over the rounds; the default settings are marked.\n\n",
		r.Config.Rate, r.Config.SteadyFor)
	b.WriteString("| side | setting | p99 ms | broker CPU µs/event | side's CPU µs/event | rounds |\n|---|---|---:|---:|---:|---:|\n")
	for _, c := range r.curves() {
		setting := c.label
		if c.point == nil {
			setting = "its own"
		}
		name := label(c.side)
		if c.rounds == 0 {
			fmt.Fprintf(b, "| %s | %s | failed ||| 0 of %d |\n", name, setting, c.failures)
			continue
		}
		rounds := fmt.Sprintf("%d", c.rounds)
		if c.failures > 0 {
			rounds = fmt.Sprintf("%d of %d", c.rounds, c.rounds+c.failures)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s |\n", name, setting, c.p99.format("%.1f"), c.broker.format("%.1f"), c.sideCPU.format("%.1f"), rounds)
	}
}
