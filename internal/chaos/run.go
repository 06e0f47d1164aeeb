// Package chaos is the nemesis: it runs PostgreSQL (a primary and a streaming standby), Kafka,
// several relay processes per mode with leader election, writers and consumers, and applies faults
// drawn from a seed (kill -9, SIGSTOP, SIGTERM, network cuts, broker stops and freezes,
// PostgreSQL restarts and failovers, big transactions, schema changes, a neighbour relay sharing
// the positions topic) for a duration, overlapping. It records what happened (package history),
// checks it (package check) and draws it (package report). The schedule is drawn whole from a
// seed before the first fault (plan.go) and saved with the history: the seed draws it again,
// and Options.Plan runs a saved one again.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/check"
	"github.com/outbox-relay/outbox-relay/internal/chaos/cluster"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/report"
	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
)

// Options configure a run. Zero values get the defaults in the comments.
type Options struct {
	Seed     uint64
	Duration time.Duration // of the faults; the drain at the end comes on top
	Modes    []Mode        // every mode when empty; they run side by side on the same servers
	Dir      string        // logs, histories and reports (required)
	RelayBin string        // the outbox-relay binary (required)
	// PGVersion of the cluster: "18" by default; failovers need 17 or later.
	PGVersion string
	Relays    int // relay processes per mode; 3
	// Brokers is how many Kafka brokers run: 1 or 3 (replication factor 3, min.insync.replicas
	// 2); 1. The kinds that need three (broker-kill, leader-change, coordinator-move,
	// isr-shrink) are not drawn with one.
	Brokers int
	Writers int           // writers per mode; 3
	Rate    float64       // transactions per second per writer; 10
	Kinds   []string      // fault kinds to draw from; all (FaultKinds)
	Mean    time.Duration // mean time between fault starts; 4s
	// Drain bounds the wait at the end for the consumers to read everything: 30m. They are waited
	// for as long as they read something new within DrainStall (2m): a source that is still
	// working through a backlog (a poller after big transactions) is given the time it needs,
	// one that stopped delivering is not.
	Drain, DrainStall time.Duration
	// Short makes faults cheaper (small big transactions), for the short schedules of make test.
	Short bool
	// Plan, when set, is the schedule to run (from an earlier run's history: --replay) instead
	// of one drawn from Seed; its options replace the ones above, but for Modes, which may name
	// fewer modes than the plan (their faults and the cluster's are applied, at their times).
	Plan *history.Plan
	Log  func(format string, args ...any)
}

// Result is what a run found, per mode.
type Result struct {
	Modes []ModeResult
	// Command is the make chaos command line that runs the same schedule again: the seed and
	// every option that shapes the schedule or the load.
	Command string
	// Planned counts the faults the schedule planned, by kind: a short run's plan deals what it
	// has time for, so a kind it never planned is no fault that did nothing.
	Planned map[string]int
}

// ModeResult is one mode's outcome.
type ModeResult struct {
	Mode       string
	History    string // path of history.json
	Report     string // path of report.html
	Violations []check.Violation
	Crashes    []string // relays that panicked or died of a fatal runtime error
	Summary    check.Summary
	Text       string // check.Format of the violations, "" when none
	// Unmet lists what the schedule had to carry out in this mode and did not (check.Unmet): a
	// run that did not exercise the leader's faults or a failover fails, whatever else it found.
	Unmet []string
	// Replay is the command that runs this mode's schedule again from its history.
	Replay string
}

// Failed reports whether any mode broke a rule.
func (r *Result) Failed() bool {
	for _, m := range r.Modes {
		if len(m.Violations) > 0 || len(m.Crashes) > 0 || len(m.Unmet) > 0 {
			return true
		}
	}
	return false
}

// runner is one run's state.
type runner struct {
	opts    Options
	start   time.Time
	cluster *cluster.Cluster
	modes   []*modeRun
	standby bool
	plan    *history.Plan // the schedule: drawn from the seed, or replayed
	http    *http.Client

	lease           time.Duration
	shutdownTimeout time.Duration
	stopSlack       time.Duration

	faultsFrom, faultsTo time.Time // the fault period (history.History.FaultsFrom)

	mu     sync.Mutex
	faults []history.Fault // cluster faults, copied into every mode's history
	notes  []history.Note
	// unhealed lists the faults whose heal failed (a broker that did not start again): what
	// followed ran without a server the schedule meant to be there, so the run was not carried
	// out as drawn, whatever its rules say.
	unhealed []string
}

// modeRun is one mode's relays, writers, consumers and history.
type modeRun struct {
	mode   Mode
	db     string // database name
	dsn    string
	table  string
	slot   string
	types  []string
	topics []string // the mode's event topics, its neighbour's included
	relays []*relay

	writers   *workload.Writers
	consumers []*workload.Consumer
	seed      uint64 // the writers'

	neighbour *neighbour

	mu     sync.Mutex
	faults []history.Fault
	stops  []history.Stop
	rs     []history.RelaySample
	slots  []history.SlotSample
	led    *relay // the last relay seen leading
	// crashes are relay processes that ended with a panic or a fatal runtime error.
	crashes []string
}

