package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotSeparable means InvalidateSlot could not put the slot alone behind every other slot by
// two WAL segments within its wait: another slot is held back as well (its relay cut off or
// paused by another fault), and max_slot_wal_keep_size would invalidate it too. Nothing was
// invalidated; the runner skips the fault.
var ErrNotSeparable = errors.New("another slot is as far behind as the one to invalidate")

// separateTimeout bounds InvalidateSlot's wait for the other slots to move two segments past the
// target: they move when their relays confirm past a running-transactions record, seconds.
const separateTimeout = 30 * time.Second

// RecoveryReady returns nil when database's slot ledger (public.outbox_relay_slots) holds a
// horizon for slot and no recovery of it is under way: what a lost slot's recovery needs to bound
// its gap. Else an error wrapping ErrNoHorizon.
func (c *Cluster) RecoveryReady(ctx context.Context, database, slot string) error {
	conn, err := pgx.Connect(ctx, c.Primary().DSN(database))
	if err != nil {
		return fmt.Errorf("cluster: slot ledger of %s: %w", slot, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return ledgerReady(ctx, conn, slot)
}

func ledgerReady(ctx context.Context, conn *pgx.Conn, slot string) error {
	var ready bool
	err := conn.QueryRow(ctx, `SELECT confirmed_xmin IS NOT NULL AND recovery_since IS NULL FROM public.outbox_relay_slots WHERE slot = $1`, slot).Scan(&ready)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("cluster: read the slot ledger of %s: %w", slot, err)
	}
	if !ready {
		return fmt.Errorf("%w (slot %s)", ErrNoHorizon, slot)
	}
	return nil
}

// InvalidateSlot makes PostgreSQL itself invalidate database's logical slot as an operator's
// max_slot_wal_keep_size does (wal_status 'lost', invalidation_reason 'wal_removed'): it
// switches WAL segments until the slot, whose relays the caller has cut off, trails every other
// slot (the standby's and the other modes') by two segments or more, then sets
// max_slot_wal_keep_size (ALTER SYSTEM and a reload) to keep everything but the slot's segment,
// runs CHECKPOINTs until the slot is lost, and resets the setting, also on an error. Two
// segments, not one, leave room for the WAL written between the setting and the checkpoint. It
// returns when the slot was seen lost; ErrNotSeparable (nothing changed) when the other slots did
// not move ahead within 30 s.
func (c *Cluster) InvalidateSlot(ctx context.Context, database, slot string) (time.Time, error) {
	c.pgOps.Lock()
	defer c.pgOps.Unlock()
	primary := c.Primary()
	conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
	if err != nil {
		return time.Time{}, fmt.Errorf("cluster invalidate slot %s: %w", slot, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var segment int64
	if err := conn.QueryRow(ctx, "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'").Scan(&segment); err != nil {
		return time.Time{}, fmt.Errorf("cluster invalidate slot %s: wal_segment_size: %w", slot, err)
	}
	sctx, cancel := context.WithTimeout(ctx, separateTimeout)
	defer cancel()
	var target, others, current int64
	err = poll(sctx, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		if err := conn.QueryRow(ctx, `SELECT
			coalesce((SELECT (restart_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1 AND database = $2 AND wal_status <> 'lost'), -1),
			coalesce((SELECT min(restart_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name <> $1 AND restart_lsn IS NOT NULL AND wal_status <> 'lost'), -1),
			(pg_current_wal_lsn() - '0/0')::bigint`, slot, database).Scan(&target, &others, &current); err != nil {
			return false, err
		}
		if target < 0 {
			return false, fmt.Errorf("no slot %s of database %s with WAL to lose", slot, database)
		}
		seg := func(lsn int64) int64 { return lsn / segment }
		if (others < 0 || seg(others) >= seg(target)+2) && seg(current) >= seg(target)+2 {
			return true, nil
		}
		// A switch needs a record since the last one; the running-transactions record is also what
		// lets the other slots' restart_lsn move once their relays confirm.
		_, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, 'chaos-invalidate', ''), pg_switch_wal(), pg_log_standby_snapshot()")
		return false, err
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return time.Time{}, fmt.Errorf("cluster invalidate slot %s: %w", slot, err)
	case err != nil && target < 0:
		return time.Time{}, fmt.Errorf("cluster invalidate slot %s: %w", slot, err)
	case err != nil:
		return time.Time{}, fmt.Errorf("cluster invalidate slot %s: %w within %v: its restart_lsn in segment %d, another slot's in %d, WAL in %d (%v)",
			slot, ErrNotSeparable, separateTimeout, target/segment, others/segment, current/segment, err)
	}

	// Everything from the segment after the slot's is kept; the slot's own segment goes.
	keepMB := (current/segment - target/segment - 1) * (segment >> 20)
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := setSetting(rctx, conn, "max_slot_wal_keep_size", ""); rerr != nil {
			c.logf("invalidate slot %s: %v", slot, rerr)
		}
	}()
	if err := setSetting(ctx, conn, "max_slot_wal_keep_size", strconv.FormatInt(keepMB, 10)+"MB"); err != nil {
		return time.Time{}, fmt.Errorf("cluster invalidate slot %s: %w", slot, err)
	}
	var lost time.Time
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = poll(lctx, 300*time.Millisecond, func(ctx context.Context) (bool, error) {
		// The checkpointer reads the reloaded setting at its next wait: a checkpoint requested at
		// once may still use the old one, and the next does not.
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			return false, err
		}
		var status string
		if err := conn.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1 AND database = $2", slot, database).Scan(&status); err != nil {
			return false, err
		}
		lost = time.Now()
		return status == "lost", nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("cluster invalidate slot %s: not lost with max_slot_wal_keep_size = %dMB: %w", slot, keepMB, err)
	}
	c.logf("slot %s of %s invalidated by max_slot_wal_keep_size = %dMB", slot, database, keepMB)
	return lost, nil
}

