// Command bench measures outbox-relay side by side with the pg_recvlogical ceiling and with
// Debezium (Kafka Connect standalone, PostgreSQL connector and outbox event router), on one
// PostgreSQL, one Kafka and one backlog, in one run. `make bench` runs it; see docs/benchmarks.md.
//
// It prints Markdown tables and, as its last line, a summary for scripts:
//
//	bench: relay_vs_ceiling=<x.xx> relay_vs_debezium=<x.x> p99_ms=<n> rss_mb=<n> big_tx_rss_mb=<n> exactly_once_vs_relay=<x.xx> exactly_once_p99_ms=<n> first_record_s=<x.xx> msg_write_x=<x.x> msg_wal_x=<x.x> msg_relay_vs_ceiling=<x.xx> standby_primary_cpu_x=<x.xx> shards_drain_x=<x.xx> shards_walsender_cpu_x=<x.xx>
//
// With --charts (BENCH_CHARTS) it also writes the tables, headed by the run's commit, machine and
// settings, to results.md there, next to its charts (charts.go).
//
// Every knob has a BENCH_* environment variable and a flag (the flag wins).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	cfg, svcOpts, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.RelayBin == "" && needsRelay(cfg) {
		dir, err := os.MkdirTemp("", "outbox-bench-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if cfg.RelayBin, err = buildRelay(ctx, dir); err != nil {
			return err
		}
	}
	if cfg.usesDebezium() {
		if err := debeziumLibReady(cfg.DebeziumLib); err != nil {
			return err
		}
	}
	fmt.Fprintln(stderr, "bench: starting PostgreSQL and Kafka")
	svc, err := StartServices(ctx, svcOpts)
	if err != nil {
		return err
	}
	defer svc.Close()
	began := time.Now()
	rep, err := Run(ctx, cfg, svc)
	if rep == nil {
		return err
	}
	measured := time.Since(began)
	fmt.Fprintf(stderr, "bench: measured in %s\n", measured.Round(time.Second))
	failed := rep.Failed()
	for _, f := range failed {
		fmt.Fprintln(stderr, "bench: FAILED:", f)
	}
	mach := machine(ctx, svc)
	table, summary := rep.Table(), rep.Summary()
	fmt.Fprintln(stdout, mach)
	fmt.Fprint(stdout, "\n", table, "\n")
	fmt.Fprintln(stdout, summary)
	if cfg.ChartDir != "" {
		info := runInfo{Relay: relayVersion(ctx, cfg.RelayBin), Source: sourceState(ctx), Date: began, Machine: mach,
			Debezium: cfg.usesDebezium(), Settings: cfg.settings(), Measured: measured}
		path, werr := writeResults(cfg.ChartDir, info, table, summary)
		if werr != nil {
			fmt.Fprintln(stderr, "bench: FAILED:", werr)
			err = errors.Join(err, werr)
		} else {
			fmt.Fprintln(stderr, "bench: results and charts in", path, strings.Join(rep.Charts, " "))
		}
	}
	if err == nil && len(failed) > 0 {
		err = fmt.Errorf("%d measurement(s) failed", len(failed))
	}
	return err
}

func needsRelay(c Config) bool {
	return len(c.Sides) > 0 || len(c.Steady) > 0 || c.BigTx > 0 || c.Messages || len(c.Shards) > 0
}

