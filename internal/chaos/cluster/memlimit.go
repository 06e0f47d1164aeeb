package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNoCgroup means the machine offers no memory cgroup this process may make a child of (no
// cgroup v1 memory controller, or no right to write it): a memory limit cannot be applied, and the
// nemesis falls back on the checker's RSS rule.
var ErrNoCgroup = errors.New("no writable cgroup v1 memory controller")

// memoryRoot is where cgroup v1 mounts its memory controller.
const memoryRoot = "/sys/fs/cgroup/memory"

// MemoryCgroup is a child of this process's cgroup v1 memory cgroup: a process moved into it is
// OOM-killed by the kernel when its memory passes the limit, as a container's is.
type MemoryCgroup struct {
	dir    string
	parent string
}

// NewMemoryCgroup creates the child cgroup name (letters, digits, '-' and '_') of this process's
// memory cgroup, without a limit yet. Close removes it.
func NewMemoryCgroup(name string) (*MemoryCgroup, error) {
	if !clientName.MatchString(name) {
		return nil, fmt.Errorf("cluster: cgroup name %q: want letters, digits, '_' and '-'", name)
	}
	own, err := ownMemoryCgroup()
	if err != nil {
		return nil, err
	}
	parent := filepath.Join(memoryRoot, own)
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCgroup, err)
	}
	g := &MemoryCgroup{dir: dir, parent: parent}
	// The pages a process already has move with it, so that the limit counts them.
	_ = g.write("memory.move_charge_at_immigrate", "3")
	return g, nil
}

// ownMemoryCgroup reads this process's memory cgroup path from /proc/self/cgroup.
func ownMemoryCgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoCgroup, err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ",memory,") {
			return parts[2], nil
		}
	}
	return "", fmt.Errorf("%w: /proc/self/cgroup names no memory controller (cgroup v2 only?)", ErrNoCgroup)
}

func (g *MemoryCgroup) write(file, value string) error {
	if err := os.WriteFile(filepath.Join(g.dir, file), []byte(value), 0o644); err != nil {
		return fmt.Errorf("cluster: cgroup %s: write %s: %w", filepath.Base(g.dir), file, err)
	}
	return nil
}

func (g *MemoryCgroup) read(file string) (string, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, file))
	if err != nil {
		return "", fmt.Errorf("cluster: cgroup %s: read %s: %w", filepath.Base(g.dir), file, err)
	}
	return string(b), nil
}

// Add moves pid into the cgroup.
func (g *MemoryCgroup) Add(pid int) error { return g.write("cgroup.procs", strconv.Itoa(pid)) }

// Limit sets memory.limit_in_bytes; -1 lifts it. The kernel refuses (EBUSY) a limit below what
// it cannot reclaim.
func (g *MemoryCgroup) Limit(bytes int64) error {
	return g.write("memory.limit_in_bytes", strconv.FormatInt(bytes, 10))
}

// Usage returns memory.usage_in_bytes.
func (g *MemoryCgroup) Usage() (int64, error) {
	s, err := g.read("memory.usage_in_bytes")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(s), 10, 64)
}

// OOMKills returns how many processes the kernel killed for the cgroup's limit (oom_kill in
// memory.oom_control).
func (g *MemoryCgroup) OOMKills() (int, error) {
	s, err := g.read("memory.oom_control")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("cluster: cgroup %s: memory.oom_control has no oom_kill line (kernel older than 4.13)", filepath.Base(g.dir))
}

// Close lifts the limit, moves the processes still inside back to the parent cgroup and removes
// the cgroup.
func (g *MemoryCgroup) Close() error {
	_ = g.Limit(-1)
	procs, _ := g.read("cgroup.procs")
	var errs []error
	for _, pid := range strings.Fields(procs) {
		if err := os.WriteFile(filepath.Join(g.parent, "cgroup.procs"), []byte(pid), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cluster: move %s out of cgroup %s: %w", pid, filepath.Base(g.dir), err))
		}
	}
	if err := os.Remove(g.dir); err != nil {
		errs = append(errs, fmt.Errorf("cluster: remove cgroup %s: %w", filepath.Base(g.dir), err))
	}
	return errors.Join(errs...)
}
