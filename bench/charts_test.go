package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// cannedReport is a run's results without a run: two rounds of drains (the table's and the message
// mode's) and of steady states with their latency curves.
func cannedReport() *Report {
	ms := time.Millisecond
	curve := func(base time.Duration) []time.Duration {
		out := make([]time.Duration, len(latencyCurve))
		for i := range out {
			out[i] = base * time.Duration(i+1)
		}
		return out
	}
	rep := &Report{Config: Config{Events: 1000, Rounds: 2, Rate: 1000, SteadyFor: time.Second}}
	for round := range 2 {
		rep.Drains = append(rep.Drains,
			Result{Side: sideCeiling, Round: round, Events: 1000, Wall: time.Second},
			Result{Side: sideRelay, Round: round, Events: 1000, Wall: 1250 * ms, BrokerCPU: time.Duration(round+1) * ms},
			Result{Side: sideRelayEOS, Round: round, Events: 1000, Wall: 1300 * ms})
		rep.Steady = append(rep.Steady,
			SteadyResult{Side: sideRelay, Round: round, Written: 1000, P99: 20 * ms, Curve: curve(2 * ms)},
			SteadyResult{Side: sideDbzTuned, Round: round, Written: 1000, P99: 500 * ms, Curve: curve(50 * ms)})
	}
	rep.Drains = append(rep.Drains, Result{Side: sideDbzTuned, Events: 1000, Wall: 4 * time.Second})
	rep.Messages = &MessagesResult{Drains: []Result{
		{Side: sideMsgCeiling, Events: 1000, Wall: 800 * ms}, {Side: sideMsgRelay, Events: 1000, Wall: time.Second}}}
	return rep
}

func TestChartsDrawTheDrainsAndTheLatencyPerSide(t *testing.T) {
	rep := cannedReport()
	dir := t.TempDir()
	paths, err := rep.writeCharts(dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range []string{"drains.svg", "drains.png", "latency.svg", "latency.png"} {
		want = append(want, filepath.Join(dir, name))
	}
	if !slices.Equal(paths, want) {
		t.Fatalf("chart files %v, want %v (no sweep, no sweep chart)", paths, want)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for name, wants := range map[string][]string{
		// Each side once, with its median rate; the message mode's drains too.
		"drains.svg":  {"ceiling (pg_recvlogical)", "outbox-relay, exactly-once", "Debezium 3.6.1, tuned", "outbox-relay, messages", "800/s", "250/s"},
		"latency.svg": {"outbox-relay", "Debezium 3.6.1, tuned", "p50", "p99", "p99.9"},
	} {
		svg := read(name)
		for _, w := range wants {
			if !strings.Contains(svg, w) {
				t.Errorf("%s lacks %q", name, w)
			}
		}
	}
	for _, name := range []string{"drains.png", "latency.png"} {
		if !strings.HasPrefix(read(name), "\x89PNG") {
			t.Errorf("%s is no PNG", name)
		}
	}
}

func TestLatencyLinesAreTheRoundsMediansAtTheDefaultSettings(t *testing.T) {
	rep := cannedReport()
	// A sweep's other setting is left out of the distribution: the chart shows what a user gets.
	rep.Steady = append(rep.Steady, SteadyResult{Side: sideRelay, Written: 1000, Point: &sweepPoint{Linger: 80 * time.Millisecond},
		P99: time.Second, Curve: slices.Repeat([]time.Duration{time.Second}, len(latencyCurve))})
	lines := rep.latencyLines()
	if len(lines) != 2 || lines[0].side != sideRelay || lines[1].side != sideDbzTuned {
		t.Fatalf("lines %+v, want the relay's and tuned Debezium's", lines)
	}
	if got := lines[0].ms[len(latencyCurve)-1]; got != 2*float64(len(latencyCurve)) {
		t.Errorf("the relay's p%.1f is %.1f ms, want %d (its default setting's)", latencyCurve[len(latencyCurve)-1], got, 2*len(latencyCurve))
	}
}

func TestResultsFileHasTheRunsHeaderAndTables(t *testing.T) {
	t.Setenv("BENCH_PG_VERSION", "17")
	rep := cannedReport()
	rep.Config.Sides, rep.Config.Sweep = []string{sideCeiling, sideRelay}, []sweepPoint{{Linger: 15 * time.Millisecond}, {Linger: 80 * time.Millisecond, Interval: 200 * time.Millisecond}}
	info := runInfo{Relay: "outbox-relay 1.2.3; commit: abc", Source: "commit abc", Date: time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC),
		Machine: "Machine: Some CPU, 2 cores, 8 GiB; PostgreSQL 17.2; Kafka 4.4.0 (KRaft, one node); openjdk 21; go1.26.", Debezium: true,
		Settings: rep.Config.settings(), Measured: 95 * time.Minute}
	path, err := writeResults(t.TempDir(), info, rep.Table(), rep.Summary())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# outbox-relay benchmark results", "- Date: 2026-12-06 22:00 UTC", "- Relay: outbox-relay 1.2.3; commit: abc",
		"- Source: commit abc", "- Machine: Some CPU, 2 cores, 8 GiB", "- Debezium 3.6.1", "BENCH_EVENTS=1000 BENCH_ROUNDS=2",
		"BENCH_SIDES=ceiling,relay", "BENCH_SWEEP=15ms,80ms/200ms", "BENCH_PG_VERSION=17", "- Measured in 1h35m0s",
		"| outbox-relay (round 2) |", "bench: relay_vs_ceiling=0.80",
		// The broker's cost per event of the relay's rounds, in order: what drifts with the rounds.
		"| at-least-once drain: broker CPU µs per event, by round | 1.5 (1.0-2.0) | 1.0, 2.0 |"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("results.md lacks %q:\n%s", want, b)
		}
	}
}
