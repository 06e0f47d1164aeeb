package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// service is what Postgres and Kafka share: a directory with a state file, a log, and one
// server process that leads its own process group.
type service struct {
	name     string
	dir      string
	pidFile  string // first line: the server's pid
	writePid bool   // we write pidFile (Kafka) rather than the server (PostgreSQL)
	needle   string // expected in the server's command line (guards against pid reuse)
	detached bool
	keep     bool

	mu   sync.Mutex
	proc *process // set when we started the server ourselves
}

// Dir returns the instance directory.
func (s *service) Dir() string { return s.dir }

// Logs returns the path of the server log (its stdout and stderr).
func (s *service) Logs() string { return filepath.Join(s.dir, s.name+".log") }

// current returns the running server, our child or found through the pid file, or nil.
func (s *service) current() *process {
	if s.proc.running() {
		return s.proc
	}
	b, _ := os.ReadFile(s.pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if p := (&process{pid: pid, needle: s.needle}); p.running() {
		return p
	}
	return nil
}

// Running reports whether the server process runs.
func (s *service) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current() != nil
}

// start spawns the server unless it runs and polls ready until it succeeds, a server that exits
// aside, for as long as ctx allows; timeout bounds it only when ctx has no deadline. The caller
// knows how loaded the machine may be (a test binary's start of a broker waits 4 minutes, since
// packages run side by side): a fixed bound below its own failed starts that were progressing.
// Call with s.mu held.
func (s *service) start(ctx context.Context, spec spawnSpec, timeout time.Duration, ready func(context.Context) error) error {
	if s.current() != nil {
		return nil
	}
	spec.detached, spec.needle, spec.logPath = s.detached, s.needle, s.Logs()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var p *process
	respawn := func() error {
		var err error
		if p, err = spawn(spec); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		s.proc = p
		if s.writePid {
			if err := os.WriteFile(s.pidFile, []byte(strconv.Itoa(p.pid)+"\n"), 0o644); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
		return nil
	}
	if err := respawn(); err != nil {
		return err
	}
	for spawns := 1; ; {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		if !p.running() {
			// Once more, twice at most: a server stopped a moment ago may still hold what its
			// successor needs (its shared memory, its port).
			if spawns < 3 && ctx.Err() == nil {
				spawns++
				select {
				case <-ctx.Done():
					return fmt.Errorf("%s exited during start and was not started again: %w; log %s:\n%s", s.name, ctx.Err(), s.Logs(), LogTail(s.Logs(), 30))
				case <-time.After(500 * time.Millisecond):
				}
				if err := respawn(); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("%s exited during start (%d tries); log %s:\n%s", s.name, spawns, s.Logs(), LogTail(s.Logs(), 30))
		}
		select {
		case <-ctx.Done():
			_ = p.kill()
			return fmt.Errorf("%s not ready: %w (last error: %v); log %s:\n%s", s.name, ctx.Err(), err, s.Logs(), LogTail(s.Logs(), 30))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop sends sig to the server, then SIGKILL after grace.
func (s *service) stop(ctx context.Context, sig syscall.Signal, grace time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.current()
	if p == nil {
		return nil
	}
	_ = p.signalGroup(syscall.SIGCONT) // a paused server would not act on sig
	if err := syscall.Kill(p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%s stop: %w", s.name, err)
	}
	if !p.waitExit(ctx, grace) {
		if err := p.kill(); err != nil {
			return fmt.Errorf("%s stop: %w", s.name, err)
		}
	}
	return nil
}

// Kill SIGKILLs the server and its children, like a machine crash; Start then recovers.
func (s *service) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.current(); p != nil {
		if err := p.kill(); err != nil {
			return fmt.Errorf("%s kill: %w", s.name, err)
		}
	}
	return nil
}

// close runs stop and then, unless keep, removes dir and extra; files of a server that could not
// be stopped stay.
func (s *service) close(stop func() error, extra ...string) error {
	if err := stop(); err != nil || s.keep {
		return err
	}
	var errs []error
	for _, path := range append(extra, s.dir) {
		errs = append(errs, os.RemoveAll(path))
	}
	return errors.Join(errs...)
}