// neighbour is a second relay on a database and slot of its own, sharing the positions topic
// (exactly-once modes): started by a fault, it runs to the end of the run.
type neighbour struct {
	db, dsn, slot string
	types         []string
	relay         *relay
	writers       *workload.Writers
}

func (m *modeRun) leader() *relay {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.led
}

func (r *runner) modeOf(rl *relay) *modeRun {
	for _, m := range r.modes {
		for _, x := range m.allRelays() {
			if x == rl {
				return m
			}
		}
	}
	return nil
}

func (r *runner) logf(format string, args ...any) {
	off := time.Since(r.start).Seconds()
	r.opts.Log("[%7.1fs] %s", off, fmt.Sprintf(format, args...))
}

// note records something the harness saw, in every mode's history.
func (r *runner) note(format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	r.logf("note: %s", text)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, history.Note{At: time.Now(), Text: text})
}

// crash records a relay's crash: noted, and counted against the mode.
func (r *runner) crash(m *modeRun, format string, args ...any) {
	r.note("CRASH: "+format, args...)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.crashes = append(m.crashes, fmt.Sprintf(format, args...))
}

func (r *runner) recordFault(m *modeRun, f history.Fault) {
	if m == nil {
		r.mu.Lock()
		r.faults = append(r.faults, f)
		r.mu.Unlock()
		return
	}
	m.mu.Lock()
	m.faults = append(m.faults, f)
	m.mu.Unlock()
}

func (r *runner) recordStop(m *modeRun, s history.Stop) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stops = append(m.stops, s)
}

// Run runs the nemesis and checks each mode's history. It returns an error only when the run
// could not be carried out; broken rules are in the result.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Dir == "" || o.RelayBin == "" {
		return nil, errors.New("chaos: Dir and RelayBin are required")
	}
	if o.Plan != nil {
		var err error
		if o, err = replayOptions(o); err != nil {
			return nil, err
		}
	}
	if len(o.Modes) == 0 {
		o.Modes = append([]Mode(nil), modes...)
	}
	if o.PGVersion == "" {
		o.PGVersion = "18"
	}
	o.Relays = orDefault(o.Relays, 3)
	o.Writers = orDefault(o.Writers, 3)
	if o.Rate == 0 {
		o.Rate = 10
	}
	if len(o.Kinds) == 0 {
		o.Kinds = FaultKinds()
	}
	o.Mean = orDefault(o.Mean, 4*time.Second)
	o.Drain = orDefault(o.Drain, 30*time.Minute)
	o.DrainStall = orDefault(o.DrainStall, 2*time.Minute)
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	o.Brokers = orDefault(o.Brokers, 1)
	if kept := brokerKinds(o.Kinds, o.Brokers); len(kept) < len(o.Kinds) {
		o.Log("chaos: with %d broker the kinds %s are not drawn: they need three", o.Brokers, strings.Join(threeBrokerKinds, ", "))
		o.Kinds = kept
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	r := &runner{
		opts: o, start: time.Now(), http: &http.Client{Timeout: time.Second},
		// leader_check_timeout 2s: a lease of 1s + 2 x 2s + 2s.
		lease: 7 * time.Second, shutdownTimeout: 10 * time.Second, stopSlack: 5 * time.Second,
	}
	r.logf("chaos: seed %d, modes %s, %s of faults (%s), servers PostgreSQL %s and %d Kafka brokers", o.Seed, modeNames(o.Modes), o.Duration, strings.Join(o.Kinds, " "), o.PGVersion, o.Brokers)
	// Failover slots, and so the failover faults, need PostgreSQL 17 or later.
	major, err := strconv.Atoi(o.PGVersion)
	if err != nil {
		return nil, fmt.Errorf("chaos: PostgreSQL version %q: want a major version such as 18", o.PGVersion)
	}
	r.standby = withStandby(o, major)
	r.plan = o.Plan
	if r.plan == nil {
		r.plan = &history.Plan{Options: planOptions(o), Faults: drawPlan(o, r.standby, r.lease)}
	}
	r.logf("chaos: %d faults planned; the same schedule again: %s", len(r.plan.Faults), r.plan.Options.Command())

	var clients []string
	for _, m := range o.Modes {
		for i := 1; i <= o.Relays; i++ {
			clients = append(clients, relayName(m, i))
		}
		if m.Delivery == history.ExactlyOnce {
			clients = append(clients, m.Name+"-nb")
		}
	}
	c, err := cluster.Start(ctx, cluster.Options{
		Dir: filepath.Join(o.Dir, "servers"), PGVersion: o.PGVersion, Standby: r.standby, Clients: clients, Brokers: o.Brokers,
		Log: func(format string, args ...any) { r.logf("cluster: "+format, args...) },
	})
	if err != nil {
		return nil, fmt.Errorf("chaos: start the servers: %w", err)
	}
	r.cluster = c
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, m := range r.modes {
			for _, rl := range m.allRelays() {
				if rl.Running() {
					_ = rl.kill(cctx)
				}
			}
		}
		if err := c.Close(cctx); err != nil {
			r.logf("chaos: close the servers: %v", err)
		}
	}()

	for _, m := range o.Modes {
		mr, err := r.setUp(ctx, m, modeSeed(o.Seed, m.Name))
		if err != nil {
			return nil, err
		}
		r.modes = append(r.modes, mr)
	}

	// Sample the relays and the slots until the very end.
	sctx, cancelSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() { defer sampling.Done(); r.sample(sctx) }()
	stopSampling := sync.OnceFunc(func() { cancelSampling(); sampling.Wait() })
	defer stopSampling()
	finished := false
	defer func() {
		if !finished { // an error or an interruption: writers and consumers end with the run
			r.abandon()
		}
	}()

	// Writers start once each slot exists: rows committed before it are not the relay's to publish.
	for _, m := range r.modes {
		if !m.mode.Poll {
			if err := r.waitSlot(ctx, m.db, m.slot, 90*time.Second); err != nil {
				return nil, err
			}
		}
		m.writers = workload.StartWriters(ctx, r.writerConfig(m.mode, m.dsn, m.types, m.seed))
	}
	if err := r.waitLeaders(ctx, 90*time.Second); err != nil {
		r.note("%v", err)
	}
	r.faultsFrom = time.Now()
	nctx, stopFaults := context.WithTimeout(ctx, o.Duration)
	n := &nemesis{run: r, plan: r.plan.Faults, busy: make(map[string]bool)}
	progress := r.progress(nctx)
	n.loop(nctx)
	stopFaults()
	r.faultsTo = time.Now()
	<-progress
	if ctx.Err() != nil {
		return nil, fmt.Errorf("chaos: interrupted: %w", ctx.Err())
	}

	r.logf("chaos: faults over; every relay running again, writers stopping, consumers draining")
	res := r.finish(ctx)
	finished = true
	stopSampling()
	return r.check(res)
}

