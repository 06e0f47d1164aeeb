package relay

// A lost slot's recovery, the relay's half (replication/recovery.go is the stream's): publishing,
// from the replacement slot's exported snapshot, the outbox rows committed after the last
// transaction Kafka acknowledged, and recording that point in the slot ledger as Kafka
// acknowledges.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/replication"
)

// Recovery configures how a lost slot's gap is read from the outbox table (on_slot_lost: recover).
type Recovery struct {
	// Margin covers the longest transaction the database allows: without commit timestamps, the
	// gap is the rows created from Margin before the last acknowledged commit. Zero derives it
	// from the server's transaction_timeout or idle_in_transaction_session_timeout, else
	// DefaultRecoveryMargin.
	Margin time.Duration
	// CreatedColumn and OrderColumn are as for Backfill.
	CreatedColumn, OrderColumn string
}

// DefaultRecoveryMargin is the margin when neither the configuration nor the server bounds a
// transaction's length.
const DefaultRecoveryMargin = time.Hour

// commitSkew is how much earlier than a transaction before it in the WAL a transaction's commit
// time may be: PostgreSQL takes the time before it inserts the commit record, and transactions
// committing at once may insert theirs in the other order. Rows committed this much before the
// last acknowledged commit are published again.
const commitSkew = time.Second

// confirmedEvery is how often the relay records in the slot ledger how far Kafka has acknowledged.
// What it trails by, a recovery publishes twice.
const confirmedEvery = 5 * time.Second

