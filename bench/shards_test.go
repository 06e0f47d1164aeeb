package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// The standby rows set each round's relay on a standby beside the relay on the primary, and the
// shards rows each N beside N = 1 of its round; the summary gives the medians of those ratios
// over the rounds, for the largest N.
func TestStandbyAndShardRowsCompareWithinTheirRound(t *testing.T) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	drain := func(side string, round int, wall, primary, sender float64) Result {
		return Result{Side: side, Round: round, Events: 1000, Wall: sec(wall), PrimaryCPU: sec(primary), SenderCPU: sec(sender), CPU: sec(0.01)}
	}
	shard := func(n, round int, wall, senders float64) ShardResult {
		var each []time.Duration
		var shares []int64
		for range n {
			each, shares = append(each, sec(senders/float64(n))), append(shares, int64(1000/n))
		}
		return ShardResult{N: n, Round: round, Events: 1000, Wall: sec(wall), SenderCPU: sec(senders), Senders: each, Shares: shares}
	}
	rep := &Report{
		Config: Config{Rounds: 2, Events: 1000},
		Drains: []Result{
			drain(sideRelay, 0, 1, 0.004, 0.002), drain(sideRelayStandby, 0, 1.25, 0.001, 0.002), // primary CPU x0.25
			drain(sideRelay, 1, 1, 0.004, 0.002), drain(sideRelayStandby, 1, 2, 0.002, 0.002), // x0.50
		},
		Shards: []ShardResult{
			shard(1, 0, 1, 0.002), shard(4, 0, 0.5, 0.008), // drain x2, walsenders x4
			shard(1, 1, 1, 0.002), shard(4, 1, 1, 0.004), // x1, x2
		},
	}
	summary, table := rep.Summary(), rep.Table()
	if want := " standby_primary_cpu_x=0.38 shards_drain_x=1.50 shards_walsender_cpu_x=3.00"; !strings.HasSuffix(summary, want) {
		t.Errorf("summary %q does not end with %q", summary, want)
	}
	for _, want := range []string{
		"| outbox-relay, decoding on a hot standby (round 2) | 500 | 0.50 | 0.00 | 2.0 | 2.0 | 0.00 | 10.0 |",
		"| N = 4 (round 1) | 2000 | 2.00 | 0.50 | 0.0 | 0.01 | 8.0 | 4.00 | 0.0 | 0.0 |",
		"| the primary's CPU per event, decoding on a hot standby / on the primary | 0.38 (0.25-0.50) | 0.25, 0.50 |",
		"the walsenders' CPU per event is the figure that carries over",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// A server's CPU is its postmaster's and every child's, also of a child that has exited: here
// this test's process stands for the postmaster, and a shell that burned CPU for its child.
func TestClusterCPUCountsChildrenThatHaveExited(t *testing.T) {
	before, err := clusterCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	own0, _ := procCPU(os.Getpid())
	burn := exec.Command("sh", "-c", "head -c 100000000 /dev/zero | cksum")
	if err := burn.Run(); err != nil { // Wait reaps it: its times join this process's cutime and cstime
		t.Fatal(err)
	}
	child := burn.ProcessState.UserTime() + burn.ProcessState.SystemTime()
	after, err := clusterCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	own1, _ := procCPU(os.Getpid())
	if got := (after - before) - (own1 - own0); child >= 20*time.Millisecond && got < child/2 {
		t.Errorf("clusterCPU grew by %s beyond this process's own, the exited child used %s", got, child)
	}
	if child < 20*time.Millisecond {
		t.Fatalf("the child used only %s of CPU: too little to tell", child)
	}
}

func TestBenchShardsTakesSlotCountsAndRefusesOthersInOneLine(t *testing.T) {
	tests := []struct {
		name, in string
		want     []int
		wantErr  string
	}{
		{"a list of counts, repeats dropped", "1, 2,4,2", []int{1, 2, 4}, ""},
		{"empty skips the measurement", "", nil, ""},
		{"zero slots is refused", "1,0", nil, `"0" is not a slot count from 1 to 16`},
		{"a word is refused", "four", nil, `"four" is not a slot count`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseShards(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("parseShards(%q) = %v, %v; want one line with %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("parseShards(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}
