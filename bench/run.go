package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// Sides of the drain comparison, in the order they run.
const (
	sideCeiling    = "ceiling"
	sideRelay      = "relay"
	sideRelayEOS   = "relay-exactly-once" // delivery: exactly-once
	sideDbzDefault = "debezium-default"
	sideDbzTuned   = "debezium-tuned"
	// sideDbzEOS is tuned Debezium on a distributed Connect worker with exactly-once source
	// support (KIP-618), the peer of the relay's exactly-once.
	sideDbzEOS = "debezium-exactly-once"
	// sidePoll is the relay with source poll: it reads the table, not a slot (bench/poll.go).
	sidePoll = "poll"
	// sidePollStandby is the poller with a physical standby of the bench's cluster listed in its
	// synchronized_standby_slots (PostgreSQL 17+): each claim waits for the standby (bench/standby.go).
	sidePollStandby = "poll-standby"
	// sideRecover is the relay recovering a lost slot (on_slot_lost: recover): the backlog is the
	// gap, read from the outbox table; its slot is missing where the ledger says it was created.
	sideRecover = "relay-recover"
)

var allDrainSides = []string{sideCeiling, sideRelay, sideRelayStandby, sideRelayEOS, sideRelayAvro, sideDbzDefault, sideDbzTuned, sideDbzEOS, sidePoll, sidePollStandby, sideRecover}
var allSteadySides = []string{sideRelay, sideRelayEOS, sideDbzTuned, sideDbzEOS, sidePoll, sidePollStandby}

// byDefault are the sides a run measures unless told which: all but poll-standby and
// relay-standby, which start a standby and need PostgreSQL 17 or later and 16 or later, where the
// bench's cluster is by default the PATH's.
func byDefault(sides []string) []string {
	return slices.DeleteFunc(slices.Clone(sides), func(s string) bool { return s == sidePollStandby || s == sideRelayStandby })
}

// isRelay says whether side runs the relay binary.
func isRelay(side string) bool {
	return side == sideRelay || side == sideRelayStandby || side == sideRelayEOS || side == sideRelayAvro || isPoll(side) || side == sideRecover
}

// isPoll says whether side runs the relay with source poll (no slot of its own).
func isPoll(side string) bool { return side == sidePoll || side == sidePollStandby }

// Config says what one benchmark run measures.
type Config struct {
	Events      int           // backlog size
	Partitions  int           // partitions of every topic
	Rate        int           // steady-state events per second
	SteadyFor   time.Duration // how long the steady-state writer runs
	BigTx       int           // events in the large transaction; 0 skips that run
	Sides       []string      // drain sides, a subset of allDrainSides
	Steady      []string      // steady-state sides, a subset of allSteadySides
	RelayBin    string        // the outbox-relay binary
	RelayArgs   []string      // extra flags for the relay, e.g. --kafka.linger=20ms, to try settings
	DebeziumLib string        // Kafka Connect + Debezium jars
	ProfileDir  string        // when set, an extra in-process relay drain writes pprof profiles here
	WorkDir     string        // logs and configuration of the sides; a temp dir when empty
	Log         io.Writer     // progress lines
	// DrainTimeout bounds each side's drain; 0 means scaled to Events (at least 2 minutes).
	DrainTimeout time.Duration
	// Messages measures the table-free outbox too: the same backlog written as logical decoding
	// messages (producer cost, WAL), drained by pg_recvlogical and the relay (messages.go).
	Messages bool
	// ProducerFor is how long each client-side producer run (outbox.Write, outbox.Emit) commits
	// one-event transactions; 0 skips them.
	ProducerFor time.Duration
	// Rounds is how many times the compared sides run, interleaved (A B A B ...), so that one noisy
	// minute cannot decide a ratio: the drains of the ceiling, the relay and the exactly-once relay
	// (each round on slots created before the backlog) and the message mode's two, then the steady
	// states of the relay in both modes and tuned Debezium (SteadyFor each). The report gives the
	// median and range of each ratio over the rounds. Debezium's drains, the poller and the
	// lost-slot recovery run once (their gaps to the relay are large). 0 means 1.
	Rounds int
	// Sweep measures the relay's steady state (both modes) at each of these kafka.linger /
	// transaction_interval settings, every round (sweep.go); the other steady sides run once per
	// round at their own settings. Empty: the relay's steady state at its settings alone.
	Sweep []sweepPoint
	// ChartDir receives the charts (sweep, drains, latency; SVG and PNG) and the report,
	// results.md; empty skips them.
	ChartDir string
	// Shards are the slot counts of the shards measurement (shards.go), e.g. 1, 2, 4; each N
	// drains a backlog of Events events with N relays on N slots, every round. Empty skips it.
	Shards []int
	// KeepTopics leaves every measurement's topics on the broker (topics.go); by default each is
	// deleted once measured, so no side meets the topics of the sides before it.
	KeepTopics bool
}

