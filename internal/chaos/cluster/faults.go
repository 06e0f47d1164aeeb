package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// CutPostgres partitions client from PostgreSQL silently: its proxies (the leader lock's too)
// forward nothing and close nothing, and its new connections hang.
func (c *Cluster) CutPostgres(client string) {
	for _, p := range c.paths(client).postgres() {
		p.Cut()
	}
}

// HealPostgres ends CutPostgres and CutPostgresReplies: the connections held are closed (the
// peers see a reset) and new ones are forwarded.
func (c *Cluster) HealPostgres(client string) {
	for _, p := range c.paths(client).postgres() {
		p.Heal()
	}
}

// CutKafka partitions client from every broker as CutPostgres does from PostgreSQL.
func (c *Cluster) CutKafka(client string) {
	for _, p := range c.paths(client).kafka {
		p.Cut()
	}
}

// HealKafka ends CutKafka and CutKafkaReplies.
func (c *Cluster) HealKafka(client string) {
	for _, p := range c.paths(client).kafka {
		p.Heal()
	}
}

// StopBroker stops node 1 (SIGTERM: a controlled shutdown; SIGKILL after 30s).
func (c *Cluster) StopBroker(ctx context.Context) error { return c.kafka.Stop(ctx) }

// StartBroker starts the stopped node 1 on the same ports and data and waits until it serves.
func (c *Cluster) StartBroker(ctx context.Context) error { return c.kafka.Start(ctx) }

// PauseBroker freezes node 1 (SIGSTOP): connections are accepted, nothing answers.
func (c *Cluster) PauseBroker() error { return c.kafka.Pause() }

// ResumeBroker continues a paused node 1 (SIGCONT).
func (c *Cluster) ResumeBroker() error { return c.kafka.Resume() }

// RestartPostgres restarts the primary as pg_ctl restart -m fast (immediate false) or -m
// immediate (no shutdown checkpoint: crash recovery at the start) does, and returns once it
// accepts connections again. The standby reconnects by itself.
func (c *Cluster) RestartPostgres(ctx context.Context, immediate bool) error {
	c.pgOps.Lock()
	defer c.pgOps.Unlock()
	p := c.Primary()
	stop, mode := p.Stop, "fast"
	if immediate {
		stop, mode = p.StopImmediate, "immediate"
	}
	if err := stop(ctx); err != nil {
		return fmt.Errorf("cluster restart (%s): %w", mode, err)
	}
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("cluster restart (%s): %w", mode, err)
	}
	return nil
}

// ErrNotReady means a failover was not made because the standby was not ready for it within
// 30 s: a copy of a failover slot not persisted yet, or replay too far behind. Nothing was
// changed; the runner skips the fault.
var ErrNotReady = errors.New("standby not ready for a failover")

const (
	// defaultReadyTimeout bounds Failover's wait for the standby: a copy stays temporary until the
	// primary's slot passes the standby's catalog xmin, which needs the relay to confirm and a
	// running-transactions record, seconds under load.
	defaultReadyTimeout = 30 * time.Second
	// maxReplayLag is how far the standby's replay may trail the primary's WAL at the kill: a
	// failover of a standby far behind tests a lag, not the slots.
	maxReplayLag = 4 << 20
	// streamTimeout bounds the wait for a new standby to stream from its slot.
	streamTimeout = time.Minute
)

// FailoverResult says when a failover's steps ended.
type FailoverResult struct {
	// SynchronizedSince is when the killed primary's synchronized_standby_slots got its value
	// (listing the standby's slot or empty); it matters for what the relays streamed after it.
	SynchronizedSince time.Time
	Killed            time.Time // the old primary was SIGKILLed (no shutdown)
	Promoted          time.Time // the standby accepted writes
	NewStandbyReady   time.Time // the next standby streamed from the new primary; zero if Failover failed before
}

// SetSynchronized lists the standby's physical slot in the primary's synchronized_standby_slots
// (on), or empties it (off), with ALTER SYSTEM and a reload. The setting protects what the
// primary's walsenders send from then on, so a runner that wants a failover of one kind sets it
// well before, when the standby is built: Failover builds every next standby with the kind of the
// failover that made it, and sets the kind itself, late, when asked for the other one.
func (c *Cluster) SetSynchronized(ctx context.Context, on bool) error {
	c.pgOps.Lock()
	defer c.pgOps.Unlock()
	return c.setSynchronized(ctx, on)
}

