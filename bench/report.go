package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Report is everything one run measured.
type Report struct {
	Config       Config
	LoadBefore   string // /proc/loadavg when the run started and ended: other work on the machine
	LoadAfter    string
	BacklogWrite time.Duration
	BacklogWAL   int64 // WAL bytes the table backlog wrote
	PayloadBytes int64
	AvgPayload   float64
	Drains       []Result
	Shards       []ShardResult // the shards measurement, every N and round
	Steady       []SteadyResult
	BigTx        *Result
	Profile      *Profile
	Messages     *MessagesResult // the table-free outbox, when measured
	Charts       []string        // the chart files (charts.go)
	ChartErr     error
	Notes        []string // what a side had to change to run (e.g. a configuration Connect refused)
	defaults     relayDefaults
}

// relayDefaults is the relay's kafka.linger and transaction_interval defaults (what a sweep marks).
func (r *Report) relayDefaults() relayDefaults {
	if r.defaults.lingerFlag == "" {
		r.defaults, _ = defaultsOfTheRelay() // checked when the run's configuration was
	}
	return r.defaults
}

// atDefault says whether s ran at the relay's default settings (or at the side's own): the rows
// the headline tables, ratios and targets use when a sweep measured others too.
func (r *Report) atDefault(s *SteadyResult) bool {
	return s.Point == nil || r.relayDefaults().isDefault(s.Side, *s.Point)
}

var sideLabels = map[string]string{
	sideCeiling:      "ceiling (pg_recvlogical)",
	sideRelay:        "outbox-relay",
	sideRelayStandby: "outbox-relay, decoding on a hot standby",
	sideRelayEOS:     "outbox-relay, exactly-once",
	sideRelayAvro:    "outbox-relay, Avro through a schema registry",
	sideDbzDefault:   "Debezium 3.6.1, defaults",
	sideDbzTuned:     "Debezium 3.6.1, tuned",
	sideDbzEOS:       "Debezium 3.6.1, tuned, Connect exactly-once (KIP-618)",
	sidePoll:         "outbox-relay, source poll",
	sidePollStandby:  "outbox-relay, source poll, synchronized_standby_slots",
	sideRecover:      "outbox-relay, lost-slot recovery from the table",
	sideMsgCeiling:   "ceiling (pg_recvlogical, messages)",
	sideMsgRelay:     "outbox-relay, messages",
}

func label(side string) string {
	if l, ok := sideLabels[side]; ok {
		return l
	}
	return side
}

// drain is side's drain: the round with the median rate when it drained more than once.
func (r *Report) drain(side string) *Result { return drains(r.Drains).median(side) }

// drains are a run's drain results, every round's.
type drains []Result

// in returns side's successful drain of round, if any.
func (ds drains) in(side string, round int) *Result {
	for i := range ds {
		if ds[i].Side == side && ds[i].Round == round && ds[i].Err == nil {
			return &ds[i]
		}
	}
	return nil
}

// median returns side's successful drain with the median rate (the lower one of the two middle
// ones for an even count).
func (ds drains) median(side string) *Result {
	var ok []*Result
	for i := range ds {
		if ds[i].Side == side && ds[i].Err == nil {
			ok = append(ok, &ds[i])
		}
	}
	if len(ok) == 0 {
		return nil
	}
	slices.SortStableFunc(ok, func(a, b *Result) int { return cmp.Compare(a.rate(), b.rate()) })
	return ok[(len(ok)-1)/2]
}

// ratios returns, round by round, what of returns for side's drain against base's drain of the
// same round (rounds where either failed are left out).
func (ds drains) ratios(side, base string, of func(d, base *Result) float64) []float64 {
	var out []float64
	for round := 0; ; round++ {
		if !slices.ContainsFunc(ds, func(d Result) bool { return d.Round == round }) {
			return out
		}
		if d, b := ds.in(side, round), ds.in(base, round); d != nil && b != nil {
			out = append(out, of(d, b))
		}
	}
}

