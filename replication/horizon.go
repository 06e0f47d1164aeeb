package replication

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// horizon is the verified horizon: the WAL position up to which the outbox table is known to have
// been, continuously, the table the relay started with and a member of the publication. pgoutput
// sends nothing for a table that left the publication (ALTER PUBLICATION ... DROP TABLE, or DROP
// TABLE and a new table of the same name, which a FOR TABLE publication does not include), so the
// stream alone cannot see those rows: the slot must never be confirmed past a position that no
// check covered. sendStatus caps the confirmed position at Verified.
//
// Each check runs, on an ordinary connection, in one READ COMMITTED transaction:
//
//  1. LOCK TABLE ONLY <outbox> IN ACCESS SHARE MODE. DROP TABLE (and RENAME) need ACCESS
//     EXCLUSIVE, so from here until the check commits the table cannot be dropped: a drop commits
//     after L below, and inserts into a recreated table commit after the drop.
//  2. L = pg_current_wal_lsn().
//  3. In a new statement (so a snapshot taken after L was read): the table's OID is the one the
//     relay started with, the publication exists, publishes inserts and includes the table.
//
// ALTER PUBLICATION ... DROP TABLE does not conflict with that lock, and a commit becomes visible
// to new snapshots only some time after its commit record is written (it is written, flushed,
// possibly waited on by synchronous replication, and only then shown). So L of a check is trusted
// only once the next check, half a status interval later, still finds the table in the
// publication: a removal whose commit record precedes L has become visible by then, unless making
// its commit visible took longer than that margin (a synchronous standby that stalls for that
// long). Checks run every half status interval, so confirmation trails what Kafka acknowledged by
// at most about one status interval.
type horizon struct {
	dsn         string
	table       string // qualified, sanitized
	schema      string
	name        string
	publication string
	interval    time.Duration // between checks: half the status interval, also the safety margin
	log         *zap.Logger

	verified atomic.Uint64 // pglogrepl.LSN
	oid      atomic.Uint32 // the outbox table's OID when the relay started; 0 before the first session
	failed   atomic.Pointer[error]
	changed  chan struct{} // receives (without blocking) when verified moves

	pending pglogrepl.LSN // L of the last successful check, trusted once another check succeeds
	// noLock: the role may not lock the table (LOCK needs SELECT on it); checks then rely on the
	// margin for a drop too.
	noLock bool
}

func newHorizon(cfg *Config, log *zap.Logger) *horizon {
	return &horizon{
		dsn: cfg.DSN, table: cfg.qualifiedTable(), schema: cfg.Schema, name: cfg.Table, publication: cfg.Publication,
		interval: max(cfg.StatusInterval/2, 10*time.Millisecond), log: log, changed: make(chan struct{}, 1),
	}
}

// Verified is the highest position the slot may be confirmed to.
func (h *horizon) Verified() pglogrepl.LSN { return pglogrepl.LSN(h.verified.Load()) }

