package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// fakeRelays starts two processes that stand in for a mode's relays (they only sleep) with a
// metrics endpoint each whose leader gauge the test sets.
func fakeRelays(t *testing.T) (*nemesis, *modeRun, [2]*atomic.Bool) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "relay")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 300\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := &modeRun{mode: modes[0]}
	var leading [2]*atomic.Bool
	for i := range 2 {
		leading[i] = new(atomic.Bool)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			v := 0
			if leading[i].Load() {
				v = 1
			}
			fmt.Fprintf(w, "# TYPE outbox_relay_leader gauge\noutbox_relay_leader %d\n", v)
		}))
		t.Cleanup(srv.Close)
		rl := &relay{name: fmt.Sprintf("r%d", i+1), bin: bin, logPath: filepath.Join(dir, fmt.Sprintf("r%d.log", i+1)),
			metrics: strings.TrimPrefix(srv.URL, "http://")}
		if err := rl.start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rl.kill(context.Background()) })
		m.relays = append(m.relays, rl)
	}
	r := &runner{lease: 100 * time.Millisecond, http: &http.Client{Timeout: time.Second}, modes: []*modeRun{m}}
	return &nemesis{run: r, busy: make(map[string]bool)}, m, leading
}

// A relay fault's target is read from the relays when it applies: the one whose gauge says it
// leads at that moment for a leader's fault, another for a follower's, and a leader's fault
// waits while the leader is under another fault.
func TestATargetByRoleIsTheRelayLeadingAtTheMoment(t *testing.T) {
	n, m, leading := fakeRelays(t)
	ctx := context.Background()
	resolve := func(role string, leader int, limit time.Duration) (*fault, error) {
		for i := range leading {
			leading[i].Store(i == leader)
		}
		f := &fault{kind: kindKill9, mode: m, role: role, pick: 1}
		rctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		err := n.resolve(rctx, f)
		if err == nil {
			n.release(f)
		}
		return f, err
	}
	for _, tt := range []struct {
		name       string
		role       string
		leader     int // which relay's gauge says 1; -1 none
		want       string
		wantLeader bool
	}{
		{"a leader's fault goes to the relay leading now", history.RoleLeader, 1, "r2", true},
		{"after a handover, to the new leader", history.RoleLeader, 0, "r1", true},
		{"a follower's fault goes to a relay not leading", history.RoleFollower, 0, "r2", false},
		{"a leader's fault with nobody leading for twice the lease goes to a follower, as one", history.RoleLeader, -1, "r2", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := resolve(tt.role, tt.leader, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if f.relay.name != tt.want || f.leader != tt.wantLeader {
				t.Errorf("resolved to %s (leading %v), want %s (leading %v)", f.relay.name, f.leader, tt.want, tt.wantLeader)
			}
		})
	}
	t.Run("a leader's fault waits while the leader is under another fault", func(t *testing.T) {
		n.busy["r1"] = true
		defer delete(n.busy, "r1")
		if f, err := resolve(history.RoleLeader, 0, 600*time.Millisecond); err == nil {
			t.Errorf("resolved to %s while the leader r1 was busy", f.relay.name)
		}
	})
}