// rateRatio is side's rate over base's.
func rateRatio(d, base *Result) float64 { return d.rate() / base.rate() }

// spread is the median, smallest and largest of values; ok is false when there are none.
type spread struct {
	median, min, max float64
	n                int
}

func spreadOf(values []float64) (spread, bool) {
	if len(values) == 0 {
		return spread{}, false
	}
	v := slices.Clone(values)
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread{median: m, min: v[0], max: v[len(v)-1], n: len(v)}, true
}

// format renders the median with, when there were several values, their range.
func (s spread) format(verb string) string {
	if s.n <= 1 {
		return fmt.Sprintf(verb, s.median)
	}
	return fmt.Sprintf(verb+" ("+verb+"-"+verb+")", s.median, s.min, s.max)
}

// steady is side's steady state: the round with the median p99 when it ran more than once.
func (r *Report) steady(side string) *SteadyResult {
	var ok []*SteadyResult
	for i := range r.Steady {
		if r.Steady[i].Side == side && r.Steady[i].Err == nil && r.atDefault(&r.Steady[i]) {
			ok = append(ok, &r.Steady[i])
		}
	}
	if len(ok) == 0 {
		return nil
	}
	slices.SortStableFunc(ok, func(a, b *SteadyResult) int { return cmp.Compare(a.P99, b.P99) })
	return ok[(len(ok)-1)/2]
}

// steadyIn returns side's successful steady state of round, if any.
func (r *Report) steadyIn(side string, round int) *SteadyResult {
	for i := range r.Steady {
		if s := &r.Steady[i]; s.Side == side && s.Round == round && s.Err == nil && r.atDefault(s) {
			return s
		}
	}
	return nil
}

// steadyRatios returns, round by round, what of returns for side's steady state against base's of
// the same round.
func (r *Report) steadyRatios(side, base string, of func(s, base *SteadyResult) float64) []float64 {
	var out []float64
	for round := range max(r.Config.Rounds, 1) {
		if s, b := r.steadyIn(side, round), r.steadyIn(base, round); s != nil && b != nil {
			out = append(out, of(s, b))
		}
	}
	return out
}

// steadyP99s are side's steady-state p99 latencies in ms, round by round.
func (r *Report) steadyP99s(side string) []float64 {
	var out []float64
	for _, s := range r.Steady {
		if s.Side == side && s.Err == nil && r.atDefault(&s) {
			out = append(out, msf(s.P99))
		}
	}
	return out
}

