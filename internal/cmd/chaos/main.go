// Command chaos runs the nemesis (package internal/chaos) against real servers: `make chaos`.
//
//	SEED=42 DURATION=30m MODE=eo-table make chaos
//
// Settings come from flags or, as make passes them, from the environment: SEED (random when
// empty, printed on stderr before anything else), DURATION (of the faults; 5m), MODE (a
// comma-separated list of modes, or all), KINDS (fault kinds to draw from; all), PG_VERSION
// (18), RELAYS (per mode; 3), WRITERS (per mode; 3), RATE (transactions per second per writer;
// 10), MEAN (between fault starts; 4s), SHORT (1: the short run's cheaper faults), BROKERS (Kafka
// brokers: 1, or 3 with replication factor 3, min.insync.replicas 2 and the faults that need
// them; 1), CHAOS_DIR
// (where logs, histories and reports go), DRAIN (the longest wait at the end for every event to
// be read; 30m), REPLAY (an earlier run's <mode>/history.json: run its schedule again, with its
// options; MODE then picks some of its modes). It exits 1 when a rule was broken or the schedule
// missed what every run must carry out, 2 when the run could not be carried out, and leaves
// nothing running.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos"
	"github.com/outbox-relay/outbox-relay/internal/chaos/check"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/report"
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("chaos", flag.ExitOnError)
	seed := fs.String("seed", os.Getenv("SEED"), "the seed of the fault schedule (random when empty)")
	duration := fs.Duration("duration", envDuration("DURATION", 5*time.Minute), "how long faults are applied; the drain at the end comes on top")
	modeList := fs.String("mode", envOr("MODE", "all"), "modes, comma-separated: "+strings.Join(chaos.AllModes(), ", ")+", or all")
	kinds := fs.String("kinds", os.Getenv("KINDS"), "fault kinds to draw from, comma-separated (all when empty): "+strings.Join(chaos.FaultKinds(), ", "))
	pgVersion := fs.String("pg-version", envOr("PG_VERSION", "18"), "PostgreSQL major version (failovers need 17 or later)")
	dir := fs.String("dir", os.Getenv("CHAOS_DIR"), "where logs, histories and reports go (.local/chaos/<time>-<seed> when empty)")
	drain := fs.Duration("drain", envDuration("DRAIN", 30*time.Minute), "the longest the drain at the end may take; it gives up sooner once nothing new is read for 2 minutes")
	relays := fs.Int("relays", envInt("RELAYS", 3), "relay processes per mode")
	brokers := fs.Int("brokers", envInt("BROKERS", 1), "Kafka brokers: 1, or 3 (replication factor 3, min.insync.replicas 2; adds the kinds "+strings.Join(chaos.ThreeBrokerKinds(), ", ")+")")
	writers := fs.Int("writers", envInt("WRITERS", 3), "writers per mode")
	rate := fs.Float64("rate", envFloat("RATE", 10), "transactions per second per writer")
	mean := fs.Duration("mean", envDuration("MEAN", 4*time.Second), "the mean time between two fault starts")
	short := fs.Bool("short", os.Getenv("SHORT") == "1" || os.Getenv("SHORT") == "true", "the short run's cheaper faults (big transactions of 3,000 events)")
	replay := fs.String("replay", os.Getenv("REPLAY"), "an earlier run's <mode>/history.json: run its schedule again with its options (seed, duration, kinds, relays, writers, rate, mean, short, PostgreSQL version); -mode picks some of its modes")
	relayBin := fs.String("relay-bin", "", "the outbox-relay binary (built from ./cmd/outbox-relay when empty)")
	recheck := fs.String("recheck", "", "check the histories of an earlier run's directory again (and draw their reports anew) instead of running")
	_ = fs.Parse(os.Args[1:])
	if *recheck != "" {
		return recheckDir(*recheck)
	}

	var plan *history.Plan
	if *replay != "" {
		h, err := history.Load(*replay)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: REPLAY: %v\n", err)
			return 2
		}
		if h.Plan == nil {
			fmt.Fprintf(os.Stderr, "chaos: REPLAY: %s holds no plan (recorded before schedules were saved); run its seed again: SEED=%d\n", *replay, h.Seed)
			return 2
		}
		plan = h.Plan
		*seed = strconv.FormatUint(plan.Options.Seed, 10)
		if os.Getenv("MODE") == "" && !flagSet(fs, "mode") {
			*modeList = strings.Join(plan.Options.Modes, ",")
		}
	}
	s := rand.Uint64() % 1_000_000
	if *seed != "" {
		v, err := strconv.ParseUint(*seed, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: SEED %q is not a number\n", *seed)
			return 2
		}
		s = v
	}
	// First, on stderr: whatever cuts the run short (a timeout, an interrupt), the seed is out.
	if plan != nil {
		fmt.Fprintf(os.Stderr, "chaos: seed %d, replaying the schedule of %s (modes %s)\n", s, *replay, *modeList)
	} else {
		fmt.Fprintf(os.Stderr, "chaos: seed %d\n", s)
	}
	if *brokers != 1 && *brokers != 3 {
		fmt.Fprintf(os.Stderr, "chaos: BROKERS=%d: want 1 or 3\n", *brokers)
		return 2
	}
	ms, err := chaos.ParseModes(*modeList)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var kindList []string
	if *kinds != "" {
		known := map[string]bool{}
		for _, k := range chaos.FaultKinds() {
			known[k] = true
		}
		for _, k := range strings.Split(*kinds, ",") {
			if k = strings.TrimSpace(k); !known[k] {
				fmt.Fprintf(os.Stderr, "chaos: unknown fault kind %q (kinds: %s)\n", k, strings.Join(chaos.FaultKinds(), ", "))
				return 2
			}
			if *brokers < 3 && plan == nil && slices.Contains(chaos.ThreeBrokerKinds(), k) {
				fmt.Fprintf(os.Stderr, "chaos: fault kind %s needs three brokers: add BROKERS=3 (--brokers=3)\n", k)
				return 2
			}
			kindList = append(kindList, k)
		}
	}
	if *dir == "" {
		*dir = filepath.Join(".local", "chaos", fmt.Sprintf("%s-seed%d", time.Now().Format("20060102-150405"), s))
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *relayBin == "" {
		*relayBin = filepath.Join(*dir, "outbox-relay")
		build := exec.CommandContext(ctx, "go", "build", "-o", *relayBin, "./cmd/outbox-relay")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: build the relay: %v\n", err)
			return 2
		}
	}
	logf := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	logf("chaos: seed %d, modes %s; output in %s", s, *modeList, *dir)
	res, err := chaos.Run(ctx, chaos.Options{
		Seed: s, Duration: *duration, Modes: ms, Dir: *dir, RelayBin: *relayBin, PGVersion: *pgVersion,
		Relays: *relays, Brokers: *brokers, Writers: *writers, Rate: *rate, Mean: *mean, Short: *short, Kinds: kindList,
		Drain: *drain, Plan: plan, Log: logf,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, m := range res.Modes {
		status := "ok"
		if len(m.Violations) > 0 || len(m.Crashes) > 0 || len(m.Unmet) > 0 {
			status = fmt.Sprintf("%d violations, %d crashes, %d requirements not met", len(m.Violations), len(m.Crashes), len(m.Unmet))
		}
		logf("%-16s %s  report: %s", m.Mode, status, m.Report)
		for _, u := range m.Unmet {
			logf("%-16s requirement not met: %s", "", u)
		}
		logf("%-16s replay: %s", "", m.Replay)
	}
	logf("chaos: the same schedule again: %s", res.Command)
	if res.Failed() {
		logf("chaos: FAILED (seed %d)", s)
		return 1
	}
	logf("chaos: passed (seed %d)", s)
	return 0
}

// recheckDir checks every <mode>/history.json under dir with the current rules and writes each
// report anew: a checker change is tried on recorded runs without running them again.
func recheckDir(dir string) int {
	paths, _ := filepath.Glob(filepath.Join(dir, "*", "history.json"))
	if len(paths) == 0 {
		fmt.Fprintf(os.Stderr, "chaos: no */history.json under %s\n", dir)
		return 2
	}
	failed := false
	for _, p := range paths {
		h, err := history.Load(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		vs := check.Check(h)
		sum := check.Summarize(h)
		text := ""
		if len(vs) > 0 {
			failed = true
			text = check.Format(h, vs, 20)
		}
		for _, u := range check.Unmet(h) {
			failed = true
			text += "requirement not met: " + u + "\n"
		}
		var marks []report.Mark
		for _, v := range vs {
			marks = append(marks, report.Mark{At: v.At, Label: v.Rule + ": " + v.Message})
		}
		out := filepath.Join(filepath.Dir(p), "report.html")
		if err := report.WriteFile(out, h, marks, sum.String()+"\n"+text); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Printf("== %s\n%s\n%s", h.Mode, sum.String(), text)
		fmt.Printf("report: %s\n", out)
	}
	if failed {
		return 1
	}
	return 0
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
		fmt.Fprintf(os.Stderr, "chaos: %s=%q is not a positive whole number; using %d\n", name, v, def)
	}
	return def
}

func envFloat(name string, def float64) float64 {
	if v := os.Getenv(name); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 {
			return f
		}
		fmt.Fprintf(os.Stderr, "chaos: %s=%q is not a positive number; using %g\n", name, v, def)
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		fmt.Fprintf(os.Stderr, "chaos: %s=%q is not a duration (like 30m); using %s\n", name, v, def)
	}
	return def
}