// recoverGap publishes the gap of a lost slot (replication.Config.Recover).
func (r *Relay) recoverGap(ctx context.Context, snapshot string, lost replication.LostSlot) (replication.Recovery, error) {
	started := time.Now()
	conn, err := r.cfg.Replication.Connect(ctx)
	if err != nil {
		return replication.Recovery{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := snapshotTx(ctx, conn, snapshot)
	if err != nil {
		return replication.Recovery{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rc := r.cfg.Recovery
	if rc == nil {
		rc = &Recovery{}
	}
	t, err := r.outboxTable(ctx, tx, rc.CreatedColumn, rc.OrderColumn)
	if err != nil {
		return replication.Recovery{}, err
	}
	margin, err := recoveryMargin(ctx, tx, rc.Margin)
	if err != nil {
		return replication.Recovery{}, err
	}
	var tracked string
	if err := tx.QueryRow(ctx, "SELECT current_setting('track_commit_timestamp')").Scan(&tracked); err != nil {
		return replication.Recovery{}, fmt.Errorf("read track_commit_timestamp: %w", err)
	}
	g := gapQuery(t, lost, margin, tracked == "on")

	// The relay's own pruning never deletes the gap's rows (run.go guards it by the ledger), but
	// one from before that guard, or one run without the ledger, may have: a gap read from a table
	// that lost some of it would pass a partial gap off as whole.
	if lost.PrunedThrough.After(g.oldest) {
		// The duplicate flag is counted too, only so that the statement uses every argument.
		var left, acknowledged int64
		if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(*) FILTER (WHERE %s) FROM %s WHERE %s", g.duplicate, t.name, g.where), g.args...).Scan(&left, &acknowledged); err != nil {
			return replication.Recovery{}, fmt.Errorf("count the gap's rows: %w", err)
		}
		return replication.Recovery{}, replication.Fatal(fmt.Errorf("%w: slot %q is lost (%s), and its gap cannot be recovered whole from the outbox table: pruning deleted rows created before %s, and the gap's rows may have been created from %s on. %d rows of the gap are left (besides %d that Kafka acknowledged before the loss, which the rule reads again); how many were deleted the table cannot say. Nothing of the gap was published. Publish what is left by hand if that is acceptable (stop every instance, run outbox-relay forget-slot, start once with backfill: true and backfill_since: %s), and keep rows longer than the relay may be down",
			replication.ErrSlotLost, lost.Slot, lost.Reason, lost.PrunedThrough.Format(time.RFC3339), g.oldest.Format(time.RFC3339), left-acknowledged, acknowledged, g.oldest.Format(time.RFC3339)))
	}

	r.log.Warn("recovering a lost slot's gap from the outbox table: the events of transactions committed after the last one Kafka acknowledged",
		zap.String("slot", lost.Slot), zap.String("reason", lost.Reason), zap.Time("after", lost.Since),
		zap.String("rule", g.rule), zap.Duration("margin", g.margin), zap.Stringer("new_slot_consistent_point", lost.ConsistentLSN),
		zap.Bool("again", lost.Again))
	q := rowQuery{where: []string{g.where}, args: g.args, flag: g.duplicate}
	if r.exactlyOnce() {
		// Exactly-once positions order events by the stream's LSNs, which table rows do not have:
		// the gap goes out as one pseudo-transaction just before the new slot's first, at least
		// once (a crash during it publishes it all again), and no position it leaves can skip
		// anything the new slot streams.
		q.stamp = func(ev *decoder.Event, n int64) {
			ev.Tx.CommitLSN = lost.ConsistentLSN - 1
			ev.Tx.SystemID, ev.Tx.Timeline = lost.Server.SystemID, lost.Server.Timeline
			ev.Index = int(n)
		}
	}
	n, dups, err := r.publishSelected(ctx, tx, t, q)
	if err != nil {
		err = fmt.Errorf("publish the gap (%d events published so far; the next start publishes it all again): %w", n, err)
	}
	if err := r.cancelledReads.note(ctx, "the lost slot's gap", err); err != nil {
		return replication.Recovery{}, err
	}
	took := time.Since(started)
	r.m.SlotRecoveries.Inc()
	r.m.SlotRecoveredEvents.Add(float64(n))
	fields := []zap.Field{zap.String("slot", lost.Slot), zap.Int64("events", n), zap.Int64("may_be_duplicates", dups),
		zap.Time("after", lost.Since), zap.String("rule", g.rule), zap.Duration("took", took)}
	if r.exactlyOnce() {
		r.log.Warn("recovered the lost slot's gap, at least once: exactly-once cannot cover events read from the table (read_committed consumers may see the ones counted in may_be_duplicates twice); streaming from the new slot", fields...)
	} else {
		r.log.Warn("recovered the lost slot's gap; streaming from the new slot", fields...)
	}
	return replication.Recovery{Events: n, From: lost.Since, Rule: g.rule, Took: took}, nil
}

// gap is the WHERE clause that chooses a lost slot's gap.
type gap struct {
	rule      string
	margin    time.Duration
	where     string
	args      []any
	duplicate string    // true for a row that may have been published before the loss
	oldest    time.Time // no row of the gap was created before it
}

// gapQuery chooses the rows committed after lost.Since. With commit timestamps, by commit time
// alone (a transaction may have created its rows long before it committed); a row whose time is
// unknown (frozen, or from before the setting) falls back to the creation rule. Without them, by
// creation time from margin before.
func gapQuery(t outboxTable, lost replication.LostSlot, margin time.Duration, commitTimestamps bool) gap {
	created := lost.Since.Add(-margin)
	if !commitTimestamps || lost.FromSlotCreation {
		return gap{
			rule: replication.RuleCreatedAt, margin: margin, oldest: created,
			where:     fmt.Sprintf("%s >= $1", t.created),
			args:      []any{created, lost.Since},
			duplicate: fmt.Sprintf("%s < $2", t.created),
		}
	}
	from := lost.Since.Add(-commitSkew)
	return gap{
		// oldest bounds only the rows of unknown commit time, and the rows the relay's pruning
		// keeps: a long transaction's rows can be older still (docs/operations.md).
		rule: replication.RuleCommitTime, margin: margin, oldest: from.Add(-margin),
		where: fmt.Sprintf("(pg_xact_commit_timestamp(xmin) >= $1 OR (pg_xact_commit_timestamp(xmin) IS NULL AND %s >= $2))",
			t.created),
		args:      []any{from, created, lost.Since},
		duplicate: fmt.Sprintf("coalesce(pg_xact_commit_timestamp(xmin) <= $3, %s < $3)", t.created),
	}
}

// recoveryMargin is the configured margin, or the longest transaction the server allows, or the
// default.
func recoveryMargin(ctx context.Context, tx querier, configured time.Duration) (time.Duration, error) {
	if configured > 0 {
		return configured, nil
	}
	// transaction_timeout is PostgreSQL 17's; missing_ok reads NULL before that. Milliseconds.
	var txTimeout, idleTimeout *int64
	if err := tx.QueryRow(ctx, `SELECT (extract(epoch FROM nullif(current_setting('transaction_timeout', true), '')::interval) * 1000)::bigint,
		(extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint`).Scan(&txTimeout, &idleTimeout); err != nil {
		return 0, fmt.Errorf("read transaction_timeout and idle_in_transaction_session_timeout: %w", err)
	}
	var m time.Duration
	for _, v := range []*int64{txTimeout, idleTimeout} {
		if v != nil && *v > 0 {
			m = max(m, time.Duration(*v)*time.Millisecond)
		}
	}
	if m == 0 {
		return DefaultRecoveryMargin, nil
	}
	return m, nil
}

// confirmedRecorder writes to the slot ledger the commit time and position of the last transaction
// Kafka acknowledged with every one before it: where a lost slot's gap would start. The relay runs
// it every confirmedEvery while it streams, and once more after a clean stop's drain.
type confirmedRecorder struct {
	r      *Relay
	ledger replication.Ledger

	mu       sync.Mutex
	conn     *pgx.Conn
	recorded time.Time
	warned   bool
	gaveUp   bool // no ledger, or not migrated, or no right to write it: until a restart
}

func (r *Relay) newConfirmedRecorder() *confirmedRecorder {
	return &confirmedRecorder{r: r, ledger: replication.NewLedger(r.cfg.Replication.Schema)}
}

// run records every confirmedEvery until ctx ends.
func (c *confirmedRecorder) run(ctx context.Context) {
	tick := time.NewTicker(confirmedEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			c.write(ctx)
		}
	}
}

// write records the tracker's acknowledged point if it moved.
func (c *confirmedRecorder) write(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.r
	at := r.tracker.SafeTime()
	if c.gaveUp || at.IsZero() || !at.After(c.recorded) {
		return
	}
	if c.conn == nil {
		conn, err := r.cfg.Replication.Connect(ctx)
		if err != nil {
			r.log.Debug("record the acknowledged position: cannot connect", zap.Error(err))
			return
		}
		c.conn = conn
	}
	err := c.ledger.RecordConfirmed(ctx, c.conn, r.cfg.Replication.Slot, replication.Confirmed{CommitTime: at, EndLSN: r.tracker.Safe()})
	if err == nil {
		c.recorded = at
		return
	}
	var pgErr *pgconn.PgError
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, replication.ErrLedgerNotMigrated) || errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42501"):
		r.log.Warn("cannot record in the slot ledger how far Kafka has acknowledged, so a lost slot could not be recovered automatically: run outbox-relay migrate, and grant the relay's role INSERT and UPDATE on the ledger", zap.Error(err))
		c.gaveUp = true
	case !c.warned:
		r.log.Warn("cannot record in the slot ledger how far Kafka has acknowledged (retrying); a lost slot's recovery would start from an older point, publishing more twice", zap.Error(err))
		c.warned = true
	}
	c.closeLocked(ctx)
}