// planOptions are the options of o a plan records.
func planOptions(o Options) history.PlanOptions {
	var names []string
	for _, m := range o.Modes {
		names = append(names, m.Name)
	}
	return history.PlanOptions{
		Seed: o.Seed, Duration: o.Duration, Modes: names, Kinds: o.Kinds, PGVersion: o.PGVersion,
		Relays: o.Relays, Writers: o.Writers, Rate: o.Rate, Mean: o.Mean, Short: o.Short, Brokers: o.Brokers,
	}
}

// replayOptions takes the options of o.Plan into o, keeping o.Modes if set (a replay of some of
// the plan's modes).
func replayOptions(o Options) (Options, error) {
	po := o.Plan.Options
	planned, err := ParseModes(strings.Join(po.Modes, ","))
	if err != nil {
		return o, fmt.Errorf("chaos: the plan to replay: %w", err)
	}
	for _, m := range o.Modes {
		if !slices.ContainsFunc(planned, func(p Mode) bool { return p.Name == m.Name }) {
			return o, fmt.Errorf("chaos: mode %s is not in the plan to replay (its modes: %s); name some of those, or none", m.Name, strings.Join(po.Modes, ","))
		}
	}
	if len(o.Modes) == 0 {
		o.Modes = planned
	}
	o.Seed, o.Duration, o.Kinds, o.PGVersion = po.Seed, po.Duration, po.Kinds, po.PGVersion
	o.Relays, o.Writers, o.Rate, o.Mean, o.Short = po.Relays, po.Writers, po.Rate, po.Mean, po.Short
	o.Brokers = po.Brokers
	return o, nil
}

// ReplayCommand returns the make chaos command line that runs one mode's schedule again from its
// history, with the options the history's plan records.
func ReplayCommand(historyPath, mode string) string {
	return fmt.Sprintf("make chaos REPLAY=%s MODE=%s", historyPath, mode)
}

// required is what the schedule must carry out in m (history.Required): the leader killed and
// paused past its lease (any relay where nobody leads), leadership passed on, a failover;
// each when its kind is drawn from.
func (r *runner) required(m Mode) []string {
	var req []string
	kill, pause := slices.Contains(r.opts.Kinds, kindKill9), slices.Contains(r.opts.Kinds, kindPause)
	switch {
	case m.Poll:
		if kill {
			req = append(req, history.RequireRelayKill)
		}
		if pause {
			req = append(req, history.RequireRelayZombie)
		}
	default:
		if kill {
			req = append(req, history.RequireLeaderKill)
		}
		if pause {
			req = append(req, history.RequireLeaderZombie)
		}
		if kill || pause {
			req = append(req, history.RequireLeaderChange)
		}
	}
	if r.standby && containsAny(r.opts.Kinds, kindFailoverSync, kindFailoverLag) {
		req = append(req, history.RequireFailover)
	}
	return req
}

// abandon stops the writers and consumers of a run that ends early.
func (r *runner) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range r.modes {
		for _, w := range []*workload.Writers{m.writers, m.neighbourWriters()} {
			if w != nil {
				_ = w.Stop(ctx)
			}
		}
		for _, c := range m.consumers {
			c.Stop()
		}
	}
}

