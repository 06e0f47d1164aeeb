package devenv

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestAServerStartWaitsAsLongAsTheCallersContextAllows: a server that is slow to become ready
// (a broker's JVM on a loaded machine) is waited for until the caller's deadline, not cut off
// by the service's own bound, which applies only to a caller without a deadline.
func TestAServerStartWaitsAsLongAsTheCallersContextAllows(t *testing.T) {
	t.Parallel()
	const own = 50 * time.Millisecond // the service's bound, far below the time to be ready
	for _, tc := range []struct {
		name      string
		deadline  time.Duration // 0: no deadline
		wantReady bool
	}{
		{"a caller's deadline beyond the service's bound is waited for", 10 * time.Second, true},
		{"without a deadline the service's bound applies", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s := &service{name: "slow", dir: dir, pidFile: filepath.Join(dir, "slow.pid"), needle: "sleep"}
			began := time.Now()
			ready := func(context.Context) error {
				if time.Since(began) < 20*own {
					return errors.New("not yet")
				}
				return nil
			}
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			s.mu.Lock()
			err := s.start(ctx, spawnSpec{path: "sleep", args: []string{"30"}, dir: dir, deathSig: syscall.SIGKILL}, own, ready)
			s.mu.Unlock()
			t.Cleanup(func() { _ = s.proc.kill() })
			if got := err == nil; got != tc.wantReady {
				t.Fatalf("start returned %v after %s; want ready %v", err, time.Since(began).Round(time.Millisecond), tc.wantReady)
			}
		})
	}
}