func (c *Cluster) setSynchronized(ctx context.Context, on bool) error {
	c.mu.Lock()
	primary, slot := c.primary, c.standbySlot
	c.mu.Unlock()
	if c.Standby() == nil {
		return errors.New("cluster: no standby to synchronise with")
	}
	if !on {
		slot = ""
	}
	if err := setStandbySlots(ctx, primary, slot); err != nil {
		return err
	}
	c.mu.Lock()
	c.synchronized, c.syncSince = on, time.Now()
	c.mu.Unlock()
	c.logf("primary %s: synchronized_standby_slots = '%s'", filepath.Base(primary.Dir()), slot)
	return nil
}

func setStandbySlots(ctx context.Context, primary *devenv.Postgres, slots string) error {
	// One statement each: ALTER SYSTEM refuses to run in the implicit transaction of several.
	err := primary.Exec(ctx, "postgres", fmt.Sprintf("ALTER SYSTEM SET synchronized_standby_slots = '%s'", slots))
	if err == nil {
		err = primary.Exec(ctx, "postgres", "SELECT pg_reload_conf()")
	}
	if err != nil {
		return fmt.Errorf("cluster: set synchronized_standby_slots: %w", err)
	}
	return nil
}

// Failover kills the primary (SIGKILL, no shutdown) and promotes the standby; the old primary's
// data directory is discarded (its log kept as Dir/<name>-killed.log), so it never comes back.
// A new standby is then copied online from the new primary, with a physical slot of its own, on
// the old primary's port: DSN and ClientDSN keep their two ports, and a later failover can
// follow. synchronized says whether the primary's synchronized_standby_slots lists the standby's
// slot at the kill (see SetSynchronized); the new standby gets the same.
//
// Before the kill it waits, 30 s at most, until the standby holds a persisted synced copy
// of every failover slot on the primary and its replay trails by maxReplayLag at most; else it
// returns an error wrapping ErrNotReady and does not fail over. It returns once the new standby
// streams (seconds), or with the step that failed.
func (c *Cluster) Failover(ctx context.Context, synchronized bool) (FailoverResult, error) {
	c.pgOps.Lock()
	defer c.pgOps.Unlock()
	var res FailoverResult
	c.mu.Lock()
	old, standby, since, current := c.primary, c.standby, c.syncSince, c.synchronized
	c.mu.Unlock()
	if standby == nil {
		return res, errors.New("cluster failover: no standby")
	}
	if synchronized != current || since.IsZero() {
		if err := c.setSynchronized(ctx, synchronized); err != nil {
			return res, err
		}
		c.mu.Lock()
		since = c.syncSince
		c.mu.Unlock()
	}
	res.SynchronizedSince = since
	if err := waitReady(ctx, old, standby, c.readyTimeout); err != nil {
		return res, fmt.Errorf("cluster failover: %w", err)
	}

	if err := old.Kill(); err != nil {
		return res, fmt.Errorf("cluster failover: kill the primary: %w", err)
	}
	res.Killed = time.Now()
	// From here the standby is the primary, whatever fails next: Close stops both.
	c.mu.Lock()
	c.primary, c.standby, c.standbySlot = standby, nil, ""
	c.retired = append(c.retired, old)
	c.mu.Unlock()
	oldName, newName := filepath.Base(old.Dir()), filepath.Base(standby.Dir())
	if err := standby.Promote(ctx); err != nil {
		return res, fmt.Errorf("cluster failover: promote %s: %w (the old primary %s is dead and kept)", newName, err, oldName)
	}
	res.Promoted = time.Now()
	c.logf("failover: %s killed, %s promoted in %v", oldName, newName, res.Promoted.Sub(res.Killed).Round(time.Millisecond))
	// A copied synchronized_standby_slots would name a slot the new primary lacks, and its
	// walsenders would wait for it: empty until the next standby streams.
	if err := setStandbySlots(ctx, standby, ""); err != nil {
		return res, fmt.Errorf("cluster failover: %w", err)
	}
	_ = os.Rename(old.Logs(), filepath.Join(c.dir, oldName+"-killed.log"))
	if err := old.Close(ctx); err != nil {
		return res, fmt.Errorf("cluster failover: discard %s: %w", oldName, err)
	}
	c.mu.Lock()
	c.retired = slices.DeleteFunc(c.retired, func(p *devenv.Postgres) bool { return p == old })
	c.mu.Unlock()

	next, slot, err := c.buildStandby(ctx, standby, old.Port())
	if err != nil {
		return res, fmt.Errorf("cluster failover: %w", err)
	}
	c.mu.Lock()
	c.standby, c.standbySlot = next, slot
	c.mu.Unlock()
	if err := c.setSynchronized(ctx, synchronized); err != nil {
		return res, fmt.Errorf("cluster failover: %w", err)
	}
	res.NewStandbyReady = time.Now()
	c.logf("failover: new standby %s streams on port %d, %v after the promotion", filepath.Base(next.Dir()), next.Port(),
		res.NewStandbyReady.Sub(res.Promoted).Round(time.Millisecond))
	return res, nil
}

