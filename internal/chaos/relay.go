package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// relay is one relay process of a mode, started again after every fault that ends it, as an
// orchestrator would.
type relay struct {
	name    string // unique in the run: "<mode>.r1"
	bin     string
	args    []string
	env     []string
	logPath string
	metrics string // host:port of its metrics endpoint

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the current process has exited
	code    int
	stopped bool // SIGSTOPped
	// expectExit is set by the nemesis before it ends the process, so that an exit of the
	// relay's own accord (a refusal, a crash) can be told apart; sent is the ending signal sent.
	expectExit bool
	sent       syscall.Signal
	ownExits   int
	logStart   int64          // where the current process's output begins in the log
	exits      []history.Exit // every end of a process, for the history
}

func newRelay(name, bin string, args, env []string, logPath string) (*relay, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return &relay{name: name, bin: bin, args: append(args, "--metrics-addr="+addr), env: env, logPath: logPath, metrics: addr}, nil
}

func freeAddr() (string, error) {
	addr, err := devenv.FreeAddr()
	if err != nil {
		return "", fmt.Errorf("chaos: free port: %w", err)
	}
	return addr, nil
}

// start starts the process unless it runs.
func (r *relay) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running() {
		return nil
	}
	log, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: relay %s log: %w", r.name, err)
	}
	var logStart int64
	if fi, err := log.Stat(); err == nil {
		logStart = fi.Size()
	}
	fmt.Fprintf(log, "=== chaos: start %s at %s\n", r.name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(r.bin, append([]string{"run"}, r.args...)...)
	// The nemesis's topics are the ones the relay creates as it goes (the default is not to).
	cmd.Env = append(append(os.Environ(), "OUTBOX_KAFKA_AUTO_CREATE_TOPICS=true"), r.env...)
	cmd.Stdout, cmd.Stderr = log, log
	// The relay dies with the harness, whatever ends it. It runs in a process group of its own:
	// in the harness's, a stopped relay (the pause fault) was sent SIGHUP by the kernel when that
	// group became orphaned (POSIX sends SIGHUP and SIGCONT to an orphaned group with a stopped
	// member), and died mid-pause as if of its own accord (the run of seed 39061, exit -1). The
	// harness, its parent in another group of the session, keeps this one from being orphaned.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	waited, err := devenv.StartPinned(cmd)
	if err != nil {
		log.Close()
		return fmt.Errorf("chaos: start relay %s: %w", r.name, err)
	}
	exited := make(chan struct{})
	r.cmd, r.exited, r.stopped, r.expectExit, r.sent, r.logStart = cmd, exited, false, false, 0, logStart
	go func() {
		err := <-waited
		at := time.Now()
		log.Close()
		out := r.output(logStart)
		r.mu.Lock()
		r.code = exitCode(err)
		ex := history.Exit{Relay: r.name, At: at, Cause: history.ExitOwn, Code: r.code, LastError: lastError(out), Crash: crashLine(out)}
		switch {
		case !r.expectExit:
			r.ownExits++
		case r.sent == syscall.SIGKILL && r.code != -int(syscall.SIGKILL):
			// Expected to be killed (a kill9 sent, an OOM kill awaited) but it ended otherwise:
			// of its own accord, before the kill. The exit rule judges it; the fault's own
			// bookkeeping (restarts, ownExits) stays the nemesis's.
		case r.sent == syscall.SIGKILL:
			ex.Cause = history.ExitSigkill
		default:
			ex.Cause = history.ExitSigterm
		}
		r.exits = append(r.exits, ex)
		r.mu.Unlock()
		close(exited)
	}()
	return nil
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}

// running reports whether the current process has not exited; r.mu held.
func (r *relay) running() bool {
	if r.exited == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// Running reports whether the process runs (paused counts as running).
func (r *relay) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running()
}

// ownExit returns how many times the process ended of its own accord, and resets the count.
func (r *relay) takeOwnExits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.ownExits
	r.ownExits = 0
	return n
}

func (r *relay) signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running() {
		return fmt.Errorf("chaos: relay %s is not running", r.name)
	}
	switch sig {
	case syscall.SIGKILL, syscall.SIGTERM:
		r.expectExit = true
		if r.sent != syscall.SIGKILL { // a SIGTERM not obeyed in time is followed by SIGKILL
			r.sent = sig
		}
	}
	if sig == syscall.SIGKILL && r.stopped {
		// A stopped process takes SIGKILL, nothing else; it is no longer stopped once gone.
		r.stopped = false
	}
	if err := r.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("chaos: signal relay %s: %w", r.name, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		r.stopped = true
	case syscall.SIGCONT:
		r.stopped = false
	}
	return nil
}

