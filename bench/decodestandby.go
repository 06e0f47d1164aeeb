package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// sideRelayStandby is the relay decoding on a hot standby of the bench's cluster (PostgreSQL 16+,
// docs/operations.md, "Decoding on a standby"): its slot lives on the standby, pg_dsn leads there
// and primary_dsn to the bench's cluster. It drains the same backlog as the relay on the primary,
// and the report sets the primary's CPU of the two side by side.
const sideRelayStandby = "relay-standby"

// decodingStandby is the hot standby that sideRelayStandby decodes on: it streams from a physical
// slot of the primary with hot_standby_feedback on, from before the backlog until the drains end.
type decodingStandby struct {
	pg         *devenv.Postgres
	pool       *pgxpool.Pool // the bench's database on the standby
	dsn        string
	slot       string // the physical slot on the primary
	postmaster int    // the standby's postmaster, whose processes' CPU its rows report
}

// decodesOnStandby says whether a run needs the decoding standby.
func (c *Config) decodesOnStandby() bool { return slices.Contains(c.Sides, sideRelayStandby) }

// startDecodingStandby starts the standby that side relay-standby decodes on, before any of its
// slots is created and before the backlog, so that it replays the backlog while it is written.
func (b *bench) startDecodingStandby(ctx context.Context) error {
	d := &decodingStandby{slot: b.run + "_decoding_standby"}
	b.logf("%s: starting a hot standby streaming from physical slot %s", sideRelayStandby, d.slot)
	started := time.Now()
	sctx, cancel := context.WithTimeout(ctx, standbyTimeout)
	defer cancel()
	err := d.start(sctx, b)
	b.decoding = d // close cleans up whatever start made, also after a failure
	if err != nil {
		return fmt.Errorf("%s: %w", sideRelayStandby, err)
	}
	b.logf("%s: standby on port %d streaming, %s after its start", sideRelayStandby, d.pg.Port(), time.Since(started).Round(time.Millisecond))
	return nil
}

func (d *decodingStandby) start(ctx context.Context, b *bench) error {
	if _, err := b.pool.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", d.slot); err != nil {
		return fmt.Errorf("create physical slot %s: %w", d.slot, err)
	}
	pg, err := devenv.StartStandbyOnline(ctx, b.svc.PG, devenv.PostgresOptions{Settings: map[string]string{
		"primary_slot_name": d.slot,
		// Without the feedback, the primary's vacuum may remove catalog rows the standby's slots
		// need, and the standby invalidates them.
		"hot_standby_feedback": "on",
		// The primary's 512MB are for its own decoding; the standby's walsender reads the WAL
		// through the page cache as the primary's does.
		"shared_buffers": "128MB",
	}})
	if err != nil {
		return fmt.Errorf("start the standby: %w", err)
	}
	d.pg = pg
	cfg, err := pgx.ParseConfig(b.svc.DSN)
	if err != nil {
		return fmt.Errorf("the bench's DSN: %w", err)
	}
	d.dsn = pg.DSN(cfg.Database)
	if d.pool, err = pgxpool.New(ctx, d.dsn); err != nil {
		return fmt.Errorf("connect to the standby: %w", err)
	}
	if d.postmaster, err = postmasterOf(ctx, d.pool); err != nil {
		return fmt.Errorf("the standby: %w", err)
	}
	return nil
}

// createSlot creates a logical slot on the standby. There, the creation waits for a
// running-transactions record of the primary in the replayed WAL: ask the primary for one every
// 100 ms meanwhile (pg_log_standby_snapshot), as the relay itself does.
func (d *decodingStandby) createSlot(ctx context.Context, primary *pgxpool.Pool, slot string) error {
	ctx, cancel := context.WithTimeout(ctx, standbyTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- createSlot(ctx, d.pool, slot) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("on the standby: %w", err)
			}
			return nil
		case <-time.After(100 * time.Millisecond):
			if _, err := primary.Exec(ctx, "SELECT pg_log_standby_snapshot()"); err != nil && ctx.Err() == nil {
				return fmt.Errorf("create slot %s on the standby: ask the primary for a running-transactions record: %w", slot, err)
			}
		}
	}
}

// waitReplayed waits until the standby has replayed the WAL up to lsn: a drain that started
// earlier would time the replay too.
func (d *decodingStandby) waitReplayed(ctx context.Context, lsn uint64) error {
	return waitFor(ctx, "the standby to replay the backlog", func() (bool, error) {
		var ok bool
		err := d.pool.QueryRow(ctx, "SELECT (pg_last_wal_replay_lsn() - '0/0') >= $1::bigint", lsn).Scan(&ok)
		return ok, err
	})
}

// close stops the standby and drops its physical slot on the primary (once its walsender has
// gone: dropSlot waits for that); the logical slots go with the standby.
func (d *decodingStandby) close(ctx context.Context, primary *pgxpool.Pool) error {
	var err error
	if d.pool != nil {
		d.pool.Close()
	}
	if d.pg != nil {
		err = d.pg.Close(ctx)
	}
	return errors.Join(err, dropSlot(ctx, primary, d.slot))
}

// checkDecodingStandbyVersion fails, before anything is measured, when relay-standby is asked of
// a server older than PostgreSQL 16, which cannot decode on a standby.
func (b *bench) checkDecodingStandbyVersion(ctx context.Context) error {
	if !b.cfg.decodesOnStandby() {
		return nil
	}
	var num int
	var version string
	if err := b.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&num, &version); err != nil {
		return fmt.Errorf("side %s: read the server version: %w", sideRelayStandby, err)
	}
	if num < 160000 {
		return fmt.Errorf("side %s needs PostgreSQL 16 or later (logical decoding on a standby), the bench's cluster is %s: run with BENCH_PG_VERSION=18 (make pg-lib), or leave the side out", sideRelayStandby, version)
	}
	return nil
}