// Table renders the results as Markdown tables, ready for docs/benchmarks.md.
func (r *Report) Table() string {
	var b strings.Builder
	if r.LoadBefore != "" {
		fmt.Fprintf(&b, "Load average (1, 5, 15 min) at the start: %s; at the end: %s.\n", r.LoadBefore, r.LoadAfter)
	}
	if len(r.Config.RelayArgs) > 0 {
		fmt.Fprintf(&b, "Relay flags beyond the defaults: %s.\n", strings.Join(r.Config.RelayArgs, " "))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "Note: %s\n", n)
	}
	fmt.Fprintf(&b, "Backlog: %d events, %.0f-byte payloads on average (%.1f MB), %d aggregates of %d types, transactions of 1-%d events, %d partitions per topic; written in %s.\n\n",
		r.Config.Events, r.AvgPayload, float64(r.PayloadBytes)/1e6, 1000, len(aggregateTypes), maxTxEvents, r.Config.Partitions,
		r.BacklogWrite.Round(100*time.Millisecond))
	ds := drains(r.Drains)
	b.WriteString("| side | events/s | MB/s | vs ceiling | vs outbox-relay | wall s | first record s | all on Kafka s | events/s after first record | CPU s | CPU µs/event | CPU µs/event after first record | peak RSS MB | walsender CPU s | broker CPU s | broker CPU µs/event |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, d := range r.Drains {
		if d.Err != nil {
			fmt.Fprintf(&b, "| %s | failed: %s |||||||||||||||\n", label(d.Side), oneLine(d.Err))
			continue
		}
		name := label(d.Side) + r.roundLabel(d)
		if d.Partial {
			name += fmt.Sprintf(" (stopped after %.0f s with %d of %d events)", d.Wall.Seconds(), d.Events, d.Target)
		}
		ceiling, relay := r.drain(sideCeiling), r.drain(sideRelay)
		if interleaved(d.Side) {
			// Against the same round's: those ran next to it.
			ceiling, relay = ds.in(sideCeiling, d.Round), ds.in(sideRelay, d.Round)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.1f | %s | %s | %.2f | %s | %s | %s | %.2f | %.1f | %s | %.0f | %.2f | %.2f | %.1f |\n",
			name, d.rate(), float64(d.Bytes)/1e6/d.Wall.Seconds(), ratio(d, ceiling, "%.2f"), ratio(d, relay, "%.2f"),
			d.Wall.Seconds(), secondsOrDash(d.First), secondsOrDash(d.OnKafka), rateOrDash(d.streamRate()), d.CPU.Seconds(),
			float64(d.CPU.Microseconds())/float64(d.Events), microsOrDash(d.cpuPerEventAfterFirst()), mb(d.PeakRSS), d.SenderCPU.Seconds(), d.BrokerCPU.Seconds(),
			float64(d.BrokerCPU.Microseconds())/float64(max(d.Events, 1)))
	}
	r.standbyTable(&b)
	r.shardsTable(&b)
	r.roundsTable(&b)
	if len(r.Steady) > 0 {
		fmt.Fprintf(&b, "\nSteady state: %d events/s for %s, latency from just before the writer sends the commit to the consumer receiving the record.\n\n",
			r.Config.Rate, r.Config.SteadyFor)
		b.WriteString("| side | events | achieved events/s | p50 ms | p95 ms | p99 ms | max ms | CPU s | CPU µs/event | CPU % of a core | peak RSS MB | broker CPU s | broker CPU µs/event |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range r.Steady {
			if s.Err != nil {
				fmt.Fprintf(&b, "| %s | failed: %s ||||||||||||\n", label(s.Side), oneLine(s.Err))
				continue
			}
			name := label(s.Side)
			if s.Point != nil {
				name += ", " + s.Point.label(s.Side, r.relayDefaults())
			}
			if r.Config.Rounds > 1 && interleavedSteady(s.Side) {
				name += fmt.Sprintf(" (round %d)", s.Round+1)
			}
			if s.Rate < 0.95*float64(r.Config.Rate) {
				name += " (the writer fell behind: lower offered load)"
			}
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.0f | %.0f | %.2f | %.1f |\n",
				name, s.Written, s.Rate, msf(s.P50), msf(s.P95), msf(s.P99), msf(s.Max), s.CPU.Seconds(),
				float64(s.CPU.Microseconds())/float64(max(s.Written, 1)), 100*s.CPU.Seconds()/s.Window.Seconds(), mb(s.PeakRSS), s.BrokerCPU.Seconds(),
				float64(s.BrokerCPU.Microseconds())/float64(max(s.Written, 1)))
		}
	}
	if t := r.BigTx; t != nil {
		fmt.Fprintf(&b, "\nLarge transaction: one transaction of %d events.\n\n", t.Events)
		b.WriteString("| side | events/s | MB/s | wall s | first record s | CPU s | peak RSS MB | walsender CPU s | broker CPU s |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		if t.Err != nil {
			fmt.Fprintf(&b, "| outbox-relay | failed: %s ||||||||\n", oneLine(t.Err))
		} else {
			fmt.Fprintf(&b, "| outbox-relay | %.0f | %.1f | %.2f | %s | %.2f | %.0f | %.2f | %.2f |\n",
				t.rate(), float64(t.Bytes)/1e6/t.Wall.Seconds(), t.Wall.Seconds(), secondsOrDash(t.First), t.CPU.Seconds(), mb(t.PeakRSS), t.SenderCPU.Seconds(), t.BrokerCPU.Seconds())
		}
	}
	r.sweepTable(&b)
	r.messagesTable(&b)
	r.targetsTable(&b)
	if p := r.Profile; p != nil {
		if p.Err != nil {
			fmt.Fprintf(&b, "\nProfiled in-process relay: failed: %s\n", oneLine(p.Err))
		} else {
			fmt.Fprintf(&b, "\nProfiled in-process relay: %s\n", p.line())
		}
	}
	if len(r.Charts) > 0 {
		fmt.Fprintf(&b, "\nCharts: %s\n", strings.Join(r.Charts, ", "))
	}
	if r.ChartErr != nil {
		fmt.Fprintf(&b, "\nCharts: failed: %s\n", oneLine(r.ChartErr))
	}
	return b.String()
}

