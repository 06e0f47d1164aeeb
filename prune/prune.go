// Package prune deletes old outbox rows in small batches.
//
// Streaming reads events from the WAL, not from the table: once a transaction has committed, its
// INSERTs are in the WAL and the replication slot keeps that WAL until the relay has confirmed them,
// whatever happens to the rows. What reads the table is not so indifferent: a first-start backfill
// (keep rows at least as long as its window), polling (Options.OnlyProcessed), and a lost slot's
// recovery (on_slot_lost: recover), which publishes the gap from the rows: Options.Keep keeps
// those created within a margin of the last acknowledged commit and Options.KeepXmin those of
// transactions from the recorded horizon on; without a horizon, a transaction that ran longer than
// the margin and committed after that commit can still lose rows to pruning.
//
// Each batch is one short statement in its own transaction that locks only the rows it deletes and
// skips rows another transaction has locked, so pruning never waits behind, or holds up, producers.
package prune

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB runs statements each in its own transaction: a *pgxpool.Pool or a *pgx.Conn. (A pgx.Tx
// would make the whole prune one long transaction, which is what batching avoids.)
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Options says what to delete. Zero values get the defaults noted.
type Options struct {
	// Table is "table" or "schema.table"; each part is quoted, so it is taken literally. Default
	// "public.outbox_events".
	Table string
	// Column is the row's creation time (timestamptz). Default "created_at"; an index on it keeps
	// each batch cheap (`outbox-relay migrate` creates one).
	Column string
	// OlderThan: rows whose Column is more than this far before the database's now() are deleted.
	// Zero deletes every committed row.
	OlderThan time.Duration
	// OnlyProcessed deletes only rows whose processed_at is set: the polling mode (source: poll)
	// reads the table, so a row it has not published yet must stay whatever its age.
	OnlyProcessed bool
	// BatchSize is the most rows one statement deletes. Default 1000.
	BatchSize int
	// Progress, when set, is called after each batch with the rows it deleted.
	Progress func(deleted int64)
	// Keep, when set, is asked once per run for a creation time from which rows stay whatever
	// OlderThan says (ok false: no such bound): the relay keeps what a lost slot's recovery would
	// read. An error fails the run: pruning waits rather than guess.
	Keep func(ctx context.Context) (from time.Time, ok bool, err error)
	// KeepXmin, when set, is asked once per run for a full transaction id from which rows stay
	// whatever their age (ok false: none): the rows of the transactions a lost slot's recovery
	// counts as not acknowledged, which a long transaction may have created long ago. An error
	// fails the run.
	KeepXmin func(ctx context.Context) (xmin uint64, ok bool, err error)
	// Pruned, when set, is called after a run that deleted rows with the cutoff it applied: every
	// row it deleted was created before it.
	Pruned func(ctx context.Context, before time.Time) error
}

const defaultBatch = 1000

// Prune deletes the rows older than o.OlderThan, batch by batch, until a batch finds fewer than
// BatchSize (rows locked by other transactions are left for the next run). It returns how many it
// deleted, also when ctx ends or a batch fails part way.
func Prune(ctx context.Context, db DB, o Options) (deleted int64, err error) {
	keep := ""
	if o.KeepXmin != nil {
		if keep, err = keepXmin(ctx, db, o); err != nil {
			return 0, err
		}
	}
	del, err := o.statement(keep)
	if err != nil {
		return 0, err
	}
	// The cutoff is fixed once, on the database's clock (the one created_at defaults use), so a run
	// ends even while producers keep inserting.
	var cutoff time.Time
	if err := db.QueryRow(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", o.OlderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("prune %s: read the database clock: %w", o.Table, err)
	}
	if o.Keep != nil {
		keep, ok, err := o.Keep(ctx)
		if err != nil {
			return 0, fmt.Errorf("prune %s: %w", o.Table, err)
		}
		if ok && keep.Before(cutoff) {
			cutoff = keep
		}
	}
	if o.Pruned != nil {
		defer func() {
			if deleted > 0 {
				// Recorded also when ctx ended mid-run: the rows are gone either way.
				pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if perr := o.Pruned(pctx, cutoff); perr != nil && err == nil {
					err = fmt.Errorf("prune %s: record what was pruned: %w", o.Table, perr)
				}
			}
		}()
	}
	for {
		tag, err := db.Exec(ctx, del, cutoff, o.BatchSize)
		if err != nil {
			return deleted, fmt.Errorf("prune %s: delete rows older than %s: %w", o.Table, cutoff.Format(time.RFC3339), err)
		}
		n := tag.RowsAffected()
		deleted += n
		if o.Progress != nil {
			o.Progress(n)
		}
		if n < int64(o.BatchSize) {
			return deleted, nil
		}
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
	}
}

// keepXmin is the condition that keeps the rows of transactions from o.KeepXmin's id on ("" when
// it has none). A row's 32-bit xmin is mapped to the full id with those low bits below a
// reference xidHeadroom past the server's next one: exact from 2^31 ids below next (PostgreSQL
// assigns none beyond) to xidHeadroom past it. The headroom is for the transactions that get an id
// after next is read and commit while the run deletes (a long transaction writing its row late,
// created_at its start): mapped below next, their ids would read as 2^32 older, and be deleted.
func keepXmin(ctx context.Context, db DB, o Options) (string, error) {
	xmin, ok, err := o.KeepXmin(ctx)
	if err != nil || !ok {
		return "", err
	}
	var next string
	if err := db.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&next); err != nil {
		return "", fmt.Errorf("prune %s: read the next transaction id: %w", o.Table, err)
	}
	n, err := strconv.ParseUint(next, 10, 64)
	if err != nil {
		return "", fmt.Errorf("prune %s: read the next transaction id %q: %w", o.Table, next, err)
	}
	if n < xmin || n-xmin >= 1<<31 {
		return "", fmt.Errorf("prune %s: the transaction id %d to keep rows from is not within 2^31 ids below the server's next one (%d): the slot ledger is from another cluster or a restore; pruning waits", o.Table, xmin, n)
	}
	ref := n - 1 + xidHeadroom
	return fmt.Sprintf(" AND ((%d - xmin::text::bigint + 4294967296) %% 4294967296) > %d", ref&0xffffffff, ref-xmin), nil
}

