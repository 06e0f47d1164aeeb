// Package devenv runs throwaway PostgreSQL clusters and KRaft Kafka clusters (a broker+controller
// node, maybe with further brokers) for tests and local development, from the machine's PostgreSQL
// binaries and Kafka jars from Maven Central.
package devenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is a server process. done is closed when our child exits; nil for a process found
// through a pid file.
type process struct {
	pid    int
	needle string
	done   chan struct{}
}

type spawnSpec struct {
	path, dir, logPath, needle string
	args                       []string
	cred                       *syscall.Credential
	detached                   bool
	deathSig                   syscall.Signal // sent to the server when we die, unless detached
}

func spawn(s spawnSpec) (*process, error) {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(s.path, s.args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = s.dir, logf, logf
	if s.detached {
		// New session: no controlling terminal; survives us and the shell.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: s.cred}
	} else {
		// Own group: a Ctrl-C to the test run does not hit the server first. The parent-death
		// signal stops it when a test binary is killed (go test -timeout); Go sets it after
		// setuid, which would clear it. It fires when the spawning OS thread exits, which Go
		// only does for goroutines that exit while locked to their thread.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: s.deathSig, Credential: s.cred}
	}
	waited, err := StartPinned(cmd)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(s.path), err)
	}
	done := make(chan struct{})
	go func() {
		<-waited
		close(done)
	}()
	return &process{pid: cmd.Process.Pid, needle: s.needle, done: done}, nil
}

// StartPinned starts cmd and returns a channel that receives cmd.Wait's result. A parent-death
// signal (Pdeathsig) comes when the OS thread that forked the child exits, not when the process
// does, and the Go runtime retires a thread whenever a goroutine exits locked to it (as the one
// here does): a child forked from an arbitrary thread can be killed by an unrelated goroutine's end
// (a PostgreSQL restarted by a test died silently in its first milliseconds; a relay under test
// vanished without a line). So cmd is forked from a thread locked to a goroutine that lives until
// the child has exited. Every child with a parent-death signal should be started so.
func StartPinned(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine, after the child
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return waited, nil
}

func (p *process) running() bool {
	if p == nil || p.pid <= 0 {
		return false
	}
	if p.done != nil {
		// Our own child: it runs until Wait reaped it, and its pid cannot be reused before. The
		// /proc reading below is for a process we only know by pid file; for a child it can say
		// "gone" while the process lives (a JVM's command line read mid-start), and a start then
		// spawned a second server beside the first, which kept the port: Stop found nothing to
		// stop and Pause paused the wrong process (a clean-clone run failed devenv's TestKafka so).
		select {
		case <-p.done:
			return false
		default:
			// Exited but not reaped yet (a zombie until our Wait returns): a stop through another
			// handle (AttachPostgres) saw it end, and this one must agree (a clean-clone run failed
			// devenv's TestPostgres in that instant). Its pid cannot be reused before the reaping.
			return alive(p.pid)
		}
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
	return err == nil && alive(p.pid) && strings.Contains(string(cmdline), p.needle)
}

func (p *process) signalGroup(sig syscall.Signal) error {
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to group %d: %w", sig, p.pid, err)
	}
	return nil
}