// roundLabel names the round of an interleaved side's row when there were several.
func (r *Report) roundLabel(d Result) string {
	if r.Config.Rounds <= 1 || !interleaved(d.Side) {
		return ""
	}
	return fmt.Sprintf(" (round %d)", d.Round+1)
}

// comparison is one ratio the rounds measure: side against base, round by round.
type comparison struct {
	name       string
	side, base string
	messages   bool // both sides are the message mode's drains
	of         func(d, base *Result) float64
}

var (
	relayVsCeiling     = comparison{name: "relay drain / ceiling (start-up included)", side: sideRelay, base: sideCeiling, of: rateRatio}
	exactlyOnceVsRelay = comparison{name: "exactly-once drain / at-least-once", side: sideRelayEOS, base: sideRelay, of: rateRatio}
	messagesVsCeiling  = comparison{name: "table-free drain / its ceiling", side: sideMsgRelay, base: sideMsgCeiling, messages: true, of: rateRatio}
	standbyVsPrimary   = comparison{name: "drain decoding on a hot standby / on the primary", side: sideRelayStandby, base: sideRelay, of: rateRatio}
	standbyPrimaryCPU  = comparison{name: "the primary's CPU per event, decoding on a hot standby / on the primary", side: sideRelayStandby, base: sideRelay,
		of: func(d, base *Result) float64 { return primaryPerEvent(d) / primaryPerEvent(base) }}
	comparisons = []comparison{
		relayVsCeiling,
		{name: "relay drain after its first record / ceiling", side: sideRelay, base: sideCeiling,
			of: func(d, base *Result) float64 { return d.streamRate() / base.rate() }},
		exactlyOnceVsRelay,
		avroVsRelay,
		{name: "exactly-once broker CPU per event / at-least-once", side: sideRelayEOS, base: sideRelay,
			of: func(d, base *Result) float64 { return brokerPerEvent(d) / brokerPerEvent(base) }},
		messagesVsCeiling,
		standbyVsPrimary,
		standbyPrimaryCPU,
	}
)

func brokerPerEvent(d *Result) float64 { return d.BrokerCPU.Seconds() / float64(max(d.Events, 1)) }

func primaryPerEvent(d *Result) float64 { return d.PrimaryCPU.Seconds() / float64(max(d.Events, 1)) }