// xidHeadroom is how many ids past the next one read at a run's start keepXmin maps exactly: far
// more than a run sees assigned, and with the 2^31 below next, within one 2^32 cycle.
const xidHeadroom = 1 << 30

// statement applies the defaults and builds the batch DELETE: the oldest rows first (so an
// interrupted run still removed the oldest), found by the index, locked with SKIP LOCKED, deleted
// by ctid (a TID scan, no second index lookup). keep is ANDed to the rows' choice.
func (o *Options) statement(keep string) (string, error) {
	if o.Table == "" {
		o.Table = "public.outbox_events"
	}
	if o.Column == "" {
		o.Column = "created_at"
	}
	if o.BatchSize <= 0 {
		o.BatchSize = defaultBatch
	}
	if o.OlderThan < 0 {
		return "", fmt.Errorf("prune: OlderThan is %s; want zero or more", o.OlderThan)
	}
	parts := strings.Split(o.Table, ".")
	if len(parts) > 2 || parts[0] == "" || parts[len(parts)-1] == "" {
		return "", fmt.Errorf("prune: table %q: want table or schema.table", o.Table)
	}
	table, col := pgx.Identifier(parts).Sanitize(), pgx.Identifier{o.Column}.Sanitize()
	processed := keep
	if o.OnlyProcessed {
		processed += " AND processed_at IS NOT NULL"
	}
	return fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM %[1]s WHERE %[2]s < $1%[3]s ORDER BY %[2]s LIMIT $2 FOR UPDATE SKIP LOCKED))`, table, col, processed), nil
}

// Loop runs Prune every interval until ctx ends, reporting each run's result to report (which may
// be nil). A failed run is reported and retried at the next interval. It returns ctx's error.
func Loop(ctx context.Context, db DB, o Options, interval time.Duration, report func(deleted int64, err error)) error {
	if interval <= 0 {
		return errors.New("prune: the interval must be positive")
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		n, err := Prune(ctx, db, o)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if report != nil {
			report(n, err)
		}
	}
}
