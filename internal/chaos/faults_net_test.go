package chaos

import (
	"strings"
	"testing"
	"time"
)

// A slow network's detail holds the whole shaping drawn, within the documented ranges, and reads
// back to it; a detail of another form is refused with the form wanted.
func TestNetSlowDetailHoldsTheShapingDrawn(t *testing.T) {
	p := newPlanner(shortOptions(11), true, testLease)
	for range 50 {
		d, detail := p.duration(kindNetSlow)
		s, err := parseShaping(detail)
		if err != nil {
			t.Fatal(err)
		}
		if formatShaping(s) != detail {
			t.Fatalf("%q read back as %q", detail, formatShaping(s))
		}
		if d < 5*time.Second || d > 30*time.Second || s.Latency < 20*time.Millisecond || s.Latency > 250*time.Millisecond ||
			s.Jitter > s.Latency/2 || s.Rate < 64<<10 || s.Rate > 1<<20 {
			t.Fatalf("drew %v with %q: outside the documented ranges", d, detail)
		}
	}
	if _, err := parseShaping("slow"); err == nil || !strings.Contains(err.Error(), "want \"latency") {
		t.Fatalf("a detail of another form: %v, want an error naming the form", err)
	}
}

// The leader lock's cut goes to relays that hold a lock: never to a poller (no leader election,
// no leader_dsn).
func TestTheLeaderLockCutNeverTargetsAPoller(t *testing.T) {
	o := shortOptions(5)
	o.Kinds = []string{kindCutLeaderLock}
	for seed := range uint64(20) {
		o.Seed = seed
		drawn := 0
		for _, f := range drawPlan(o, true, testLease) {
			if f.Kind != kindCutLeaderLock {
				continue
			}
			drawn++
			if m, _ := modeNamed(f.Mode); m.Poll {
				t.Fatalf("seed %d: cut-leader-lock drawn for %s, a poller", seed, f.Mode)
			}
		}
		if drawn == 0 {
			t.Fatalf("seed %d: no cut-leader-lock drawn", seed)
		}
	}
}
