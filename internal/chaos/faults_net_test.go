package chaos

import (
	"strings"
	"testing"
	"time"
)

// A slow network's detail holds the whole shaping drawn, within the documented ranges, and reads
// back to it; a detail of another form is refused with the form wanted.
func TestNetSlowDetailHoldsTheShapingDrawn(t *testing.T) {
	n := testNemesis(11)
	for range 50 {
		d, detail := n.duration(kindNetSlow)
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
	n := testNemesis(5)
	for range 100 {
		f, ok := n.pick(kindCutLeaderLock)
		if !ok {
			t.Fatal("no relay eligible with every fault healed")
		}
		if f.mode.mode.Poll {
			t.Fatalf("cut-leader-lock drawn for %s, a poller", f.relay.name)
		}
		n.release(f)
	}
}
