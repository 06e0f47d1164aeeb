package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// standbyTimeout bounds the start of the poll-standby side's standby: an online copy of the bench's
// cluster, then streaming and catching up.
const standbyTimeout = 2 * time.Minute

// standby is a physical standby of the bench's cluster, streaming from a physical slot that the
// primary's synchronized_standby_slots lists: with it, a poller's claimed batch goes to Kafka only
// once the standby has flushed the WAL of the claim's commits (poll/standby.go), which costs each
// claim at most one flush of that WAL and the standby's round trip.
type standby struct {
	pg   *devenv.Postgres
	slot string
	pool *pgxpool.Pool // the primary's
}

// standbyFor starts a standby for side poll-standby and lists it in synchronized_standby_slots;
// stop resets the setting and removes the standby again, so that no other side streams to it or
// waits for it. For every other side it starts nothing, and stop does nothing.
func (b *bench) standbyFor(ctx context.Context, side string) (stop func() error, err error) {
	if side != sidePollStandby {
		return func() error { return nil }, nil
	}
	s := &standby{slot: b.run + "_standby", pool: b.pool}
	b.logf("%s: starting a standby streaming from physical slot %s", side, s.slot)
	started := time.Now()
	sctx, cancel := context.WithTimeout(ctx, standbyTimeout)
	defer cancel()
	if err := s.start(sctx, b.svc.PG); err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", side, err), s.close(context.WithoutCancel(ctx)))
	}
	b.logf("%s: standby on port %d caught up and listed in synchronized_standby_slots, %s after its start", side, s.pg.Port(),
		time.Since(started).Round(time.Millisecond))
	return func() error { return s.close(context.WithoutCancel(ctx)) }, nil
}

// checkStandbyVersion fails, before anything is measured, when a side that needs
// synchronized_standby_slots is asked of a server older than PostgreSQL 17.
func (b *bench) checkStandbyVersion(ctx context.Context) error {
	if !slices.Contains(b.cfg.Sides, sidePollStandby) && !slices.Contains(b.cfg.Steady, sidePollStandby) {
		return nil
	}
	var num int
	var version string
	if err := b.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&num, &version); err != nil {
		return fmt.Errorf("side %s: read the server version: %w", sidePollStandby, err)
	}
	if num < 170000 {
		return fmt.Errorf("side %s needs PostgreSQL 17 or later (synchronized_standby_slots), the bench's cluster is %s: run with BENCH_PG_VERSION=18 (make pg-lib), or leave the side out", sidePollStandby, version)
	}
	return nil
}

// start copies primary online into a standby that streams from a physical slot of its own, waits
// until it has flushed everything primary had flushed, and lists the slot in primary's
// synchronized_standby_slots.
func (s *standby) start(ctx context.Context, primary *devenv.Postgres) error {
	// The slot reserves WAL from now on: the online copy streams it from before its start.
	if _, err := s.pool.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", s.slot); err != nil {
		return fmt.Errorf("create physical slot %s: %w", s.slot, err)
	}
	pg, err := devenv.StartStandbyOnline(ctx, primary, devenv.PostgresOptions{Settings: map[string]string{
		"primary_slot_name": s.slot,
		// The primary's 512MB are for its decoding and draining; the standby only replays.
		"shared_buffers": "128MB",
	}})
	if err != nil {
		return fmt.Errorf("start the standby: %w", err)
	}
	s.pg = pg
	var target string
	if err := s.pool.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&target); err != nil {
		return fmt.Errorf("read the primary's flush position: %w", err)
	}
	// A measurement that starts while the standby catches up would time the catching up.
	caughtUp := func() (bool, error) {
		var ok bool
		err := s.pool.QueryRow(ctx, "SELECT coalesce(bool_and(active AND restart_lsn >= $2::pg_lsn), false) FROM pg_replication_slots WHERE slot_name = $1",
			s.slot, target).Scan(&ok)
		return ok, err
	}
	if err := waitFor(ctx, "the standby to stream from slot "+s.slot+" and flush the primary's WAL up to "+target, caughtUp); err != nil {
		return err
	}
	return s.synchronize(ctx, s.slot)
}

// synchronize sets primary's synchronized_standby_slots to slots (ALTER SYSTEM, a reload), or
// resets it when slots is empty, and waits until a session sees the new value: a reload is
// asynchronous, and a side started before it would run with the old one.
func (s *standby) synchronize(ctx context.Context, slots string) error {
	alter := "ALTER SYSTEM RESET synchronized_standby_slots"
	if slots != "" {
		alter = "ALTER SYSTEM SET synchronized_standby_slots = '" + strings.ReplaceAll(slots, "'", "''") + "'"
	}
	// Two statements: ALTER SYSTEM refuses to run inside the implicit transaction of a batch.
	for _, sql := range []string{alter, "SELECT pg_reload_conf()"} {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("set synchronized_standby_slots to %q: %w", slots, err)
		}
	}
	return waitFor(ctx, fmt.Sprintf("synchronized_standby_slots to read %q after the reload", slots), func() (bool, error) {
		var v string
		err := s.pool.QueryRow(ctx, "SELECT current_setting('synchronized_standby_slots')").Scan(&v)
		return v == slots, err
	})
}

// close resets synchronized_standby_slots before it stops the standby (a later poller, and the
// walsender of any failover slot, would otherwise wait for it for ever), then drops the standby's
// slot, which would hold WAL for ever (once its walsender has gone: dropSlot waits for that).
func (s *standby) close(ctx context.Context) error {
	err := s.synchronize(ctx, "")
	if s.pg != nil {
		err = errors.Join(err, s.pg.Close(ctx))
	}
	return errors.Join(err, dropSlot(ctx, s.pool, s.slot))
}

// waitFor polls cond every 50 ms until it holds, fails, or ctx ends (standbyTimeout at most).
func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, standbyTimeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