// kill ends the process with SIGKILL and waits for it.
func (r *relay) kill(ctx context.Context) error {
	if err := r.signal(syscall.SIGKILL); err != nil {
		return err
	}
	_, err := r.wait(ctx)
	return err
}

// terminate sends SIGTERM (continuing a paused process first) and waits at most limit for the
// exit; it returns when the signal went and when the process exited (zero if it did not in time).
func (r *relay) terminate(ctx context.Context, limit time.Duration) (signalled, exited time.Time, code int, err error) {
	r.mu.Lock()
	paused := r.stopped
	r.mu.Unlock()
	if paused {
		if err := r.signal(syscall.SIGCONT); err != nil {
			return signalled, exited, 0, err
		}
	}
	signalled = time.Now()
	if err := r.signal(syscall.SIGTERM); err != nil {
		return signalled, exited, 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	code, err = r.wait(wctx)
	if err != nil {
		// Not gone in time: the checker reports the slow stop; the process is killed.
		_ = r.kill(ctx)
		return signalled, time.Time{}, 0, nil
	}
	return signalled, time.Now(), code, nil
}

// wait waits for the current process to exit.
func (r *relay) wait(ctx context.Context) (int, error) {
	r.mu.Lock()
	exited := r.exited
	r.mu.Unlock()
	if exited == nil {
		return 0, nil
	}
	select {
	case <-exited:
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.code, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("chaos: relay %s still running: %w", r.name, ctx.Err())
	}
}

// pid is the current process's id, 0 when none runs.
func (r *relay) pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running() {
		return 0
	}
	return r.cmd.Process.Pid
}

// paused reports whether the process is SIGSTOPped.
func (r *relay) paused() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped && r.running()
}

// scrape reads the relay's leader gauge; up is false when the endpoint did not answer.
func (r *relay) scrape(ctx context.Context, client *http.Client) (up, leader bool) {
	ctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.metrics+"/metrics", nil)
	if err != nil {
		return false, false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, false
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "outbox_relay_leader ") || strings.HasPrefix(line, "outbox_relay_leader{") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			leader = v == 1
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return true, leader
}

// rss reads the process's resident set size in bytes from /proc; 0 when none runs.
func (r *relay) rss() int64 {
	pid := r.pid()
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// takeExits returns the process ends recorded since the last call.
func (r *relay) takeExits() []history.Exit {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.exits
	r.exits = nil
	return out
}

// lastExit returns the last process end recorded, zero when none.
func (r *relay) lastExit() history.Exit {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.exits) == 0 {
		return history.Exit{}
	}
	return r.exits[len(r.exits)-1]
}

// output returns what the process that started at offset from of the log wrote: its own lines
// only, so an earlier process's error or crash is not taken for this one's.
func (r *relay) output(from int64) string {
	f, err := os.Open(r.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return ""
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return ""
	}
	return string(b)
}

// lastError returns the last error line of a process's output: the error the command ended with
// ("outbox-relay: ..." on stderr) or an error-level log line; "" when there is none.
func lastError(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0 && i >= len(lines)-200; i-- {
		if strings.HasPrefix(lines[i], "outbox-relay: ") || strings.Contains(lines[i], `"level":"error"`) || strings.Contains(lines[i], `"level":"fatal"`) {
			if len(lines[i]) > 600 {
				return lines[i][:600] + "..."
			}
			return lines[i]
		}
	}
	return ""
}

// crashMarkers begin the lines with which the Go runtime reports a panic, a fatal runtime error
// and a data race (the race detector goes on running, so a race is found in any exit's output).
var crashMarkers = []string{"panic: ", "fatal error: ", "WARNING: DATA RACE"}

// crashLine returns the first line of a process's output that begins with a crash marker, ""
// when there is none.
func crashLine(out string) string {
	for len(out) > 0 {
		line, rest, _ := strings.Cut(out, "\n")
		for _, m := range crashMarkers {
			if strings.HasPrefix(line, m) {
				return line
			}
		}
		out = rest
	}
	return ""
}