// buildStandby copies primary online into a new standby on port (0: a free one) that streams
// from a physical slot of its own and synchronises failover slots; it returns once the standby
// streams.
func (c *Cluster) buildStandby(ctx context.Context, primary *devenv.Postgres, port int) (*devenv.Postgres, string, error) {
	start := time.Now()
	dir := c.nextDir()
	slot := "standby_" + filepath.Base(dir)
	// The slot reserves WAL from now on: the online copy streams it from before its start.
	if err := primary.Exec(ctx, "postgres", fmt.Sprintf("SELECT pg_create_physical_replication_slot('%s', true)", slot)); err != nil {
		return nil, "", fmt.Errorf("standby slot: %w", err)
	}
	standby, err := devenv.StartStandbyOnline(ctx, primary, devenv.PostgresOptions{Dir: dir, Port: port, Settings: map[string]string{
		"primary_slot_name": slot, "hot_standby_feedback": "on", "sync_replication_slots": "on",
		// Back to streaming within a second of a primary's restart, not five: while a listed
		// standby is away, the relays' walsenders wait.
		"wal_retrieve_retry_interval": "1s"}})
	if err == nil {
		if err = waitStreaming(ctx, primary, slot); err != nil {
			err = errors.Join(err, standby.Close(context.WithoutCancel(ctx)))
		}
	}
	if err != nil {
		// A slot nobody streams from would hold WAL for ever.
		return nil, "", errors.Join(fmt.Errorf("standby %s: %w", filepath.Base(dir), err),
			primary.Exec(context.WithoutCancel(ctx), "postgres", fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", slot)))
	}
	c.logf("standby %s of %s on port %d streams, built in %v", filepath.Base(dir), filepath.Base(primary.Dir()), standby.Port(),
		time.Since(start).Round(time.Millisecond))
	return standby, slot, nil
}

// waitStreaming waits until a walsender streams from slot on primary.
func waitStreaming(ctx context.Context, primary *devenv.Postgres, slot string) error {
	ctx, cancel := context.WithTimeout(ctx, streamTimeout)
	defer cancel()
	return poll(ctx, 100*time.Millisecond, func(ctx context.Context) (bool, error) {
		conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
		if err != nil {
			return false, err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var active bool
		err = conn.QueryRow(ctx, "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		return active, err
	})
}

// waitReady waits, timeout at most, until standby holds a persisted synced copy of every
// failover slot of primary and replays within maxReplayLag of primary's WAL. It logs a
// running-transactions record on primary at each look, which is what lets a standby persist a copy
// once the primary's slot has passed its catalog xmin; it never moves a slot.
func waitReady(ctx context.Context, primary, standby *devenv.Postgres, timeout time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var missing []string
	var lag int64
	err := poll(rctx, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		p, err := pgx.Connect(ctx, primary.DSN("postgres"))
		if err != nil {
			return false, err
		}
		defer p.Close(context.WithoutCancel(ctx))
		s, err := pgx.Connect(ctx, standby.DSN("postgres"))
		if err != nil {
			return false, err
		}
		defer s.Close(context.WithoutCancel(ctx))
		var failover []string
		var end int64
		if err := p.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint, coalesce(
			(SELECT array_agg(slot_name::text) FROM pg_replication_slots WHERE failover AND slot_type = 'logical'), '{}'),
			pg_log_standby_snapshot()`).Scan(&end, &failover, nil); err != nil {
			return false, err
		}
		var persisted []string
		var replay int64
		if err := s.QueryRow(ctx, `SELECT coalesce((pg_last_wal_replay_lsn() - '0/0')::bigint, 0), coalesce(
			(SELECT array_agg(slot_name::text) FROM pg_replication_slots WHERE synced AND NOT temporary), '{}')`).Scan(&replay, &persisted); err != nil {
			return false, err
		}
		missing = slices.DeleteFunc(failover, func(s string) bool { return slices.Contains(persisted, s) })
		lag = end - replay
		return len(missing) == 0 && lag <= maxReplayLag, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		return fmt.Errorf("%w within %v: copies of %v not persisted on %s, its replay %d bytes behind (%v)",
			ErrNotReady, timeout, missing, filepath.Base(standby.Dir()), lag, err)
	}
}

// poll calls check every interval until it reports done or ctx ends; the error then names the
// last check's error, if any.
func poll(ctx context.Context, interval time.Duration, check func(context.Context) (bool, error)) error {
	for {
		done, err := check(ctx)
		if done && err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
			}
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// ErrNoHorizon means LoseSlot found nothing that a recovery could bound the slot's gap by: no
// horizon in the slot ledger yet (a relay records one seconds after it streams), or a recovery of
// the slot still under way. Nothing was changed.
var ErrNoHorizon = errors.New("the slot ledger records no horizon to recover from")

// LoseSlot loses database's logical slot under the relay that streams it: it ends the slot's
// walsender and drops the slot at once, in the moment before the relay reconnects; an attempt that
// lost the race with the reconnection is made again from the termination, for 30 s at most. It
// returns when the successful attempt began: what committed before may have been streamed, what
// committed after is the gap's or the next slot's. It first requires the relay's slot ledger
// (public.outbox_relay_slots) to hold a horizon and no recovery under way, else ErrNoHorizon.
func (c *Cluster) LoseSlot(ctx context.Context, database, slot string) (time.Time, error) {
	conn, err := pgx.Connect(ctx, c.Primary().DSN(database))
	if err != nil {
		return time.Time{}, fmt.Errorf("cluster lose slot %s: %w", slot, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := ledgerReady(ctx, conn, slot); err != nil {
		return time.Time{}, fmt.Errorf("cluster lose slot %s: %w", slot, err)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var began time.Time
	err = poll(dctx, 50*time.Millisecond, func(ctx context.Context) (bool, error) {
		began = time.Now()
		if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot); err != nil {
			return false, fmt.Errorf("end the slot's walsender: %w", err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
			return false, fmt.Errorf("drop the slot: %w", err)
		}
		return true, nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("cluster lose slot %s: %w", slot, err)
	}
	return began, nil
}

// SlotRecovery is what the slot ledger says of a lost slot's recovery that ended.
type SlotRecovery struct {
	At     time.Time // when it ended
	Events int64
	Rule   string
}

// WaitSlotRecovered waits until the slot ledger of database records a recovery of slot that ended
// after since, and returns it.
func (c *Cluster) WaitSlotRecovered(ctx context.Context, database, slot string, since time.Time) (SlotRecovery, error) {
	var rec SlotRecovery
	err := poll(ctx, 500*time.Millisecond, func(ctx context.Context) (bool, error) {
		conn, err := pgx.Connect(ctx, c.Primary().DSN(database))
		if err != nil {
			return false, err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var at *time.Time
		var events *int64
		var rule *string
		if err := conn.QueryRow(ctx, `SELECT recovered_at, recovered_events, recovered_rule FROM public.outbox_relay_slots
			WHERE slot = $1 AND recovery_since IS NULL`, slot).Scan(&at, &events, &rule); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return false, err
		}
		if at == nil || at.Before(since) {
			return false, nil
		}
		rec.At = *at
		if events != nil {
			rec.Events = *events
		}
		if rule != nil {
			rec.Rule = *rule
		}
		return true, nil
	})
	if err != nil {
		return rec, fmt.Errorf("cluster: no recovery of slot %s recorded in the slot ledger: %w", slot, err)
	}
	return rec, nil
}