func (m *modeRun) neighbourWriters() *workload.Writers {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.neighbour == nil {
		return nil
	}
	return m.neighbour.writers
}

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

func modeNames(ms []Mode) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.Name)
	}
	return strings.Join(s, ",")
}

// withStandby reports whether the run's cluster has a standby: failover kinds drawn from,
// PostgreSQL 17 or later, and a mode that streams the WAL. A replay decides by the modes of the
// run it replays, not those it runs again: a poller's run had the standby (its batches waited
// for it, failovers hit it) when WAL modes ran beside it.
func withStandby(o Options, major int) bool {
	ms := o.Modes
	if o.Plan != nil {
		if planned, err := ParseModes(strings.Join(o.Plan.Options.Modes, ",")); err == nil {
			ms = planned
		}
	}
	return anyWAL(ms) && major >= 17 && containsAny(o.Kinds, kindFailoverSync, kindFailoverLag)
}

func anyWAL(ms []Mode) bool {
	for _, m := range ms {
		if !m.Poll {
			return true
		}
	}
	return false
}

func containsAny(list []string, want ...string) bool {
	for _, l := range list {
		for _, w := range want {
			if l == w {
				return true
			}
		}
	}
	return false
}

func relayName(m Mode, i int) string { return fmt.Sprintf("%s-r%d", m.Name, i) }

func (m *modeRun) allRelays() []*relay {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := append([]*relay(nil), m.relays...)
	if m.neighbour != nil && m.neighbour.relay != nil {
		out = append(out, m.neighbour.relay)
	}
	return out
}