// interleavedSteady reports whether a steady-state side runs once per round: the relay in both
// delivery modes and tuned Debezium, whose broker cost and latency are compared; the pollers once.
func interleavedSteady(side string) bool { return !isPoll(side) }

// maxRounds keeps the slots of every round within the bench server's max_replication_slots.
const maxRounds = 10

// interleaved reports whether side drains once per round (Config.Rounds).
func interleaved(side string) bool {
	switch side {
	case sideCeiling, sideRelay, sideRelayStandby, sideRelayEOS, sideRelayAvro, sideMsgCeiling, sideMsgRelay:
		return true
	}
	return false
}

func (c *Config) validate() error {
	var errs []error
	if c.Events < 1 {
		errs = append(errs, fmt.Errorf("events must be positive, got %d", c.Events))
	}
	if c.Rounds < 0 || c.Rounds > maxRounds {
		errs = append(errs, fmt.Errorf("rounds must be between 0 and %d (each takes a replication slot per interleaved side), got %d", maxRounds, c.Rounds))
	}
	if c.Partitions < 1 {
		errs = append(errs, fmt.Errorf("partitions must be positive, got %d", c.Partitions))
	}
	for _, s := range c.Sides {
		if !slices.Contains(allDrainSides, s) {
			errs = append(errs, fmt.Errorf("unknown drain side %q (want some of %v)", s, allDrainSides))
		}
	}
	for _, s := range c.Steady {
		if !slices.Contains(allSteadySides, s) {
			errs = append(errs, fmt.Errorf("unknown steady-state side %q (want some of %v)", s, allSteadySides))
		}
	}
	if len(c.Steady) > 0 && (c.Rate < 1 || c.SteadyFor <= 0) {
		errs = append(errs, fmt.Errorf("steady state needs a positive rate and duration, got %d/s for %s", c.Rate, c.SteadyFor))
	}
	if len(c.Sweep) > 0 {
		if !slices.ContainsFunc(c.Steady, swept) {
			errs = append(errs, fmt.Errorf("a sweep needs %s or %s among the steady-state sides (BENCH_STEADY_SIDES), got %v", sideRelay, sideRelayEOS, c.Steady))
		}
		if d, err := defaultsOfTheRelay(); err != nil {
			errs = append(errs, err)
		} else if i := slices.IndexFunc(c.RelayArgs, func(a string) bool {
			return strings.HasPrefix(a, d.lingerFlag) || strings.HasPrefix(a, d.intervalFlag)
		}); i >= 0 {
			errs = append(errs, fmt.Errorf("relay flag %s would override the sweep's settings: drop it from BENCH_RELAY_ARGS, or list its value in BENCH_SWEEP", c.RelayArgs[i]))
		}
	}
	if c.RelayBin == "" && (slices.ContainsFunc(c.Sides, isRelay) || slices.ContainsFunc(c.Steady, isRelay) || c.BigTx > 0 || c.Messages || len(c.Shards) > 0) {
		errs = append(errs, errors.New("no relay binary given"))
	}
	if c.usesDebezium() {
		if err := debeziumLibReady(c.DebeziumLib); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Config) usesDebezium() bool {
	return slices.ContainsFunc(c.Sides, isDebezium) || slices.ContainsFunc(c.Steady, isDebezium)
}

func isDebezium(side string) bool { return strings.HasPrefix(side, "debezium") }

// bench is one run's state.
type bench struct {
	cfg      Config
	svc      *Services
	pool     *pgxpool.Pool
	kafka    *kafka.Client
	run      string // prefix of every slot and topic of this run, so runs never share them
	pub      string
	work     string
	payload  int64 // payload bytes in the backlog
	endLSN   uint64
	prefix   string // messages_prefix of the message backlog
	logw     io.Writer
	profile  *Profile      // the in-process profile runs, when ProfileDir is set
	notes    []string      // Report.Notes
	defaults relayDefaults // the relay's own kafka.linger and transaction_interval (a sweep's marks)
	// postmaster is the bench cluster's postmaster: the primary's CPU of a drain is its processes'.
	postmaster int
	// decoding is the hot standby side relay-standby decodes on; nil when the side is not run.
	decoding *decodingStandby
	// shardsReady are the Ns whose tables and publications exist (setupShards).
	shardsReady []int
	// round is the drain round being set up or measured (Config.Rounds): the first one's slots,
	// topics and logs carry the side's name alone, later ones a suffix.
	round int
}

// rounds is Config.Rounds, at least 1.
func (b *bench) rounds() int { return max(b.cfg.Rounds, 1) }

// roundSuffix tells apart the slots, topics and logs of the rounds after the first.
func (b *bench) roundSuffix(sep string) string {
	if b.round == 0 {
		return ""
	}
	return fmt.Sprintf("%sr%d", sep, b.round+1)
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.logw, "bench: "+format+"\n", args...)
}