// pauseSignal sends SIGSTOP or SIGCONT to the server's process group, or to the process alone
// when it leads no group, and for SIGSTOP returns only once the process is stopped: a pause that
// paused nothing, or not yet, let a test's next request be answered (devenv's TestKafka failed in
// a clean-clone run with "paused broker answered metadata").
func (p *process) pauseSignal(sig syscall.Signal) error {
	if err := syscall.Kill(-p.pid, sig); err != nil {
		if !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal %v to group %d: %w", sig, p.pid, err)
		}
		if err := syscall.Kill(p.pid, sig); err != nil {
			return fmt.Errorf("signal %v to process %d: %w", sig, p.pid, err)
		}
	}
	if sig != syscall.SIGSTOP {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
		if err != nil {
			return fmt.Errorf("process %d after SIGSTOP: %w", p.pid, err)
		}
		// The state follows the command name's closing parenthesis: T (stopped) or t (traced).
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped 10 s after SIGSTOP (state %q)", p.pid, b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *process) waitExit(ctx context.Context, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for p.running() || p.exiting() {
		select {
		case <-p.done: // nil for foreign processes: never ready
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// exiting reports whether a process known by pid file only is in the middle of its exit: its
// command line is gone already, but it is not a zombie yet. running() calls it gone then, while a
// handle that started it still sees it alive (a clean-clone run failed devenv's TestPostgres in
// that instant: a stop through AttachPostgres returned, and the starting handle said running).
func (p *process) exiting() bool {
	if p == nil || p.pid <= 0 || p.done != nil {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
	return err == nil && len(cmdline) == 0 && alive(p.pid)
}

// kill SIGKILLs the process group and all descendants (PostgreSQL backends call setsid, so they
// are not in the postmaster's group) and waits until all are gone: a backend still attached to
// shared memory makes the next start fail.
func (p *process) kill() error {
	victims := append(descendants(p.pid), p.pid)
	_ = p.signalGroup(syscall.SIGKILL)
	for _, pid := range victims {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !p.waitExit(context.Background(), time.Until(deadline)) || slices.ContainsFunc(victims, alive) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d or its children still running after SIGKILL", p.pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// procStat returns state and ppid from /proc/<pid>/stat.
func procStat(pid int) (state string, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])) // state, ppid, ...
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0], ppid, true
}

// alive reports whether pid exists and is not a zombie. (PID 1 on this kind of machine does not
// reap orphans, so killed PostgreSQL backends can stay zombies.)
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != "Z"
}

// PIDAlive reports whether a (non-zombie) process with this pid exists.
func PIDAlive(pid int) bool { return alive(pid) }

func descendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if c, err := strconv.Atoi(e.Name()); err == nil {
			if _, ppid, ok := procStat(c); ok {
				children[ppid] = append(children[ppid], c)
			}
		}
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, children[queue[0]]...)
	}
	return out
}

// freePorts reserves n distinct free ports on 127.0.0.1; all listeners stay open until every port
// is picked so the kernel cannot hand out one twice.
func freePorts(n int) ([]int, error) { return FreePorts(n) }

// FreePorts returns n distinct TCP ports nobody listens on right now on 127.0.0.1, for servers
// that bind them later. They come from below the kernel's ephemeral range when there is room: a
// port the kernel handed out for a listen on port 0 is also a port it may hand to the next outgoing
// connection's local end, and a server started on it a moment later then fails to bind ("Address
// already in use"; seen when three test packages ran at once). Each port is claimed for the rest of
// the process (claimPort): a server stopped for a while (a broker outage of the fault tests) finds
// its port free when it starts again, not handed meanwhile to another server of this process or of
// another test process (a fault test's broker failed to restart so).
func FreePorts(n int) ([]int, error) {
	lo, hi := belowEphemeral()
	return freePortsIn(lo, hi, n)
}