// setSetting sets a reloadable setting with ALTER SYSTEM (RESET for an empty value) and reloads.
func setSetting(ctx context.Context, conn *pgx.Conn, name, value string) error {
	sql := "ALTER SYSTEM RESET " + name
	if value != "" {
		sql = fmt.Sprintf("ALTER SYSTEM SET %s = '%s'", name, value)
	}
	// One statement each: ALTER SYSTEM refuses to run in the implicit transaction of several.
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("reload after %s: %w", sql, err)
	}
	return nil
}

// StopStandby stops the standby (fast shutdown): while it is away the primary's walsenders of
// failover slots wait for it when synchronized_standby_slots lists its slot (SetSynchronized),
// and a poller that waits for the standby waits too. StartStandby brings it back.
func (c *Cluster) StopStandby(ctx context.Context) error {
	c.pgOps.Lock()
	defer c.pgOps.Unlock()
	s := c.Standby()
	if s == nil {
		return errors.New("cluster: no standby to stop")
	}
	if err := s.Stop(ctx); err != nil {
		return fmt.Errorf("cluster: stop the standby: %w", err)
	}
	c.logf("standby %s stopped", filepath.Base(s.Dir()))
	return nil
}

// StartStandby starts the standby StopStandby stopped and waits until it streams again.
func (c *Cluster) StartStandby(ctx context.Context) error {
	c.pgOps.Lock()
	defer c.pgOps.Unlock()
	c.mu.Lock()
	s, slot, primary := c.standby, c.standbySlot, c.primary
	c.mu.Unlock()
	if s == nil {
		return errors.New("cluster: no standby to start")
	}
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("cluster: start the standby: %w", err)
	}
	if err := waitStreaming(ctx, primary, slot); err != nil {
		return fmt.Errorf("cluster: the restarted standby does not stream: %w", err)
	}
	c.logf("standby %s started and streams", filepath.Base(s.Dir()))
	return nil
}

// DelayStandby sets the standby's recovery_min_apply_delay (0 resets it): it receives and
// flushes WAL at once but replays each commit that much later, so its slot copies and what a
// failover would find lag behind.
func (c *Cluster) DelayStandby(ctx context.Context, delay time.Duration) error {
	c.pgOps.Lock()
	defer c.pgOps.Unlock()
	s := c.Standby()
	if s == nil {
		return errors.New("cluster: no standby to delay")
	}
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("cluster: delay the standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	value := ""
	if delay > 0 {
		value = strconv.FormatInt(delay.Milliseconds(), 10) + "ms"
	}
	if err := setSetting(ctx, conn, "recovery_min_apply_delay", value); err != nil {
		return fmt.Errorf("cluster: delay the standby: %w", err)
	}
	c.logf("standby %s: recovery_min_apply_delay = '%s'", filepath.Base(s.Dir()), value)
	return nil
}

// FreezePrimary stops the primary's postmaster and every process it started (SIGSTOP): its
// connections stay open and accept bytes, and nothing answers, as on a host that hangs.
// ThawPrimary continues them. The postmaster stops first, so that it forks nothing the second
// look misses.
func (c *Cluster) FreezePrimary() error { return signalServer(c.Primary().Dir(), syscall.SIGSTOP) }

// ThawPrimary ends FreezePrimary (SIGCONT), the children first.
func (c *Cluster) ThawPrimary() error { return signalServer(c.Primary().Dir(), syscall.SIGCONT) }

// signalServer sends sig to the postmaster of the server in dir and to all its descendants.
func signalServer(dir string, sig syscall.Signal) error {
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("cluster: the postmaster of %s: %w", filepath.Base(dir), err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return fmt.Errorf("cluster: the postmaster of %s: %w", filepath.Base(dir), err)
	}
	send := func(p int) error {
		if err := syscall.Kill(p, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("cluster: %v to %d of %s: %w", sig, p, filepath.Base(dir), err)
		}
		return nil
	}
	if sig == syscall.SIGSTOP {
		if err := send(pid); err != nil {
			return err
		}
	}
	for _, child := range descendants(pid) {
		if err := send(child); err != nil {
			return err
		}
	}
	if sig != syscall.SIGSTOP {
		return send(pid)
	}
	return nil
}

// descendants lists pid's children, their children, and so on, from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])) // state, ppid, ...
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], p)
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, children[queue[0]]...)
	}
	return out
}