func (b *bench) slot(side string) string {
	return b.run + "_" + strings.ReplaceAll(side, "-", "_") + b.roundSuffix("_")
}

// topics are <run>.<side>.<aggregate type>.
func (b *bench) topicPrefix(side string) string { return b.run + "." + side + b.roundSuffix("-") }

func (b *bench) topics(side string) []string {
	var out []string
	for _, t := range aggregateTypes {
		out = append(out, b.topicPrefix(side)+"."+t)
	}
	return out
}

func (b *bench) createTopics(ctx context.Context, side string) error {
	for _, t := range b.topics(side) {
		if err := b.svc.Kafka.CreateTopic(ctx, t, b.cfg.Partitions); err != nil {
			return err
		}
	}
	return nil
}

// Run measures every configured side against the same PostgreSQL, Kafka and backlog.
func Run(ctx context.Context, cfg Config, svc *Services) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	var err error
	var id [4]byte
	_, _ = rand.Read(id[:])
	b := &bench{cfg: cfg, svc: svc, run: "b" + hex.EncodeToString(id[:]), logw: cfg.Log,
		kafka: &kafka.Client{Addr: kafka.TCP(svc.Kafka.Brokers()), Timeout: 10 * time.Second}}
	if b.defaults, err = defaultsOfTheRelay(); err != nil {
		return nil, err
	}
	b.pub = b.run + "_pub"
	b.prefix = b.run + ".outbox"
	b.work = cfg.WorkDir
	if b.work == "" {
		dir, err := os.MkdirTemp("", "outbox-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		b.work = dir
	} else if err := os.MkdirAll(b.work, 0o755); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, svc.DSN)
	if err != nil {
		return nil, fmt.Errorf("connect to the bench database: %w", err)
	}
	defer pool.Close()
	b.pool = pool
	return b.measure(ctx)
}

func (b *bench) measure(ctx context.Context) (*Report, error) {
	rep := &Report{Config: b.cfg, LoadBefore: loadAverage(), defaults: b.defaults}
	defer func() { rep.LoadAfter, rep.Notes = loadAverage(), b.notes }()
	if err := errors.Join(b.checkStandbyVersion(ctx), b.checkDecodingStandbyVersion(ctx)); err != nil {
		return nil, err
	}
	var err error
	if b.postmaster, err = postmasterOf(ctx, b.pool); err != nil {
		return nil, err
	}
	if err := setupDatabase(ctx, b.svc.DSN, b.pub); err != nil {
		return nil, err
	}
	if b.cfg.decodesOnStandby() {
		// Before the slots and the backlog: the standby's slots must have all of it to decode.
		err := b.startDecodingStandby(ctx)
		defer func() { _ = b.stopDecodingStandby(ctx) }()
		if err != nil {
			return nil, err
		}
	}
	// One slot per side and round, all created before the backlog, so every side decodes identical
	// WAL.
	sides := slices.Clone(b.cfg.Sides)
	if b.cfg.ProfileDir != "" {
		sides = append(sides, "profile")
	}
	for round := range b.rounds() {
		b.round = round
		if err := b.prepareSides(ctx, sides); err != nil {
			return nil, err
		}
	}
	b.round = 0

	b.logf("writing a backlog of %d events in transactions of 1-%d", b.cfg.Events, maxTxEvents)
	startLSN, err := currentLSN(ctx, b.pool)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := writeBacklog(ctx, b.pool, b.cfg.Events, ""); err != nil {
		return nil, err
	}
	rep.BacklogWrite = time.Since(start)
	if b.endLSN, err = currentLSN(ctx, b.pool); err != nil {
		return nil, err
	}
	rep.BacklogWAL = int64(b.endLSN - startLSN)
	var avg float64
	if err := b.pool.QueryRow(ctx, "SELECT coalesce(sum(length(payload::text)), 0), coalesce(avg(length(payload::text)), 0) FROM public.outbox_events").
		Scan(&b.payload, &avg); err != nil {
		return nil, fmt.Errorf("measure the backlog: %w", err)
	}
	rep.PayloadBytes, rep.AvgPayload = b.payload, avg
	b.logf("backlog written in %s (%.0f events/s), %.0f-byte payloads on average", rep.BacklogWrite.Round(time.Millisecond),
		float64(b.cfg.Events)/rep.BacklogWrite.Seconds(), avg)

	// 200,000 records warm the broker's produce path; a small backlog (the smoke test) needs less.
	if err := b.warmBroker(ctx, min(200_000, max(20_000, 10*b.cfg.Events))); err != nil {
		return nil, err
	}
	if err := b.eachRound(ctx, b.cfg.Sides, interleaved, func(s string) {
		r := b.drain(ctx, s)
		r.Round = b.round
		rep.Drains = append(rep.Drains, r)
		b.logf("%s", r.line())
	}); err != nil {
		return rep, err
	}
	// The standby would replay, on this machine's cores, everything written from here on.
	if err := b.stopDecodingStandby(ctx); err != nil {
		return rep, err
	}
	// The profiled drain runs after every side has drained and dropped its slot... except its own:
	// the steady-state and large-transaction writes below would otherwise land in it.
	if b.cfg.ProfileDir != "" {
		rep.Profile = &Profile{Dir: b.cfg.ProfileDir}
		p, err := b.profileRelay(ctx, false)
		if p != nil {
			rep.Profile = p
		}
		if err != nil {
			rep.Profile.Err = err
			b.logf("profiled drain failed: %v", err)
		}
	}

	if err := b.measureShards(ctx, rep); err != nil {
		return rep, err
	}

	if b.cfg.Messages {
		rep.Messages = b.messages(ctx)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}

	if len(b.cfg.Steady) > 0 {
		// 20s is what the broker's compiler needed here; a short run (the smoke test) warms as
		// long as it measures.
		if err := b.warmSteady(ctx, min(20*time.Second, b.cfg.SteadyFor)); err != nil {
			return rep, err
		}
	}
	if err := b.steadyPhase(ctx, rep); err != nil {
		return rep, err
	}
	if b.cfg.ProfileDir != "" && rep.Profile.Err == nil && len(b.cfg.Steady) > 0 {
		if _, err := b.profileRelay(ctx, true); err != nil {
			rep.Profile.Err = err
			b.logf("profiled steady state failed: %v", err)
		}
		b.logf("profiled relay: %s", rep.Profile.line())
	}

	if b.cfg.BigTx > 0 {
		r := b.bigTx(ctx)
		rep.BigTx = &r
		b.logf("%s", r.line())
	}
	if b.cfg.ChartDir != "" {
		rep.Charts, rep.ChartErr = rep.writeCharts(b.cfg.ChartDir)
		if rep.ChartErr != nil {
			b.logf("charts failed: %v", rep.ChartErr)
		}
	}
	return rep, ctx.Err()
}