// freePortsIn is FreePorts from [lo, hi), falling back to the kernel's choice when it has none left.
func freePortsIn(lo, hi, n int) ([]int, error) {
	var ports []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range n {
		var l net.Listener
		for try := 0; l == nil && try < 200 && hi > lo; try++ {
			port := lo + rand.IntN(hi-lo)
			if !claimPort(port) {
				continue
			}
			var err error
			if l, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err != nil {
				l = nil // bound by someone outside the claims; the claim keeps us off it
			}
		}
		if l == nil {
			// No room below the ephemeral range (or all of it taken): let the kernel choose.
			var err error
			if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				return nil, fmt.Errorf("reserve free port: %w", err)
			}
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// portClaims holds, for the life of the process, the files whose locks claim the ports FreePorts
// handed out. It is the one piece of package state: a claim must outlive the server it was for
// (stopped and started again on the same port), and the kernel drops the locks when the process
// ends, however it ends, so nothing needs cleaning up.
var portClaims struct {
	mu    sync.Mutex
	files []*os.File
}

// claimPort takes an exclusive lock on a file named after port in a directory every test process
// of the machine shares; false when another claim holds it (this process's or another's), or the
// file cannot be locked.
func claimPort(port int) bool {
	dir := filepath.Join(os.TempDir(), "outbox-devenv-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return false
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return false
	}
	// flock locks belong to the open file: a second open of the same file, in this process or
	// another, cannot take it while this one holds it.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	portClaims.mu.Lock()
	portClaims.files = append(portClaims.files, f)
	portClaims.mu.Unlock()
	return true
}

// FreeAddr is FreePorts' one port as a 127.0.0.1 address.
func FreeAddr() (string, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(ports[0]), nil
}

// belowEphemeral is the range of ports [lo, hi) that outgoing connections never take: from 20000 up
// to the start of the kernel's ephemeral range (net.ipv4.ip_local_port_range), empty when that
// starts lower.
func belowEphemeral() (lo, hi int) {
	const floor = 20000
	hi = 32768 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	return floor, max(hi, floor)
}

// serviceUser is who runs PostgreSQL: the OS user postgres when we are root (the server refuses
// to run as root), ourselves (nil) otherwise.
func serviceUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs the OS user postgres: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// handOver gives dir's tree to cred's user and makes every parent searchable by others (the
// postgres user must reach its data directory, e.g. below /root, which is 0700).
func handOver(dir string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	err := filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(cred.Uid), int(cred.Gid))
	})
	for p := filepath.Dir(dir); err == nil; p = filepath.Dir(p) {
		var fi os.FileInfo
		if fi, err = os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
			err = os.Chmod(p, fi.Mode().Perm()|0o001)
		}
		if p == "/" {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("hand %s over to uid %d: %w", dir, cred.Uid, err)
	}
	return nil
}

// run runs a short command (initdb, StorageTool), with its output in the error.
func run(ctx context.Context, dir string, cred *syscall.Credential, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	waited, err := StartPinned(cmd)
	if err == nil {
		err = <-waited
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out.Bytes())
	}
	return nil
}

const stateFile = "devenv.json"

// newDir returns dir as an absolute path (created if needed) or a fresh temp dir; it fails when
// dir already holds an instance.
func newDir(dir, tempPrefix string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", tempPrefix)
	}
	dir, err := filepath.Abs(dir)
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if _, serr := os.Stat(filepath.Join(dir, stateFile)); err == nil && serr == nil {
		err = fmt.Errorf("%s already holds an instance (attach to it instead)", dir)
	}
	return dir, err
}

func writeState(dir string, v any) error {
	b, _ := json.MarshalIndent(v, "", "  ")
	return os.WriteFile(filepath.Join(dir, stateFile), append(b, '\n'), 0o644)
}

// readState loads the state of an instance in dir; the error wraps fs.ErrNotExist when there is
// none.
func readState(dir string, v any) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return "", fmt.Errorf("no devenv instance in %s: %w", dir, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return "", fmt.Errorf("read %s: %w", filepath.Join(dir, stateFile), err)
	}
	return dir, nil
}

// LogTail returns the last n lines of a log file, for error messages.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// renderSettings merges extra into base and renders one format(key, value) line per key, sorted.
func renderSettings(base, extra map[string]string, format func(k, v string) string) (string, error) {
	for k, v := range extra {
		if k == "" || strings.ContainsAny(k+v, "\n\r") {
			return "", fmt.Errorf("invalid setting %q=%q", k, v)
		}
		base[k] = v
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(base)) {
		b.WriteString(format(k, base[k]) + "\n")
	}
	return b.String(), nil
}
