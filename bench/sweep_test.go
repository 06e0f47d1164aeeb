package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSweepSettingsParse(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name    string
		in      string
		want    []sweepPoint
		wantErr string
	}{
		{name: "empty is no sweep", in: "", want: nil},
		{name: "on is the default list, with the relay's defaults in it", in: "on",
			want: []sweepPoint{{Linger: 5 * ms}, {Linger: 15 * ms}, {Linger: 25 * ms}, {Linger: 40 * ms}, {Linger: 80 * ms, Interval: 200 * ms}}},
		{name: "a linger may carry a transaction_interval", in: "0s, 40ms/150ms", want: []sweepPoint{{Linger: 0}, {Linger: 40 * ms, Interval: 150 * ms}}},
		{name: "a linger that is no duration is refused with an example", in: "15", wantErr: `kafka.linger "15" is not a non-negative duration`},
		{name: "a transaction_interval below the relay's minimum is refused", in: "15ms/5ms", wantErr: "at least 10ms"},
		{name: "a point listed twice is refused", in: "15ms,15ms", wantErr: "listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSweep(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseSweep(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("parseSweep(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

// A sweep's own relay flags would be overridden by BENCH_RELAY_ARGS' (or override them): refused.
func TestSweepRefusesRelayArgsThatSetTheSweptKeys(t *testing.T) {
	cfg := Config{Events: 1, Partitions: 1, Rate: 1, SteadyFor: time.Second, Steady: []string{sideRelay}, RelayBin: "/bin/true",
		Sweep: []sweepPoint{{Linger: 5 * time.Millisecond}}, RelayArgs: []string{"--kafka.linger=20ms"}}
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "--kafka.linger=20ms would override the sweep") {
		t.Errorf("validate = %v; want the conflicting flag named", err)
	}
	cfg.RelayArgs, cfg.Steady = nil, []string{sidePoll}
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "a sweep needs relay or relay-exactly-once") {
		t.Errorf("validate = %v; want the missing relay side named", err)
	}
}

// The sweep's table and chart take medians per side and setting over the rounds, leave the swept
// settings other than the default out of the headline numbers, and mark the defaults; the relay's
// exactly-once drain is set against Debezium's with Connect's exactly-once.
func TestSweepTableAndChartMarkTheDefaults(t *testing.T) {
	ms := time.Millisecond
	d, err := defaultsOfTheRelay()
	if err != nil {
		t.Fatal(err)
	}
	steady := func(side string, round int, p *sweepPoint, p99, brokerMicros, cpuMicros int) SteadyResult {
		return SteadyResult{Side: side, Round: round, Point: p, Written: 1000, Rate: 1000, P99: time.Duration(p99) * ms,
			BrokerCPU: time.Duration(brokerMicros*1000) * time.Microsecond, CPU: time.Duration(cpuMicros*1000) * time.Microsecond, Window: time.Second}
	}
	fast, def, slow := &sweepPoint{Linger: 5 * ms}, &sweepPoint{Linger: d.linger}, &sweepPoint{Linger: 80 * ms, Interval: 200 * ms}
	slowALO := &sweepPoint{Linger: 80 * ms}
	rep := &Report{Config: Config{Rounds: 2, Rate: 1000, SteadyFor: time.Second, Sweep: []sweepPoint{*fast, *def, *slow}}}
	for round := range 2 {
		rep.Steady = append(rep.Steady,
			steady(sideRelay, round, fast, 10+round, 12, 4), steady(sideRelay, round, def, 20+round, 8, 3), steady(sideRelay, round, slowALO, 85+round, 5, 2),
			steady(sideRelayEOS, round, fast, 14, 30, 5), steady(sideRelayEOS, round, def, 24+2*round, 20, 4), steady(sideRelayEOS, round, slow, 95, 10, 3),
			steady(sideDbzTuned, round, nil, 500, 6, 9))
	}
	rep.Steady = append(rep.Steady, SteadyResult{Side: sideDbzEOS, Err: errors.New("connect refused")})
	rep.Drains = []Result{{Side: sideRelayEOS, Events: 1000, Wall: time.Second}, {Side: sideDbzEOS, Events: 1000, Wall: 8 * time.Second}}
	table := rep.Table()
	for _, want := range []string{
		"| outbox-relay | linger 15 ms (default) | 20.5 (20.0-21.0) | 8.0 (8.0-8.0) | 3.0 (3.0-3.0) | 2 |",
		"| outbox-relay | linger 80 ms | 85.5 (85.0-86.0) | 5.0 (5.0-5.0) | 2.0 (2.0-2.0) | 2 |",
		"| outbox-relay, exactly-once | linger 15 ms, transaction_interval 100 ms (default) | 25.0 (24.0-26.0) |",
		"| outbox-relay, exactly-once | linger 80 ms, transaction_interval 200 ms | 95.0 (95.0-95.0) |",
		"| Debezium 3.6.1, tuned | its own | 500.0 (500.0-500.0) | 6.0 (6.0-6.0) | 9.0 (9.0-9.0) | 2 |",
		"| Debezium 3.6.1, tuned, Connect exactly-once (KIP-618) | its own | failed ||| 0 of 1 |",
		// The headline p99s are the default setting's alone.
		"| steady: at-least-once p99, ms | 20.5 (20.0-21.0) | 20.0, 21.0 |",
		"| steady: exactly-once p99, ms | 25.0 (24.0-26.0) | 24.0, 26.0 |",
		"| exactly-once drain vs Debezium with Connect's exactly-once | 8.0 | >= 5.0 | yes |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if d.linger != 15*ms || d.interval != 100*ms {
		t.Fatalf("the relay's defaults changed (%s, %s): update this test's rows", d.linger, d.interval)
	}

	dir := t.TempDir()
	paths, err := rep.writeSweepChart(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "sweep.svg"), filepath.Join(dir, "sweep.png")}; !slices.Equal(paths, want) {
		t.Fatalf("chart files %v, want %v", paths, want)
	}
	svg, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"15 ms (default)", "15 ms/100 ms (default)", "the relay&#39;s defaults", "80 ms/200 ms", "Debezium 3.6.1, tuned"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	if png, err := os.ReadFile(paths[1]); err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Errorf("sweep.png is no PNG (%v)", err)
	}
}