func parseFlags(args []string, stderr io.Writer) (Config, ServiceOptions, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	events := fs.Int("events", envInt("BENCH_EVENTS", 1_000_000), "backlog size (BENCH_EVENTS)")
	partitions := fs.Int("partitions", envInt("BENCH_PARTITIONS", 3), "partitions per topic (BENCH_PARTITIONS)")
	rate := fs.Int("rate", envInt("BENCH_RATE", 10_000), "steady-state events per second (BENCH_RATE)")
	steadyFor := fs.Duration("steady", envDuration("BENCH_STEADY", 20*time.Second), "steady-state duration of each round (BENCH_STEADY)")
	bigTx := fs.Int("big-tx", envInt("BENCH_BIG_TX", -1), "events in the large transaction, 0 to skip (BENCH_BIG_TX; default: the backlog size)")
	sides := fs.String("sides", envStr("BENCH_SIDES", strings.Join(byDefault(allDrainSides), ",")),
		fmt.Sprintf("drain sides, in order, of %s; %s (PostgreSQL 17+) and %s (16+) run only when named (BENCH_SIDES)", strings.Join(allDrainSides, ","), sidePollStandby, sideRelayStandby))
	steady := fs.String("steady-sides", envStr("BENCH_STEADY_SIDES", strings.Join(byDefault(allSteadySides), ",")),
		fmt.Sprintf("steady-state sides of %s; %s runs only when named (BENCH_STEADY_SIDES)", strings.Join(allSteadySides, ","), sidePollStandby))
	relayArgs := fs.String("relay-args", os.Getenv("BENCH_RELAY_ARGS"), "extra relay flags, space-separated, e.g. --kafka.linger=20ms (BENCH_RELAY_ARGS)")
	relayBin := fs.String("relay-bin", os.Getenv("BENCH_RELAY_BIN"), "outbox-relay binary; built from this module when empty (BENCH_RELAY_BIN)")
	dbzLib := fs.String("debezium-lib", DefaultDebeziumLib(), "Kafka Connect + Debezium jars (OUTBOX_DEBEZIUM_LIB)")
	profile := fs.String("profile", os.Getenv("BENCH_PROFILE"), "directory for pprof profiles of the relay run in-process (a drain and, with steady-state sides, a steady state); empty skips them (BENCH_PROFILE)")
	work := fs.String("work", os.Getenv("BENCH_WORK"), "keep the sides' logs and configuration here; a temp dir removed at the end when empty (BENCH_WORK)")
	kafkaHeap := fs.Int("kafka-heap-mb", envInt("BENCH_KAFKA_HEAP_MB", 1024), "Kafka broker heap (BENCH_KAFKA_HEAP_MB)")
	pgVersion := fs.String("pg-version", os.Getenv("BENCH_PG_VERSION"), "PostgreSQL major version of the bench's cluster, 14 to 18 (make pg-lib fetches them; "+sidePollStandby+" needs 17 or later, "+sideRelayStandby+" 16 or later); empty: the server binaries on PATH (BENCH_PG_VERSION)")
	messages := fs.Bool("messages", envStr("BENCH_MESSAGES", "true") == "true", "measure the table-free outbox too: the backlog as logical decoding messages, drained by pg_recvlogical and the relay (BENCH_MESSAGES)")
	producerFor := fs.Duration("producer", envDuration("BENCH_PRODUCER", 10*time.Second), "how long each client-side producer (outbox.Write, outbox.Emit) commits one-event transactions, 0 to skip (BENCH_PRODUCER)")
	rounds := fs.Int("rounds", envInt("BENCH_ROUNDS", 3), "drains of the ceiling, the relay, exactly-once and the message mode, interleaved; the ratios are medians over them (BENCH_ROUNDS)")
	sweep := fs.String("sweep", os.Getenv("BENCH_SWEEP"), "measure the relay's steady state (both modes) at each kafka.linger[/transaction_interval] of this comma-separated list, every round, and chart p99 against CPU per event; on: "+defaultSweep+" (BENCH_SWEEP)")
	shards := fs.String("shards", os.Getenv("BENCH_SHARDS"), "slot counts to measure N relays on N slots draining one backlog spread over N outbox tables, each round, e.g. 1,2,4 (docs/scaling.md); empty skips it (BENCH_SHARDS)")
	charts := fs.String("charts", envStr("BENCH_CHARTS", filepath.Join(".local", "bench")), "directory for the charts (drains, latency and, with a sweep, sweep; .svg and .png) and the report, results.md; make bench-docs: docs/bench (BENCH_CHARTS)")
	keepTopics := fs.Bool("keep-topics", envStr("BENCH_KEEP_TOPICS", "false") == "true", "leave every measurement's topics on the broker instead of deleting them once measured (BENCH_KEEP_TOPICS)")
	if err := fs.Parse(args); err != nil {
		return Config{}, ServiceOptions{}, err
	}
	points, err := parseSweep(*sweep)
	if err != nil {
		return Config{}, ServiceOptions{}, err
	}
	shardCounts, err := parseShards(*shards)
	if err != nil {
		return Config{}, ServiceOptions{}, err
	}
	svcOpts := ServiceOptions{KafkaHeapMB: *kafkaHeap, PGVersion: *pgVersion, Registry: slices.Contains(splitList(*sides), sideRelayAvro)}
	cfg := Config{
		Events: *events, Partitions: *partitions, Rate: *rate, SteadyFor: *steadyFor, BigTx: *bigTx,
		Sides: splitList(*sides), Steady: splitList(*steady), RelayBin: *relayBin, RelayArgs: strings.Fields(*relayArgs), DebeziumLib: *dbzLib,
		ProfileDir: *profile, WorkDir: *work, Log: stderr, Messages: *messages, ProducerFor: *producerFor, Rounds: *rounds,
		Sweep: points, ChartDir: *charts, Shards: shardCounts, KeepTopics: *keepTopics,
	}
	if cfg.BigTx < 0 {
		cfg.BigTx = cfg.Events
	}
	if cfg.RelayBin != "" {
		abs, err := filepath.Abs(cfg.RelayBin)
		if err != nil {
			return Config{}, ServiceOptions{}, err
		}
		cfg.RelayBin = abs
	}
	// Without --relay-bin, run builds the relay after this: validate the rest.
	check := cfg
	if check.RelayBin == "" {
		check.RelayBin = "(built from this module)"
	}
	return cfg, svcOpts, check.validate()
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func envStr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

func envInt(key string, def int) int {
	v, ok := os.LookupEnv(key)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.ReplaceAll(v, "_", ""))
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s=%q is not a whole number; using %d\n", key, v, def)
		return def
	}
	return n
}

