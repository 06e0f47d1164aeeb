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

// TestAPortHandedOutIsNotHandedOutAgain: a server stopped for a while (a broker outage) must find
// its port free when it starts again; a fault test's broker failed to restart because the port had
// been handed to another server meanwhile. A claim is a lock on a file shared by every process of
// the machine, held for the process's life.
func TestAPortHandedOutIsNotHandedOutAgain(t *testing.T) {
	ports, err := FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		// Nothing listens on it now, and a search of a range holding only it must not find it.
		again, err := freePortsIn(p, p+1, 1)
		if err != nil {
			t.Fatal(err)
		}
		if again[0] == p {
			t.Errorf("port %d handed out twice", p)
		}
		// Another open of its claim file (what another test process does) cannot take the lock.
		if claimPort(p) {
			t.Errorf("port %d claimed twice", p)
		}
	}
}
