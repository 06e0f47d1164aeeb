package cluster

import (
	"context"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A process moved into a memory cgroup is OOM-killed by the kernel once it passes the limit, as
// the nemesis's oom fault does to a relay, and Close leaves no cgroup behind.
func TestAProcessPastItsCgroupMemoryLimitIsOOMKilled(t *testing.T) {
	g, err := NewMemoryCgroup("cluster-test-oom")
	if err != nil {
		t.Fatalf("this machine kind offers a cgroup v1 memory controller to root: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = g.Close()
		}
	}()
	if err := g.Limit(32 << 20); err != nil {
		t.Fatal(err)
	}
	// tail keeps a line that never ends in memory: it grows until something stops it.
	cmd := exec.Command("tail", "/dev/zero")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// Started stopped would need ptrace: it is moved at once, before it has read much.
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("tail /dev/zero still runs 30 s after its move into a cgroup limited to 32 MiB")
	}
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("tail ended with %v, want SIGKILL from the OOM killer", werr)
	}
	kills, err := g.OOMKills()
	if err != nil || kills < 1 {
		t.Fatalf("oom_kill %d (%v), want at least 1", kills, err)
	}
	closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The cgroup lingers a moment after its last process exits.
	if err := poll(ctx, 50*time.Millisecond, func(context.Context) (bool, error) { return g.Close() == nil, nil }); err != nil {
		t.Fatalf("Close: %v", g.Close())
	}
}