// setUp creates a mode's database, topics, relays, consumers and writers.
func (r *runner) setUp(ctx context.Context, m Mode, seed uint64) (*modeRun, error) {
	mr := &modeRun{mode: m, db: "chaos_" + m.id(), table: "public.outbox_events", slot: "chaos_" + m.id(),
		types: []string{m.id() + "_a", m.id() + "_b"}}
	dir := filepath.Join(r.opts.Dir, m.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	dsn, err := r.prepareDatabase(ctx, m, mr.db)
	if err != nil {
		return nil, err
	}
	mr.dsn = dsn
	topics := topicsOf(mr.types)
	if m.Delivery == history.ExactlyOnce {
		nb := &neighbour{db: mr.db + "_nb", slot: mr.slot + "_nb", types: []string{m.id() + "_nb"}}
		if nb.dsn, err = r.prepareDatabase(ctx, m, nb.db); err != nil {
			return nil, err
		}
		mr.neighbour = nb
		topics = append(topics, topicsOf(nb.types)...)
	}
	mr.topics = topics
	if err := workload.CreateTopics(ctx, r.cluster.Brokers(), topics, 3); err != nil {
		return nil, fmt.Errorf("chaos: topics of %s: %w", m.Name, err)
	}
	for i := 1; i <= r.opts.Relays; i++ {
		name := relayName(m, i)
		rl, err := newRelay(name, r.opts.RelayBin, r.relayArgs(m, mr.slot), r.relayEnv(m, name, mr.db), filepath.Join(dir, fmt.Sprintf("r%d.log", i)))
		if err != nil {
			return nil, err
		}
		if err := rl.start(); err != nil {
			return nil, err
		}
		mr.relays = append(mr.relays, rl)
	}
	for _, iso := range []string{history.ReadCommitted, history.ReadUncommitted} {
		mr.consumers = append(mr.consumers, workload.StartConsumer(ctx, m.Name+"/"+iso, r.cluster.Brokers(), iso, topics))
	}
	mr.seed = seed
	r.logf("chaos: mode %s: database %s, slot %s, %d relays, topics %s", m.Name, mr.db, mr.slot, len(mr.relays), strings.Join(topics, " "))
	return mr, nil
}

func topicsOf(types []string) []string {
	out := make([]string, len(types))
	for i, t := range types {
		out[i] = "outbox.event." + t
	}
	return out
}

func (r *runner) writerConfig(m Mode, dsn string, types []string, seed uint64) workload.Config {
	return workload.Config{
		DSN: dsn, Table: "public.outbox_events", Shape: m.Shape, MessagesPrefix: "outbox", Types: types,
		Writers: r.opts.Writers, Aggregates: 8, MaxPerTx: 4, TxPerSecond: r.opts.Rate,
		RollbackEvery: 15, AbortEvery: 20, Seed: seed,
		Log: func(format string, args ...any) { r.logf(m.Name+" writers: "+format, args...) },
	}
}

// prepareDatabase creates a database and what the mode needs in it: the writers' tables and the
// relay's migrations, applied with the relay's own migrate command.
func (r *runner) prepareDatabase(ctx context.Context, m Mode, name string) (string, error) {
	dsn, err := r.cluster.CreateDatabase(ctx, name)
	if err != nil {
		return "", fmt.Errorf("chaos: database %s: %w", name, err)
	}
	args := []string{"migrate"}
	switch {
	case m.Poll:
		args = append(args, "--source=poll")
	case m.Shape == workload.Messages:
		args = append(args, "--outbox-shape=messages")
	}
	args = append(args, "--slot=chaos_"+strings.TrimPrefix(name, "chaos_"), "--publication=chaos_"+strings.TrimPrefix(name, "chaos_"))
	env := []string{"OUTBOX_PG_DSN=" + dsn, "OUTBOX_KAFKA_BROKERS=" + r.cluster.Brokers()}
	if err := runCommand(ctx, r.opts.RelayBin, args, env); err != nil {
		return "", fmt.Errorf("chaos: migrate %s: %w", name, err)
	}
	if err := workload.Prepare(ctx, dsn, m.Shape, "public.outbox_events"); err != nil {
		return "", fmt.Errorf("chaos: prepare %s: %w", name, err)
	}
	if m.Shape == workload.PartitionedTable {
		// The partitioned table replaced the migration's and left its publication; migrate makes
		// a new one, published via the partition root.
		pub := "chaos_" + strings.TrimPrefix(name, "chaos_")
		if err := r.cluster.Exec(ctx, name, fmt.Sprintf("DROP PUBLICATION IF EXISTS %q", pub)); err != nil {
			return "", fmt.Errorf("chaos: prepare %s: %w", name, err)
		}
		if err := runCommand(ctx, r.opts.RelayBin, args, env); err != nil {
			return "", fmt.Errorf("chaos: migrate %s again: %w", name, err)
		}
	}
	return dsn, nil
}

// The relays' settings that the checker's bounds are made of (history.Settings).
const (
	leaderRetry        = time.Second
	leaderKafkaTimeout = 15 * time.Second
	kafkaWriteTimeout  = 5 * time.Second
	statusInterval     = 500 * time.Millisecond
)

// liveSlack is history.Settings.LiveSlack: 30 s for the short schedules of make test, which run
// beside other test packages (a short run at a load of 50-100 saw takeovers chained over three
// leader faults keep events 45 s), none for make chaos.
func liveSlack(short bool) time.Duration {
	if short {
		return 30 * time.Second
	}
	return 0
}

// maxInFlightEvents is max_in_flight_events: auto, as docs/configuration.md documents it per delivery.
func maxInFlightEvents(delivery string) int {
	if delivery == history.ExactlyOnce {
		return 40000
	}
	return 10000
}

func (r *runner) relayArgs(m Mode, slot string) []string {
	args := []string{
		"--slot=" + slot, "--publication=" + slot,
		"--shutdown-timeout=" + r.shutdownTimeout.String(),
		"--leader-check-timeout=2s", "--leader-retry-interval=" + leaderRetry.String(),
		"--leader-kafka-timeout=" + leaderKafkaTimeout.String(),
		"--status-interval=" + statusInterval.String(), "--max-in-flight-bytes=4194304",
		"--kafka.write-timeout=" + kafkaWriteTimeout.String(),
		"--log-level=info",
	}
	switch {
	case m.Poll:
		args = append(args, "--source=poll", "--leader-election=false")
	default:
		args = append(args, "--leader-election=true")
		if r.standby {
			args = append(args, "--failover=true")
		}
	}
	if m.Shape == workload.Messages {
		args = append(args, "--outbox-shape=messages", "--messages-prefix=outbox")
	}
	if m.Delivery == history.ExactlyOnce {
		args = append(args, "--delivery=exactly-once")
	}
	if r.recovers(m) {
		args = append(args, "--on-slot-lost=recover", "--slot-recovery-margin="+recoveryMargin.String())
	}
	return args
}

// recoveryMargin is slot_recovery_margin for the relays that recover and for the prune fault
// alike: a recovery compares how far pruning deleted with its own margin, so a prune run with a
// smaller one stops it (the run of seed 39061: prune at 2 s, relays at the default hour, every
// recovery after the first prune refused). A minute is longer than the longest transaction the
// writers run (a big transaction of 100,000 events), so it is honest for the created_at rule too,
// and still lets a prune in a run of minutes delete rows.
const recoveryMargin = time.Minute

// recovers reports whether m's relays run with on_slot_lost: recover: when the slot-lost fault is
// drawn from and m can recover (Mode.Recover). The horizon recorded in the slot ledger bounds the
// gap (the xmin rule): no slot_recovery_margin, and no track_commit_timestamp, are needed.
func (r *runner) recovers(m Mode) bool { return recovers(m, r.opts.Kinds) }

func recovers(m Mode, kinds []string) bool {
	return m.Recover && (slices.Contains(kinds, kindSlotLost) || slices.Contains(kinds, kindSlotInvalidated))
}

// relayEnv gives a relay its own network path; with a leader election, the lock's session
// (leader_dsn) takes a path of its own too, which the cut-leader-lock fault cuts alone.
func (r *runner) relayEnv(m Mode, client, db string) []string {
	env := []string{"OUTBOX_PG_DSN=" + r.cluster.ClientDSN(client, db), "OUTBOX_KAFKA_BROKERS=" + r.cluster.ClientBrokers(client)}
	if !m.Poll {
		env = append(env, "OUTBOX_LEADER_DSN="+r.cluster.ClientLeaderDSN(client, db))
	}
	return env
}

// startNeighbour starts the second relay of an exactly-once mode and its writer.
func (r *runner) startNeighbour(ctx context.Context, m *modeRun) error {
	nb := m.neighbour
	name := m.mode.Name + "-nb"
	rl, err := newRelay(name, r.opts.RelayBin, r.relayArgs(m.mode, nb.slot), r.relayEnv(m.mode, name, nb.db), filepath.Join(r.opts.Dir, m.mode.Name, "nb.log"))
	if err != nil {
		return err
	}
	if err := rl.start(); err != nil {
		return err
	}
	if err := r.waitSlot(ctx, nb.db, nb.slot, 90*time.Second); err != nil {
		return err
	}
	cfg := r.writerConfig(m.mode, nb.dsn, nb.types, uint64(len(nb.db)))
	cfg.Name, cfg.Writers, cfg.TxPerSecond = "nb", 1, r.opts.Rate
	w := workload.StartWriters(context.WithoutCancel(ctx), cfg)
	m.mu.Lock()
	nb.relay, nb.writers = rl, w
	m.mu.Unlock()
	return nil
}

// waitSlot waits until the relays have created their slot.
func (r *runner) waitSlot(ctx context.Context, db, slot string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		confirmed, _, err := r.cluster.SlotSample(qctx, db, slot)
		cancel()
		// A slot being created is listed before it has a position: its creation may still fail
		// (a PostgreSQL fault) and be made again at a later point, and what was committed before
		// that point is not the relay's to publish. Only a confirmed position makes it the start.
		if err == nil && confirmed > 0 {
			return nil
		}
		if err == nil {
			err = errors.New("still being created")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: slot %s of %s not created within %s: %w", slot, db, limit, err)
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// waitLeaders waits until every WAL mode has a leader.
func (r *runner) waitLeaders(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		missing := []string{}
		for _, m := range r.modes {
			if !m.mode.Poll && m.leader() == nil {
				missing = append(missing, m.mode.Name)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no leader after %s in %s", limit, strings.Join(missing, ", "))
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// sample scrapes every relay's leader gauge and RSS every 250 ms and every slot every 500 ms, and
// restarts relays that ended of their own accord (as an orchestrator would), noting why.
func (r *runner) sample(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Modes side by side: one mode's slow scrape (a loaded or paused relay) must not stretch
		// another's sampling interval, which the two-leaders rule's tolerance follows.
		var wg sync.WaitGroup
		for _, m := range r.modes {
			wg.Go(func() { r.sampleMode(ctx, m, i%2 == 0) })
		}
		wg.Wait()
	}
}

func (r *runner) sampleMode(ctx context.Context, m *modeRun, slots bool) {
	var wg sync.WaitGroup
	samples := make([]history.RelaySample, len(m.relays))
	for i, rl := range m.relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := history.RelaySample{At: time.Now(), Relay: rl.name, RSS: rl.rss()}
			if rl.Running() && !rl.paused() {
				s.Up, s.Leader = rl.scrape(ctx, r.http)
			}
			if m.mode.Poll {
				s.Leader = false // pollers share the table: no leadership
			}
			samples[i] = s
		}()
	}
	wg.Wait()
	var slot *history.SlotSample
	if slots && !m.mode.Poll {
		qctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
		confirmed, end, err := r.cluster.SlotSample(qctx, m.db, m.slot)
		cancel()
		if err == nil && confirmed > 0 {
			slot = &history.SlotSample{At: time.Now(), Slot: m.slot, ConfirmedLSN: confirmed, WALEnd: end, LagBytes: int64(end) - int64(confirmed)}
		}
	}
	m.mu.Lock()
	m.rs = append(m.rs, samples...)
	if slot != nil {
		m.slots = append(m.slots, *slot)
	}
	for i, s := range samples {
		if s.Leader {
			m.led = m.relays[i]
		}
	}
	m.mu.Unlock()
	for _, rl := range m.allRelays() {
		if n := rl.takeOwnExits(); n > 0 {
			if ex := rl.lastExit(); ex.Crash != "" {
				// A panic or a fatal runtime error is a bug whatever else happened.
				r.crash(m, "relay %s crashed (%s): %s", rl.name, exitText(rl), ex.Crash)
			} else {
				r.note("relay %s exited of its own accord (%s); started again: %s", rl.name, exitText(rl), ex.LastError)
			}
			if ctx.Err() == nil {
				_ = rl.start()
			}
		}
	}
}

func exitText(rl *relay) string {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return fmt.Sprintf("exit %d", rl.code)
}

// progress prints a line per mode every 10 s until ctx ends.
func (r *runner) progress(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, m := range r.modes {
				c, rb, d := m.writers.Counts()
				var got []string
				for _, cs := range m.consumers {
					got = append(got, fmt.Sprint(cs.Delivered()))
				}
				leader := "-"
				if l := m.leader(); l != nil {
					leader = l.name
				}
				r.logf("%s: txns committed %d, rolled back %d, in doubt %d; delivered %s; leader %s", m.mode.Name, c, rb, d, strings.Join(got, "/"), leader)
			}
		}
	}()
	return done
}

// finish ends the run: every relay running, writers stopped and resolved, consumers drained,
// relays stopped with SIGTERM (timed).
func (r *runner) finish(ctx context.Context) []*modeTail {
	var tails []*modeTail
	for _, m := range r.modes {
		for _, rl := range m.allRelays() {
			if !rl.Running() {
				if err := rl.start(); err != nil {
					r.note("restart %s at the end: %v", rl.name, err)
				}
			}
		}
	}
	var wg sync.WaitGroup
	for _, m := range r.modes {
		t := &modeTail{m: m}
		tails = append(tails, t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.finish(ctx, r)
		}()
	}
	wg.Wait()
	r.endOffsets(ctx, tails)
	return tails
}

// positionsTopic is the relays' positions_topic (its default), which every exactly-once relay of
// the run shares.
const positionsTopic = "__outbox_relay_positions"

// settleLimit bounds the wait for open Kafka transactions to end once every relay has stopped:
// the relays' transaction.timeout.ms (60 s), after which the coordinator aborts a transaction
// whose producer is gone, and its sweep of timed-out transactions (every 10 s), with slack.
const settleLimit = 90 * time.Second

// endOffsets reads, once every mode's relays have stopped, every partition's last stable offset
// and high watermark (the positions topic's too, for exactly-once modes), waiting up to
// settleLimit for open transactions to end; a partition left with an open one is a hanging
// transaction, which the checker reports.
func (r *runner) endOffsets(ctx context.Context, tails []*modeTail) {
	topics := []string{positionsTopic}
	for _, t := range tails {
		topics = append(topics, t.m.topics...)
	}
	start := time.Now()
	offs, err := workload.SettledEndOffsets(ctx, r.cluster.Brokers(), topics, settleLimit)
	if err != nil {
		r.note("end offsets: %v", err)
	}
	r.logf("chaos: end offsets of %d partitions read in %s", len(offs), time.Since(start).Round(time.Millisecond))
	for _, t := range tails {
		mine := slices.Clone(t.m.topics)
		if t.m.mode.Delivery == history.ExactlyOnce {
			mine = append(mine, positionsTopic)
		}
		for _, o := range offs {
			if slices.Contains(mine, o.Topic) {
				t.endOffsets = append(t.endOffsets, o)
			}
		}
	}
}

// modeTail is what a mode ends with.
type modeTail struct {
	m     *modeRun
	txns  []history.Txn
	reads []history.Read
	end   time.Time
	// unsettled: why the writers' transactions could not be settled (history.Unsettled).
	unsettled string
	// endOffsets are the mode's partitions' offsets once every relay stopped.
	endOffsets []history.EndOffset
}

func (t *modeTail) finish(ctx context.Context, r *runner) {
	m := t.m
	stopWriters := func(w *workload.Writers, slot string) []history.Txn {
		if w == nil {
			return nil
		}
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := w.Stop(sctx); err != nil {
			r.note("%s: stop writers: %v", m.mode.Name, err)
		}
		// Resolve against the final primary; retried, since it may be restarting.
		for attempt := 0; ; attempt++ {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			txns, err := w.Resolve(rctx)
			cancel()
			if err == nil {
				for i := range txns {
					txns[i].Slot = slot
				}
				return txns
			}
			if attempt == 5 {
				// Without the settlement no outcome can be trusted: the run was not carried out
				// (check reports it as such, not as a reader of events nobody wrote).
				t.unsettled = strings.TrimPrefix(t.unsettled+"; ", "; ") + fmt.Sprintf(
					"settling the transactions of the writers on slot %s by their marker rows on the final primary failed 6 times, the last: %v", slot, err)
				r.note("%s: resolve transactions: %v", m.mode.Name, err)
				return w.Unresolved()
			}
			sleep(ctx, 2*time.Second)
		}
	}
	t.txns = stopWriters(m.writers, m.slot)
	m.mu.Lock()
	nb := m.neighbour
	m.mu.Unlock()
	if nb != nil {
		t.txns = append(t.txns, stopWriters(nb.writers, nb.slot)...)
	}
	want := make(map[string]bool)
	for _, tx := range t.txns {
		if tx.Outcome == history.Committed {
			for _, e := range tx.Events {
				want[e.ID] = true
			}
		}
	}
	dctx, cancel := context.WithTimeout(ctx, r.opts.Drain)
	drained := time.Now()
	var unread bool
	for _, c := range m.consumers {
		if err := c.Drain(dctx, want, 2*time.Second, r.opts.DrainStall); err != nil {
			unread = true
			r.note("%s: %v", m.mode.Name, err)
		}
	}
	cancel()
	r.logf("%s: drained in %s", m.mode.Name, time.Since(drained).Round(time.Second))
	if m.mode.Poll && unread {
		// Whether what was not read is still pending (the pollers had not reached it) or was
		// marked processed (lost): the table knows.
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		pending, rows, err := r.cluster.Pending(pctx, m.db, m.table)
		cancel()
		if err != nil {
			r.note("%s: %v", m.mode.Name, err)
		} else {
			r.note("%s: %d of the table's %d rows still pending at the end of the drain", m.mode.Name, pending, rows)
		}
	}
	// A quiet moment for duplicates that are still on their way, then the timed stops.
	sleep(ctx, 2*time.Second)
	var wg sync.WaitGroup
	for _, rl := range m.allRelays() {
		if !rl.Running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			signalled, exited, code, err := rl.terminate(context.Background(), r.shutdownTimeout+r.stopSlack+15*time.Second)
			if err != nil {
				r.note("%s: stop %s: %v", m.mode.Name, rl.name, err)
				return
			}
			r.recordStop(m, history.Stop{Relay: rl.name, Signal: signalled, Exited: exited, Code: code})
		}()
	}
	wg.Wait()
	// What a relay sent while it stopped (a duplicate, say) is read too.
	sleep(ctx, 3*time.Second)
	for _, c := range m.consumers {
		t.reads = append(t.reads, c.Stop()...)
	}
	t.end = time.Now()
}

