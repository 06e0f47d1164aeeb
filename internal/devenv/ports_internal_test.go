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
	// Where the ephemeral range leaves no room below it, FreePorts lets the kernel choose: the
	// ports must still be distinct and bindable, only the range is not checked.
	roomBelow := hi-lo >= 1000
	ports, err := FreePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] || roomBelow && (p < lo || p >= hi) {
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