func envDuration(key string, def time.Duration) time.Duration {
	v, ok := os.LookupEnv(key)
	if !ok || v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s=%q is not a duration such as 60s; using %s\n", key, v, def)
		return def
	}
	return d
}

// buildRelay builds cmd/outbox-relay the way `make build` does (static, stripped).
func buildRelay(ctx context.Context, dir string) (string, error) {
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("find the module root (run from inside the repository): %w", err)
	}
	bin := filepath.Join(dir, "outbox-relay")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/outbox-relay")
	cmd.Dir = strings.TrimSpace(string(root))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/outbox-relay: %w\n%s", err, out)
	}
	return bin, nil
}

// machine describes where the numbers come from.
func machine(ctx context.Context, svc *Services) string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64); err == nil {
					mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
				}
			}
		}
	}
	pgVersion := "PostgreSQL ?"
	if out, err := exec.CommandContext(ctx, "psql", "--version").Output(); err == nil {
		pgVersion = strings.TrimSpace(string(out))
	}
	var server string
	if err := svcVersion(ctx, svc, &server); err == nil {
		pgVersion = "PostgreSQL " + server
	}
	java := "java ?"
	if out, err := exec.CommandContext(ctx, "java", "-version").CombinedOutput(); err == nil {
		java, _, _ = strings.Cut(string(out), "\n")
	}
	return fmt.Sprintf("Machine: %s, %d cores%s; %s; Kafka 4.4.0 (KRaft, one node); %s; %s.",
		cpu, runtime.NumCPU(), mem, pgVersion, strings.TrimSpace(java), runtime.Version())
}

func svcVersion(ctx context.Context, svc *Services, out *string) error {
	conn, err := pgx.Connect(ctx, svc.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(out); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("empty server_version")
	}
	return nil
}
