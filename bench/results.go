package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The report file: what the run prints on stdout, with a header saying where it comes from, in
// <charts dir>/results.md, so docs/benchmarks.md's current results are pasted from one run.

// runInfo is the header of a run's report.
type runInfo struct {
	Relay    string // `outbox-relay version`'s first lines: the measured build and its commit
	Source   string // the working tree the bench ran from: commit, and whether it had changes
	Date     time.Time
	Machine  string // machine(): CPU, cores, RAM, PostgreSQL, Kafka, Java, Go
	Debezium bool   // a Debezium side ran
	Settings []string
	Measured time.Duration
}

// header renders the run's header as Markdown.
func (i runInfo) header() string {
	var b strings.Builder
	b.WriteString("# outbox-relay benchmark results\n\n")
	fmt.Fprintf(&b, "- Date: %s\n", i.Date.UTC().Format("2006-01-02 15:04 UTC"))
	if i.Relay != "" {
		fmt.Fprintf(&b, "- Relay: %s\n", i.Relay)
	}
	if i.Source != "" {
		fmt.Fprintf(&b, "- Source: %s\n", i.Source)
	}
	fmt.Fprintf(&b, "- %s\n", strings.TrimSuffix(i.Machine, "."))
	if i.Debezium {
		b.WriteString("- Debezium 3.6.1 (PostgreSQL connector, outbox event router) on Kafka Connect, from bench/debezium-lib.sh\n")
	}
	fmt.Fprintf(&b, "- Settings: %s\n", strings.Join(i.Settings, " "))
	fmt.Fprintf(&b, "- Measured in %s\n", i.Measured.Round(time.Second))
	return b.String()
}

// settings are the run's effective knobs as BENCH_* assignments (what reproduces it), whether
// they came from the environment, a flag or a default.
func (c Config) settings() []string {
	sweep := make([]string, len(c.Sweep))
	for i, p := range c.Sweep {
		sweep[i] = p.Linger.String()
		if p.Interval > 0 {
			sweep[i] += "/" + p.Interval.String()
		}
	}
	out := []string{
		fmt.Sprintf("BENCH_EVENTS=%d", c.Events),
		fmt.Sprintf("BENCH_ROUNDS=%d", max(c.Rounds, 1)),
		fmt.Sprintf("BENCH_PARTITIONS=%d", c.Partitions),
		fmt.Sprintf("BENCH_RATE=%d", c.Rate),
		fmt.Sprintf("BENCH_STEADY=%s", c.SteadyFor),
		fmt.Sprintf("BENCH_BIG_TX=%d", c.BigTx),
		"BENCH_SIDES=" + strings.Join(c.Sides, ","),
		"BENCH_STEADY_SIDES=" + strings.Join(c.Steady, ","),
		fmt.Sprintf("BENCH_MESSAGES=%t", c.Messages),
		fmt.Sprintf("BENCH_PRODUCER=%s", c.ProducerFor),
	}
	if len(sweep) > 0 {
		out = append(out, "BENCH_SWEEP="+strings.Join(sweep, ","))
	}
	if len(c.RelayArgs) > 0 {
		out = append(out, fmt.Sprintf("BENCH_RELAY_ARGS=%q", strings.Join(c.RelayArgs, " ")))
	}
	if c.KeepTopics {
		out = append(out, "BENCH_KEEP_TOPICS=true")
	}
	// The environment's other BENCH_* knobs, e.g. the PostgreSQL version or the broker's heap.
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "BENCH_") && !slices.ContainsFunc(out, func(s string) bool { return strings.HasPrefix(s, k+"=") }) &&
			k != "BENCH_CHARTS" && k != "BENCH_WORK" && k != "BENCH_PROFILE" && k != "BENCH_RELAY_BIN" {
			env = append(env, kv)
		}
	}
	slices.Sort(env)
	return append(out, env...)
}

// relayVersion is what the relay binary says it is, on one line.
func relayVersion(ctx context.Context, bin string) string {
	if bin == "" {
		return ""
	}
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		return ""
	}
	var parts []string
	for line := range strings.Lines(string(out)) {
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, "; ")
}

// sourceState is the commit of the working tree the bench runs in, and whether it had changes.
func sourceState(ctx context.Context) string {
	head, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	s := "commit " + strings.TrimSpace(string(head))
	if dirty, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(dirty) > 0 {
		s += " with uncommitted changes"
	}
	return s
}

// writeResults writes the report, header first, to <dir>/results.md and returns its path.
func writeResults(dir string, info runInfo, table, summary string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("write the results: %w", err)
	}
	path := filepath.Join(dir, "results.md")
	body := info.header() + "\n" + table + "\n```\n" + summary + "\n```\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("write the results: %w", err)
	}
	return path, nil
}