// close closes the recorder's connection, within ctx.
func (c *confirmedRecorder) close(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked(ctx)
}

func (c *confirmedRecorder) closeLocked(ctx context.Context) {
	if c.conn != nil {
		c.conn.Close(ctx)
		c.conn = nil
	}
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// KeepFrom is the creation time from which outbox rows must stay for a recovery of slot's gap (the
// ledger's last acknowledged commit, or the recovery under way, or the slot's creation, less the
// margin and the commit skew): the guard on pruning. ok is false when the ledger cannot say (no
// ledger, not migrated, no entry): pruning then goes by its age alone.
//
// strict (on_slot_lost: recover) makes a ledger the role may not read an error: pruning by age
// alone could then delete the gap a recovery would publish as whole.
func KeepFrom(ctx context.Context, q querier, schema, slot string, margin time.Duration, strict bool) (from time.Time, ok bool, err error) {
	ledger := replication.NewLedger(schema)
	if exists, err := ledger.Exists(ctx, q); err != nil || !exists {
		return time.Time{}, false, err
	}
	st, err := ledger.Recovery(ctx, q, slot)
	if strict && (errors.Is(err, replication.ErrLedgerNotMigrated) || denied(err)) {
		return time.Time{}, false, fmt.Errorf("on_slot_lost is recover, so pruning keeps what a lost slot's recovery needs, but it cannot read the slot ledger %s (run outbox-relay migrate; GRANT SELECT, UPDATE ON it to the pruning role): %w", ledger.Table(), err)
	}
	if errors.Is(err, replication.ErrLedgerNotMigrated) || denied(err) {
		return time.Time{}, false, nil // pruning's role may not read it: by age alone, as before
	}
	if err != nil {
		return time.Time{}, false, err
	}
	since := st.Since
	for _, t := range []time.Time{st.Confirmed.CommitTime, st.SlotCreated} {
		if since.IsZero() {
			since = t
		}
	}
	if since.IsZero() {
		return time.Time{}, false, nil
	}
	if margin, err = recoveryMargin(ctx, q, margin); err != nil {
		return time.Time{}, false, err
	}
	return since.Add(-commitSkew - margin), true, nil
}

// RecordPruned notes in the slot ledger that pruning deleted rows created before before, so that a
// recovery knows whether its gap is whole. Without a ledger (or one not migrated) it does nothing.
func RecordPruned(ctx context.Context, q querier, schema, slot string, before time.Time, strict bool) error {
	ledger := replication.NewLedger(schema)
	if exists, err := ledger.Exists(ctx, q); err != nil || !exists {
		return err
	}
	err := ledger.RecordPruned(ctx, q, slot, before)
	if !strict && (errors.Is(err, replication.ErrLedgerNotMigrated) || denied(err)) {
		return nil
	}
	return err
}

// denied reports a PostgreSQL insufficient_privilege error.
func denied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}
