package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100 on every Linux
// architecture Go supports (the kernel fixes it for the user ABI).
const clockTicks = 100

// runner is a side while it runs: a child process, or the relay inside this process when profiling.
type runner interface {
	usage() (cpu time.Duration, peakRSS int64, err error)
	exited() bool
	failure() error // why it ended early, with the tail of its log
	logTail() string
	startedAt() time.Time
	stop(grace time.Duration)
}

// child is one measured process (pg_recvlogical, the relay, a Kafka Connect JVM). Its output goes
// to a log file so a failure can show the tail.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	started time.Time
	done    chan struct{}
	err     error
}

// startChild starts name with args and extra environment entries. The process gets a parent-death
// signal so an interrupted bench leaves nothing running.
func startChild(name, logPath string, env []string, path string, args ...string) (*child, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = filepath.Dir(logPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	c.started = time.Now()
	waited, err := devenv.StartPinned(cmd) // the death signal follows the forking thread
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { c.err = <-waited; close(c.done) }()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) startedAt() time.Time { return c.started }

func (c *child) logTail() string {
	return fmt.Sprintf("%s log %s:\n%s", c.name, c.logPath, devenv.LogTail(c.logPath, 25))
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// usage is CPU (user+sys) and peak RSS: from /proc while the process runs, from its rusage once it
// has exited.
func (c *child) usage() (cpu time.Duration, peakRSS int64, err error) {
	if c.exited() {
		ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage)
		if !ok {
			return 0, 0, fmt.Errorf("%s: no rusage", c.name)
		}
		cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		return cpu, ru.Maxrss * 1024, nil
	}
	return procUsage(c.pid())
}

// procUsage reads utime+stime from /proc/<pid>/stat and VmHWM (the peak resident set) from
// /proc/<pid>/status.
func procUsage(pid int) (cpu time.Duration, peakRSS int64, err error) {
	cpu, err = procCPU(pid)
	if err != nil {
		return 0, 0, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("pid %d VmHWM %q: %w", pid, rest, err)
			}
			return cpu, kb * 1024, nil
		}
	}
	return 0, 0, fmt.Errorf("pid %d: no VmHWM in /proc status", pid)
}

// procCPU reads utime+stime of a process (all its threads) from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return ticks(pid, f, 11, 12) // fields 14 and 15 of stat(5)
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the process to be gone.
func (c *child) stop(grace time.Duration) {
	if c.exited() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-c.pid(), syscall.SIGKILL)
	_ = c.cmd.Process.Kill()
	<-c.done
}

// failure describes an early exit with the tail of the log.
func (c *child) failure() error {
	return fmt.Errorf("%s exited early (%v); log %s:\n%s", c.name, c.err, c.logPath, devenv.LogTail(c.logPath, 25))
}

// postmasterOf is the postmaster of the server pool's sessions run on: the parent of a backend.
func postmasterOf(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, fmt.Errorf("find the postmaster: %w", err)
	}
	ppid, err := procParent(backend)
	if err != nil {
		return 0, fmt.Errorf("find the postmaster of backend %d: %w", backend, err)
	}
	return ppid, nil
}

// statFields are the fields of /proc/<pid>/stat after the command name: state is [0], ppid [1],
// utime [11], stime [12], cutime [13], cstime [14].
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// The command name may hold spaces; the fields after the last ')' are state, ppid, ...
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("pid %d: malformed stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return nil, fmt.Errorf("pid %d: short stat", pid)
	}
	return f, nil
}

func procParent(pid int) (int, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}

// ticks sums the clock-tick fields of a stat line.
func ticks(pid int, f []string, fields ...int) (time.Duration, error) {
	var sum int64
	for _, i := range fields {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("pid %d: stat field %q: %w", pid, f[i], err)
		}
		sum += n
	}
	return time.Duration(sum) * time.Second / clockTicks, nil
}

// clusterCPU is the CPU time (user+sys) a PostgreSQL server has spent so far: its postmaster's,
// every live child's (walsenders, backends, the background processes) and, through the
// postmaster's cutime and cstime, every child's that has exited and been reaped. The difference
// of two readings is what the server spent between them, children that came and went included.
func clusterCPU(postmaster int) (time.Duration, error) {
	f, err := statFields(postmaster)
	if err != nil {
		return 0, err
	}
	total, err := ticks(postmaster, f, 11, 12, 13, 14)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		f, err := statFields(pid)
		if err != nil || f[1] != strconv.Itoa(postmaster) {
			continue // gone meanwhile, or not a child
		}
		cpu, err := ticks(pid, f, 11, 12)
		if err != nil {
			return 0, err
		}
		total += cpu
	}
	return total, nil
}