// standbyTable sets the relay decoding on a hot standby beside the relay decoding on the primary,
// round by round: the drain, and what it cost the primary.
func (r *Report) standbyTable(b *strings.Builder) {
	if !slices.ContainsFunc(r.Drains, func(d Result) bool { return d.Side == sideRelayStandby }) {
		return
	}
	b.WriteString("\nDecoding on a hot standby (PostgreSQL 16+): the relay with its slot on a streaming standby of the bench's cluster (hot_standby_feedback on; pg_dsn the standby, primary_dsn the primary) against the relay on the primary, on the same backlog. " +
		"The primary's CPU is every process of the bench's cluster during the drain (walsenders, backends, background processes; on the primary side it includes the bench's own polls of the slot, one query every 25 ms); the decoding walsender's runs on the primary for the one and on the standby for the other; " +
		"the standby's CPU is every process of the standby during the drain (its walsender included). The standby had replayed the backlog before its drain started, and it replayed the backlog while it was written (on the same cores).\n\n")
	b.WriteString("| side | events/s | vs on the primary | primary CPU s | primary CPU µs/event | decoding walsender CPU µs/event | standby CPU s | relay CPU µs/event |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	ds := drains(r.Drains)
	for _, d := range r.Drains {
		if d.Side != sideRelay && d.Side != sideRelayStandby {
			continue
		}
		name := label(d.Side) + r.roundLabel(d)
		if d.Err != nil {
			fmt.Fprintf(b, "| %s | failed: %s |||||||\n", name, oneLine(d.Err))
			continue
		}
		standby := "-"
		if d.Side == sideRelayStandby {
			standby = fmt.Sprintf("%.2f", d.StandbyCPU.Seconds())
		}
		events := float64(max(d.Events, 1))
		fmt.Fprintf(b, "| %s | %.0f | %s | %.2f | %.1f | %.1f | %s | %.1f |\n", name, d.rate(), ratio(d, ds.in(sideRelay, d.Round), "%.2f"),
			d.PrimaryCPU.Seconds(), 1e6*d.PrimaryCPU.Seconds()/events, 1e6*d.SenderCPU.Seconds()/events, standby, 1e6*d.CPU.Seconds()/events)
	}
}

// ratioValues returns c's ratio round by round.
func (r *Report) ratioValues(c comparison) []float64 {
	ds := drains(r.Drains)
	if c.messages {
		if r.Messages == nil {
			return nil
		}
		ds = r.Messages.Drains
	}
	return ds.ratios(c.side, c.base, c.of)
}

// ratioMedian is c's median over the rounds, "n/a" when it was not measured.
func (r *Report) ratioMedian(c comparison) string {
	if sp, ok := spreadOf(r.ratioValues(c)); ok {
		return fmt.Sprintf("%.2f", sp.median)
	}
	return "n/a"
}

// firstRecords are side's times to its first record on Kafka, round by round, in seconds.
func (r *Report) firstRecords(side string) []float64 {
	var v []float64
	for _, d := range r.Drains {
		if d.Side == side && d.Err == nil && d.First > 0 {
			v = append(v, d.First.Seconds())
		}
	}
	return v
}

// roundsTable renders the ratios of the interleaved rounds: median, range, and each round's.
func (r *Report) roundsTable(b *strings.Builder) {
	if r.Config.Rounds <= 1 {
		return
	}
	fmt.Fprintf(b, "\nInterleaved drains: each ratio round by round (the sides of a round ran one after the other, the rounds in turn), median (range) over %d rounds.\n\n", r.Config.Rounds)
	b.WriteString("| ratio | median (range) | per round |\n|---|---:|---|\n")
	row := func(name string, sp spread, values []float64, verb string) {
		var per []string
		for _, v := range values {
			per = append(per, fmt.Sprintf(verb, v))
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", name, sp.format(verb), strings.Join(per, ", "))
	}
	for _, c := range comparisons {
		values := r.ratioValues(c)
		if sp, ok := spreadOf(values); ok {
			row(c.name, sp, values, "%.2f")
		}
	}
	for _, side := range []string{sideRelay, sideRelayEOS} {
		values := r.firstRecords(side)
		if sp, ok := spreadOf(values); ok {
			row(label(side)+": first record on Kafka, s", sp, values, "%.2f")
		}
	}
	for _, m := range append(r.steadyMetrics(), r.brokerByRound()...) {
		if sp, ok := spreadOf(m.values); ok {
			row(m.name, sp, m.values, m.verb)
		}
	}
}

// brokerByRound is the broker's CPU per event of the relay's rounds, in round order: a cost that
// drifts with the rounds (e.g. with what earlier sides left on the broker) shows here.
func (r *Report) brokerByRound() []metric {
	var drain, steady []float64
	for round := range max(r.Config.Rounds, 1) {
		if d := drains(r.Drains).in(sideRelay, round); d != nil {
			drain = append(drain, 1e6*brokerPerEvent(d))
		}
		if s := r.steadyIn(sideRelay, round); s != nil {
			steady = append(steady, 1e6*s.brokerPerEvent())
		}
	}
	return []metric{
		{"at-least-once drain: broker CPU µs per event, by round", drain, "%.1f"},
		{"steady: at-least-once broker CPU µs per event, by round", steady, "%.1f"},
	}
}

// metric is one measured quantity over the rounds.
type metric struct {
	name   string
	values []float64
	verb   string
}

// steadyMetrics are the steady state's compared quantities, round by round.
func (r *Report) steadyMetrics() []metric {
	broker := func(s, base *SteadyResult) float64 { return s.brokerPerEvent() / base.brokerPerEvent() }
	return []metric{
		{"steady: at-least-once broker CPU per event / tuned Debezium", r.steadyRatios(sideRelay, sideDbzTuned, broker), "%.2f"},
		{"steady: exactly-once broker CPU per event / at-least-once", r.steadyRatios(sideRelayEOS, sideRelay, broker), "%.2f"},
		{"steady: at-least-once p99, ms", r.steadyP99s(sideRelay), "%.1f"},
		{"steady: exactly-once p99, ms", r.steadyP99s(sideRelayEOS), "%.1f"},
		{"steady: exactly-once broker CPU per event / Debezium with Connect's exactly-once", r.steadyRatios(sideRelayEOS, sideDbzEOS, broker), "%.2f"},
		{"steady: Debezium with Connect's exactly-once p99, ms", r.steadyP99s(sideDbzEOS), "%.1f"},
	}
}

// exactlyOnceVsConnect is the relay's exactly-once drain (its median round) against Debezium's
// with Connect's exactly-once, which drains once.
func (r *Report) exactlyOnceVsConnect() []float64 {
	eos, dbz := r.drain(sideRelayEOS), r.drain(sideDbzEOS)
	if eos == nil || dbz == nil || dbz.rate() == 0 || dbz.Partial {
		return nil
	}
	return []float64{eos.rate() / dbz.rate()}
}

// target is one goal of the performance issue: a quantity's median against a bound.
type target struct {
	what   string
	values []float64
	bound  float64
	atMost bool // the median must be at most bound, else at least
	verb   string
	// missing says why the target could not be judged although its sides ran (e.g. no setting of
	// the sweep was fast enough); empty leaves the row out when values is.
	missing string
}

// atLatency compares side's broker CPU per event with peer's at the cheapest of side's settings
// whose p99 is at most fraction times peer's (medians over the rounds, from the sweep's points or,
// without a sweep, the default): what tells a latency trade from a cost. The quantity is side's
// broker CPU per event over peer's; the setting goes into the target's name.
func (r *Report) atLatency(side, peer string, fraction float64, what string) target {
	t := target{bound: 1, atMost: true, verb: "%.2f"}
	var base *curvePoint
	curves := r.curves()
	for i := range curves {
		if c := &curves[i]; c.side == peer && c.point == nil && c.rounds > 0 {
			base = c
		}
	}
	hasSide := slices.ContainsFunc(curves, func(c curvePoint) bool { return c.side == side && c.rounds > 0 })
	if base == nil || !hasSide || base.broker.median <= 0 {
		t.what = what
		return t
	}
	limit := fraction * base.p99.median
	var best *curvePoint
	for i := range curves {
		c := &curves[i]
		if c.side != side || c.rounds == 0 || c.p99.median > limit {
			continue
		}
		if best == nil || c.broker.median < best.broker.median {
			best = c
		}
	}
	if best == nil {
		t.what = fmt.Sprintf("%s (p99 <= %.0f ms)", what, limit)
		t.missing = fmt.Sprintf("no setting measured had p99 <= %.0f ms", limit)
		return t
	}
	t.what = fmt.Sprintf("%s (p99 <= %.0f ms: %s, p99 %.1f ms, against %.1f ms)", what, limit, best.label, best.p99.median, base.p99.median)
	t.values = []float64{best.broker.median / base.broker.median}
	return t
}

// cpuPerEvent is side's CPU µs per event in each of its drains.
func cpuPerEvent(ds []Result, side string) []float64 {
	var out []float64
	for _, d := range ds {
		if d.Side == side && d.Err == nil && d.Events > 0 {
			out = append(out, float64(d.CPU.Microseconds())/float64(d.Events))
		}
	}
	return out
}

// targetsTable renders the medians against the performance targets (docs/benchmarks.md).
func (r *Report) targetsTable(b *strings.Builder) {
	steady := r.steadyMetrics()
	var msgCPU []float64
	if r.Messages != nil {
		msgCPU = cpuPerEvent(r.Messages.Drains, sideMsgRelay)
	}
	targets := []target{
		{what: "table-free drain vs its ceiling (pg_recvlogical with messages)", values: r.ratioValues(messagesVsCeiling), bound: 0.85, verb: "%.2f"},
		{what: "table-free relay CPU per event in the drain, µs", values: msgCPU, bound: 3.5, atMost: true, verb: "%.1f"},
		{what: "exactly-once drain vs at-least-once", values: r.ratioValues(exactlyOnceVsRelay), bound: 0.92, verb: "%.2f"},
		{what: "Avro drain (schema registry) vs JSON drain", values: r.ratioValues(avroVsRelay), bound: 0.9, verb: "%.2f"},
		{what: "broker CPU per event, steady, at-least-once at its defaults vs tuned Debezium", values: steady[0].values, bound: 1.5, atMost: true, verb: "%.2f"},
		r.atLatency(sideRelay, sideDbzTuned, 0.2, "broker CPU per event, steady, at-least-once vs tuned Debezium at a fifth of its p99"),
		{what: "broker CPU per event, steady, exactly-once vs at-least-once (defaults)", values: steady[1].values, bound: 2, atMost: true, verb: "%.2f"},
		{what: "time to the first record on Kafka when a backlog waits, s", values: r.firstRecords(sideRelay), bound: 0.1, atMost: true, verb: "%.2f"},
		{what: "table drain vs ceiling, start-up included", values: r.ratioValues(relayVsCeiling), bound: 0.92, verb: "%.2f"},
		{what: "steady p99, at-least-once, ms", values: steady[2].values, bound: 30, atMost: true, verb: "%.1f"},
		{what: "steady p99, exactly-once (read_committed), ms", values: steady[3].values, bound: 40, atMost: true, verb: "%.1f"},
		{what: "exactly-once drain vs Debezium with Connect's exactly-once", values: r.exactlyOnceVsConnect(), bound: 5, verb: "%.1f"},
		r.atLatency(sideRelayEOS, sideDbzEOS, 1, "broker CPU per event, steady, exactly-once vs Debezium with Connect's exactly-once at equal or lower p99"),
	}
	b.WriteString("\nAgainst the targets (medians over the rounds):\n\n| what | median (range) | target | met |\n|---|---:|---:|---|\n")
	for _, t := range targets {
		bound := ">= " + fmt.Sprintf(t.verb, t.bound)
		if t.atMost {
			bound = "<= " + fmt.Sprintf(t.verb, t.bound)
		}
		sp, ok := spreadOf(t.values)
		if !ok {
			if t.missing != "" {
				fmt.Fprintf(b, "| %s | %s | %s | no |\n", t.what, t.missing, bound)
			}
			continue
		}
		met := sp.median >= t.bound
		if t.atMost {
			met = sp.median <= t.bound
		}
		yes := "no"
		if met {
			yes = "yes"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", t.what, sp.format(t.verb), bound, yes)
	}
}

// Summary is the last line: the headline numbers for scripts. Values that were not measured are
// n/a. Ratios of interleaved sides are the medians over the rounds.
func (r *Report) Summary() string {
	relay := r.drain(sideRelay)
	vsCeiling, vsDbz := "n/a", "n/a"
	vsCeiling = r.ratioMedian(relayVsCeiling)
	if d := r.drain(sideDbzTuned); relay != nil && d != nil {
		vsDbz = fmt.Sprintf("%.1f", relay.rate()/d.rate())
	}
	p99, rss, big := "n/a", "n/a", "n/a"
	if s := r.steady(sideRelay); s != nil {
		p99 = fmt.Sprintf("%.0f", msf(s.P99)) // the round with the median p99
		rss = fmt.Sprintf("%.0f", mb(s.PeakRSS))
	}
	if r.BigTx != nil && r.BigTx.Err == nil {
		big = fmt.Sprintf("%.0f", mb(r.BigTx.PeakRSS))
	}
	eosVsRelay, eosP99 := "n/a", "n/a"
	eosVsRelay = r.ratioMedian(exactlyOnceVsRelay)
	if s := r.steady(sideRelayEOS); s != nil {
		eosP99 = fmt.Sprintf("%.0f", msf(s.P99))
	}
	first := "n/a"
	if sp, ok := spreadOf(r.firstRecords(sideRelay)); ok {
		first = fmt.Sprintf("%.2f", sp.median)
	}
	return fmt.Sprintf("bench: relay_vs_ceiling=%s relay_vs_debezium=%s p99_ms=%s rss_mb=%s big_tx_rss_mb=%s exactly_once_vs_relay=%s exactly_once_p99_ms=%s first_record_s=%s %s standby_primary_cpu_x=%s %s",
		vsCeiling, vsDbz, p99, rss, big, eosVsRelay, eosP99, first, r.messagesSummary(), r.ratioMedian(standbyPrimaryCPU), r.shardsSummary())
}

// Failed lists the measurements that failed.
func (r *Report) Failed() []string {
	var out []string
	for _, d := range r.Drains {
		if d.Err != nil {
			out = append(out, label(d.Side)+": "+d.Err.Error())
		}
	}
	for _, s := range r.Steady {
		if s.Err != nil {
			out = append(out, "steady "+label(s.Side)+": "+s.Err.Error())
		}
	}
	if r.BigTx != nil && r.BigTx.Err != nil {
		out = append(out, "large transaction: "+r.BigTx.Err.Error())
	}
	for _, s := range r.Shards {
		if s.Err != nil {
			out = append(out, fmt.Sprintf("shards N=%d: %s", s.N, s.Err))
		}
	}
	if r.Profile != nil && r.Profile.Err != nil {
		out = append(out, "profile: "+r.Profile.Err.Error())
	}
	if r.ChartErr != nil {
		out = append(out, "charts: "+r.ChartErr.Error())
	}
	return append(out, r.messagesFailed()...)
}

func ratio(d Result, base *Result, format string) string {
	if base == nil || base.rate() == 0 {
		return "-"
	}
	return fmt.Sprintf(format, d.rate()/base.rate())
}

func secondsOrDash(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", d.Seconds())
}

func rateOrDash(r float64) string {
	if r <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", r)
}

func microsOrDash(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(d)/1e3)
}

func msf(d time.Duration) float64 { return float64(d) / 1e6 }

func oneLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return strings.ReplaceAll(s, "|", "/")
}