// eachRound runs every side once per round, in turn (A B A B ...), with b.round set; after the
// first round only the sides repeat names. It stops when ctx ends, and leaves b.round at 0.
func (b *bench) eachRound(ctx context.Context, sides []string, repeat func(string) bool, run func(side string)) error {
	defer func() { b.round = 0 }()
	for round := range b.rounds() {
		b.round = round
		for _, s := range sides {
			if round > 0 && !repeat(s) {
				continue
			}
			run(s)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	return nil
}

// prepareSides creates the slots (or the lost slot's record) of this round's sides.
func (b *bench) prepareSides(ctx context.Context, sides []string) error {
	for _, s := range sides {
		if b.round > 0 && !interleaved(s) {
			continue
		}
		if s == sideRecover {
			// The lost slot: recorded in the ledger, acknowledged up to now, and gone.
			if err := recordLostSlot(ctx, b.pool, b.slot(s)); err != nil {
				return err
			}
		} else if s == sideRelayStandby {
			if err := b.decoding.createSlot(ctx, b.pool, b.slot(s)); err != nil {
				return err
			}
		} else if !isPoll(s) {
			if err := createSlot(ctx, b.pool, b.slot(s)); err != nil {
				return err
			}
		}
		// The drains create their topics when they run (drainWith); the profiled drain's are
		// created with its slot.
		if s == "profile" {
			if err := b.createTopics(ctx, s); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bench) drainTimeout() time.Duration {
	if b.cfg.DrainTimeout > 0 {
		return b.cfg.DrainTimeout
	}
	// A side slower than 4,000 events/s (start-up included) gets a partial result, what it
	// published by then, rather than stretching the run past its time budget.
	return max(2*time.Minute, time.Duration(b.cfg.Events/4000)*time.Second)
}

// loadAverage is the first three fields of /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func (b *bench) logPath(name string) string {
	return filepath.Join(b.work, name+b.roundSuffix("-")+".log")
}

// stopDecodingStandby stops relay-standby's standby, once; the next call does nothing.
func (b *bench) stopDecodingStandby(ctx context.Context) error {
	d := b.decoding
	if d == nil {
		return nil
	}
	b.decoding = nil
	if err := d.close(context.WithoutCancel(ctx), b.pool); err != nil {
		return fmt.Errorf("%s: stop the standby: %w", sideRelayStandby, err)
	}
	return nil
}

// slotPool is where side's slot lives: the decoding standby for relay-standby, else the bench's
// cluster.
func (b *bench) slotPool(side string) *pgxpool.Pool {
	if side == sideRelayStandby && b.decoding != nil {
		return b.decoding.pool
	}
	return b.pool
}
