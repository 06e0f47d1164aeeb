package devenv

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortsAreDistinctBindableAndNeverEphemeral: a server is given its port before it binds
// it; a port of the kernel's ephemeral range may meanwhile become the local end of an outgoing
// connection, and the server then fails to start (a PostgreSQL of the suite did, with three test
// packages running at once).
func TestFreePortsAreDistinctBindableAndNeverEphemeral(t *testing.T) {
	lo, hi := belowEphemeral()
	if hi-lo < 1000 {
		t.Skipf("the ephemeral range starts at %d: no room below it here", hi)
	}
	ports, err := FreePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] || p < lo || p >= hi {
			t.Fatalf("ports %v: %d repeated or outside [%d, %d)", ports, p, lo, hi)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d cannot be bound: %v", p, err)
		}
		l.Close()
	}
}