// Err is the fatal error a check found, if any.
func (h *horizon) Err() error {
	if p := h.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func (h *horizon) fail(err error) {
	h.failed.CompareAndSwap(nil, &err)
}

// start records the outbox's OID for a new session: the first one sets it, later ones must find
// the same table, or it was dropped and recreated while the relay was reconnecting.
func (h *horizon) start(oid uint32) error {
	if h.oid.CompareAndSwap(0, oid) || h.oid.Load() == oid {
		return nil
	}
	err := h.recreatedError(h.oid.Load(), oid)
	h.fail(err)
	return err
}

// run checks every interval until ctx ends or a check finds the outbox gone from the stream.
func (h *horizon) run(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	tick := time.NewTicker(h.interval)
	defer tick.Stop()
	for {
		if h.oid.Load() != 0 {
			err := h.check(ctx, &conn)
			switch {
			case err == nil:
			case IsFatal(err):
				h.fail(err)
				h.log.Error("the outbox table left the replication stream", zap.Error(err))
				return
			case ctx.Err() != nil:
				return
			case isLockTimeout(err):
				// DDL on the table (ATTACH/DETACH PARTITION, ALTER TABLE) holds or awaits a
				// conflicting lock: skip this round rather than queue behind it.
				h.log.Debug("the outbox table is locked by DDL; publication check skipped this round", zap.Error(err))
			default:
				// Not fatal: the horizon stays where it is this time, and confirmation waits.
				h.log.Warn("cannot check the outbox table's publication; the slot is not confirmed further until a check succeeds", zap.Error(err))
				if conn != nil {
					conn.Close(context.WithoutCancel(ctx))
					conn = nil
				}
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// check runs one check (see horizon) and moves the horizon.
func (h *horizon) check(ctx context.Context, conn **pgx.Conn) error {
	// A check must finish well within the interval, or confirmation falls behind.
	ctx, cancel := context.WithTimeout(ctx, max(h.interval, 5*time.Second))
	defer cancel()
	if *conn == nil {
		c, err := pgx.Connect(ctx, h.dsn)
		if err != nil {
			return classifyConnect(err, "the publication check")
		}
		*conn = c
	}
	var lsn pglogrepl.LSN
	var oid uint32
	var pubExists, pubInsert, included bool
	err := pgx.BeginFunc(ctx, *conn, func(tx pgx.Tx) error {
		// A short lock timeout: a DDL statement waiting for the table must not queue the check,
		// and the check must not hold back the DDL; a skipped round only delays confirmation.
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '200ms'"); err != nil {
			return err
		}
		if !h.noLock {
			if _, err := tx.Exec(ctx, "LOCK TABLE ONLY "+h.table+" IN ACCESS SHARE MODE"); err != nil {
				return err
			}
		}
		var text string
		if err := tx.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&text); err != nil {
			return err
		}
		var err error
		if lsn, err = pglogrepl.ParseLSN(text); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT to_regclass($1)::oid,
				coalesce(p.pubinsert, false), p.oid IS NOT NULL,
				coalesce(p.puballtables OR EXISTS (SELECT 1 FROM pg_publication_rel r
					WHERE r.prpubid = p.oid AND (r.prrelid = to_regclass($1)
						OR r.prrelid IN (SELECT relid FROM pg_partition_ancestors(to_regclass($1))))), false)
			FROM (SELECT 1) one LEFT JOIN pg_publication p ON p.pubname = $2`, h.table, h.publication).
			Scan(&oid, &pubInsert, &pubExists, &included)
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" && !h.noLock { // insufficient_privilege
		h.noLock = true
		h.log.Warn("the relay's role may not lock the outbox table, so the publication check relies on its time margin for a dropped table too: GRANT SELECT ON it to the relay's role",
			zap.String("table", h.table), zap.Error(err))
		return h.check(ctx, conn)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fatalf("outbox table %s no longer exists (dropped or renamed while the relay was streaming): rows written to a new table of that name are not in publication %q, so the relay stopped before confirming past the change. Recreate or rename the table back, ALTER PUBLICATION %s ADD TABLE %s, republish the rows written meanwhile (backfill_since), and restart",
			h.table, h.publication, pgx.Identifier{h.publication}.Sanitize(), h.table)
	}
	if err != nil {
		return fmt.Errorf("check outbox table %s in publication %q: %w", h.table, h.publication, err)
	}
	switch known := h.oid.Load(); {
	case oid != known:
		return h.recreatedError(known, oid)
	case !pubExists:
		return fatalf("publication %q no longer exists: recreate it (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)) and restart; rows written meanwhile are not in the replication stream and must be republished (backfill_since)",
			h.publication, pgx.Identifier{h.publication}.Sanitize(), h.table)
	case !pubInsert:
		return fatalf("publication %q no longer publishes INSERTs, so outbox rows would be skipped: run ALTER PUBLICATION %s SET (publish = 'insert') and restart; rows written meanwhile are not in the replication stream and must be republished (backfill_since)",
			h.publication, pgx.Identifier{h.publication}.Sanitize())
	case !included:
		return fatalf("outbox table %s was removed from publication %q while the relay was streaming, so its new rows are not in the replication stream: run ALTER PUBLICATION %s ADD TABLE %s, republish the rows written meanwhile (backfill_since), and restart",
			h.table, h.publication, pgx.Identifier{h.publication}.Sanitize(), h.table)
	}
	if h.pending > h.Verified() {
		h.verified.Store(uint64(h.pending))
		select {
		case h.changed <- struct{}{}:
		default:
		}
	}
	h.pending = lsn
	return nil
}

func (h *horizon) recreatedError(known, now uint32) error {
	return fatalf("outbox table %s was dropped and recreated while the relay was streaming (OID %d, now %d): the new table is not in publication %q unless added again, and rows written to it before that are not in the replication stream; the relay stopped before confirming past the change. Run ALTER PUBLICATION %s ADD TABLE %s if needed, republish the rows written to the new table so far (backfill_since), and restart",
		h.table, known, now, h.publication, pgx.Identifier{h.publication}.Sanitize(), h.table)
}

// waitFor waits until the horizon reaches lsn, a check fails, or ctx ends.
func (h *horizon) waitFor(ctx context.Context, lsn pglogrepl.LSN) {
	for h.Verified() < lsn && h.Err() == nil {
		select {
		case <-h.changed:
		case <-ctx.Done():
			return
		}
	}
}

// isLockTimeout reports whether err is PostgreSQL's lock_not_available (lock_timeout expired).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
