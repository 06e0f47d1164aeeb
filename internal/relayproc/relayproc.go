// Package relayproc runs the outbox-relay binary as a child process for end-to-end, fault and
// benchmark tests: built once per test binary, started with its own environment and flags, its
// output captured, and stopped with SIGTERM or killed with SIGKILL like an operator or a crash would.
package relayproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

type buildOnce struct {
	once sync.Once
	path string
	err  error
}

var raceBuild, plainBuild buildOnce

// Binary builds cmd/outbox-relay once per test binary, with -race when the test binary has it, and
// returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	if raceEnabled {
		return raceBuild.get(t, "-race")
	}
	return PlainBinary(t)
}

// PlainBinary builds cmd/outbox-relay without the race detector, for measuring memory and speed.
func PlainBinary(t testing.TB) string {
	t.Helper()
	return plainBuild.get(t)
}

func (b *buildOnce) get(t testing.TB, flags ...string) string {
	t.Helper()
	b.once.Do(func() {
		// Named like internal/testenv's instance directories, so its cleanup of what dead test
		// binaries left behind removes this too.
		dir, err := os.MkdirTemp("", fmt.Sprintf("outbox-testenv-%d-bin-", os.Getpid()))
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "outbox-relay")
		args := append([]string{"build", "-o", b.path}, flags...)
		args = append(args, "github.com/outbox-relay/outbox-relay/cmd/outbox-relay")
		cmd := exec.Command("go", args...)
		cmd.Dir = moduleRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Proc is one running relay.
type Proc struct {
	t    testing.TB
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// Options says how to start the relay.
type Options struct {
	Args []string          // after the subcommand
	Env  map[string]string // added to a minimal environment (PATH, HOME, TMPDIR)
	// Subcommand defaults to "run".
	Subcommand string
	// Plain runs the binary built without the race detector (for RSS and speed measurements).
	Plain bool
}

// Start starts the relay; it is killed at the end of the test if still running.
func Start(t testing.TB, opts Options) *Proc {
	t.Helper()
	sub := opts.Subcommand
	if sub == "" {
		sub = "run"
	}
	bin, raced := Binary(t), raceEnabled
	if opts.Plain {
		bin, raced = PlainBinary(t), false
	}
	cmd := exec.Command(bin, append([]string{sub}, opts.Args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(),
		// Tests publish to topics they do not create; a test of the default sets it (opts.Env wins).
		"OUTBOX_KAFKA_AUTO_CREATE_TOPICS=true"}
	for k, v := range opts.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &Proc{t: t, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	// A group of its own: a test that stops the relay (SIGSTOP) must not see the kernel's SIGHUP
	// to an orphaned process group with a stopped member end it (internal/chaos/relay.go).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	waited, err := devenv.StartPinned(cmd) // see StartPinned: the death signal follows the forking thread
	if err != nil {
		t.Fatalf("start relay: %v", err)
	}
	go func() {
		p.err = <-waited
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		// A race-built relay reports a race on its output and goes on (its exit code says so only
		// if it exits by itself, which a killed relay never does): look for the report.
		if raced && strings.Contains(p.Output(), "WARNING: DATA RACE") {
			t.Errorf("the relay (pid %d) reported a data race", cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("relay (pid %d) output:\n%s", cmd.Process.Pid, tail(p.Output(), 150))
		}
	})
	return p
}

// Run starts the relay and waits for it to exit, returning its exit code and output.
func Run(t testing.TB, opts Options, timeout time.Duration) (code int, output string) {
	t.Helper()
	p := Start(t, opts)
	code, ok := p.Wait(timeout)
	if !ok {
		t.Fatalf("relay %v did not exit within %s; output:\n%s", opts.Args, timeout, tail(p.Output(), 50))
	}
	return code, p.Output()
}

// PID returns the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Output returns everything the relay wrote to stdout and stderr so far.
func (p *Proc) Output() string { return p.out.String() }

// Terminate sends SIGTERM.
func (p *Proc) Terminate() { p.cmd.Process.Signal(syscall.SIGTERM) }

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the process to exit and returns its exit code (-1 when killed by a
// signal); ok is false on timeout.
func (p *Proc) Wait(timeout time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return 0, false
	}
	if p.err == nil {
		return 0, true
	}
	if ee, isExit := p.err.(*exec.ExitError); isExit {
		return ee.ExitCode(), true
	}
	return -1, true
}

// WaitFor polls the output until it contains substr or timeout passes.
func (p *Proc) WaitFor(ctx context.Context, substr string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if strings.Contains(p.Output(), substr) {
			return true
		}
		if p.Exited() {
			return strings.Contains(p.Output(), substr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// RSS returns the process's resident set size in bytes, from /proc.
func (p *Proc) RSS() (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb)
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", p.PID())
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Logs parses the JSON log lines in output; other lines are left out.
func Logs(output string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(output))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// FindLog returns the first JSON log line in output at level (any level when empty) whose message
// contains msg, ignoring case, or nil.
func FindLog(output, level, msg string) map[string]any {
	for _, l := range Logs(output) {
		m, _ := l["msg"].(string)
		if strings.Contains(strings.ToLower(m), strings.ToLower(msg)) && (level == "" || l["level"] == level) {
			return l
		}
	}
	return nil
}