// check assembles each mode's history, checks it, draws it and saves both.
func (r *runner) check(tails []*modeTail) (*Result, error) {
	res := &Result{}
	for _, t := range tails {
		m := t.m
		h := &history.History{
			Seed: r.opts.Seed, Mode: m.mode.Name, Start: r.start, End: t.end,
			Settings: history.Settings{
				Delivery: m.mode.Delivery, ShutdownTimeout: r.shutdownTimeout, StopSlack: r.stopSlack,
				RSSBound: 22<<20 + 20*(4<<20), ReplayWindow: 45 * time.Second, Lease: r.lease, ZombieGrace: 5 * time.Second,
				LeaderRetry: leaderRetry, LeaderKafkaTimeout: leaderKafkaTimeout, KafkaWriteTimeout: kafkaWriteTimeout,
				StatusInterval: statusInterval, MaxInFlightEvents: maxInFlightEvents(m.mode.Delivery),
				LiveSlack: liveSlack(r.opts.Short),
			},
			Txns: t.txns, Reads: t.reads, Plan: r.plan, Required: r.required(m.mode),
			FaultsFrom: r.faultsFrom, FaultsTo: r.faultsTo, Unsettled: t.unsettled, EndOffsets: t.endOffsets,
		}
		for _, c := range m.consumers {
			h.Consumers = append(h.Consumers, history.Consumer{Name: c.Name(), Isolation: c.Isolation()})
		}
		r.mu.Lock()
		h.Faults = append(append([]history.Fault(nil), r.faults...), m.faults...)
		h.Notes = append([]history.Note(nil), r.notes...)
		r.mu.Unlock()
		m.mu.Lock()
		h.Relays, h.Slots, h.Stops = m.rs, m.slots, m.stops
		m.mu.Unlock()
		for _, rl := range m.allRelays() {
			h.Exits = append(h.Exits, rl.takeExits()...)
		}
		sort.Slice(h.Faults, func(i, j int) bool { return h.Faults[i].Start.Before(h.Faults[j].Start) })

		dir := filepath.Join(r.opts.Dir, m.mode.Name)
		mres := ModeResult{Mode: m.mode.Name, History: filepath.Join(dir, "history.json"), Report: filepath.Join(dir, "report.html")}
		mres.Violations = check.Check(h)
		m.mu.Lock()
		mres.Crashes = append([]string(nil), m.crashes...)
		m.mu.Unlock()
		mres.Summary = check.Summarize(h)
		mres.Unmet = check.Unmet(h)
		r.mu.Lock()
		for _, u := range r.unhealed {
			mres.Unmet = append(mres.Unmet, "every fault healed: "+u)
		}
		r.mu.Unlock()
		mres.Replay = ReplayCommand(mres.History, m.mode.Name)
		if len(mres.Violations) > 0 {
			mres.Text = check.Format(h, mres.Violations, 20)
		}
		if err := h.Save(mres.History); err != nil {
			return nil, err
		}
		var marks []report.Mark
		for _, v := range mres.Violations {
			marks = append(marks, report.Mark{At: v.At, Label: v.Rule + ": " + v.Message})
		}
		if err := report.WriteFile(mres.Report, h, marks, mres.Summary.String()+"\n"+mres.Text); err != nil {
			return nil, err
		}
		r.logf("%s: %s", m.mode.Name, mres.Summary.String())
		if mres.Text != "" {
			r.logf("%s: VIOLATIONS\n%s", m.mode.Name, mres.Text)
		}
		for _, u := range mres.Unmet {
			r.logf("%s: REQUIREMENT NOT MET: %s", m.mode.Name, u)
		}
		r.logf("%s: replay this mode: %s", m.mode.Name, mres.Replay)
		r.logf("%s: report %s", m.mode.Name, mres.Report)
		res.Modes = append(res.Modes, mres)
	}
	res.Command = r.plan.Options.Command()
	res.Planned = make(map[string]int)
	for _, f := range r.plan.Faults {
		res.Planned[f.Kind]++
	}
	return res, nil
}