// `go run ./bench` builds the relay when no binary is named: the flags alone are no error.
func TestFlagsWithoutARelayBinaryLeaveItToTheBuild(t *testing.T) {
	for _, key := range []string{"BENCH_RELAY_BIN", "BENCH_RELAY_ARGS"} {
		t.Setenv(key, "")
	}
	cfg, _, err := parseFlags([]string{"--sides", "ceiling,relay", "--steady-sides", "relay", "--sweep", "5ms,15ms"}, io.Discard)
	if err != nil || cfg.RelayBin != "" || len(cfg.Sweep) != 2 {
		t.Errorf("parseFlags = relay binary %q, sweep %v, %v; want no binary (run builds it), two points, no error", cfg.RelayBin, cfg.Sweep, err)
	}
}

func TestTargetsCompareBrokerCostAtTheLatencyThePeerTrades(t *testing.T) {
	ms := time.Millisecond
	steady := func(side string, p *sweepPoint, p99, brokerMicros int) SteadyResult {
		return SteadyResult{Side: side, Point: p, Written: 1000, Rate: 1000, P99: time.Duration(p99) * ms,
			BrokerCPU: time.Duration(brokerMicros*1000) * time.Microsecond, Window: time.Second}
	}
	def, slow := &sweepPoint{Linger: 15 * ms}, &sweepPoint{Linger: 80 * ms}
	tests := []struct {
		name  string
		rows  []SteadyResult
		wants []string
	}{
		{
			name: "the cheapest setting within a fifth of Debezium's p99 is compared, the default against 1.5x",
			rows: []SteadyResult{steady(sideRelay, def, 20, 8), steady(sideRelay, slow, 85, 5), steady(sideDbzTuned, nil, 500, 6)},
			wants: []string{
				"| broker CPU per event, steady, at-least-once vs tuned Debezium at a fifth of its p99 (p99 <= 100 ms: linger 80 ms, p99 85.0 ms, against 500.0 ms) | 0.83 | <= 1.00 | yes |",
				"| broker CPU per event, steady, at-least-once at its defaults vs tuned Debezium | 1.33 | <= 1.50 | yes |",
			},
		},
		{
			name: "no setting fast enough is a target not met, and says so",
			rows: []SteadyResult{steady(sideRelay, def, 120, 8), steady(sideDbzTuned, nil, 500, 6)},
			wants: []string{
				"| broker CPU per event, steady, at-least-once vs tuned Debezium at a fifth of its p99 (p99 <= 100 ms) | no setting measured had p99 <= 100 ms | <= 1.00 | no |",
			},
		},
		{
			name: "exactly-once is compared with Connect's exactly-once at equal or lower p99",
			rows: []SteadyResult{steady(sideRelayEOS, def, 30, 20), steady(sideRelayEOS, slow, 95, 10), steady(sideDbzEOS, nil, 90, 15)},
			wants: []string{
				"| broker CPU per event, steady, exactly-once vs Debezium with Connect's exactly-once at equal or lower p99 (p99 <= 90 ms: linger 15 ms, transaction_interval 100 ms (default), p99 30.0 ms, against 90.0 ms) | 1.33 | <= 1.00 | no |",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := &Report{Config: Config{Rounds: 1, Rate: 1000, SteadyFor: time.Second, Sweep: []sweepPoint{*def, *slow}}, Steady: tt.rows,
				Messages: &MessagesResult{Drains: []Result{{Side: sideMsgRelay, Events: 1000, Wall: time.Second, CPU: 3 * ms}}}}
			var b strings.Builder
			rep.targetsTable(&b)
			for _, want := range append(tt.wants, "| table-free relay CPU per event in the drain, µs | 3.0 | <= 3.5 | yes |") {
				if !strings.Contains(b.String(), want) {
					t.Errorf("targets lack %q:\n%s", want, b.String())
				}
			}
		})
	}
}
