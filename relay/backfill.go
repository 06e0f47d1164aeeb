package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/outboxrow"
	"github.com/outbox-relay/outbox-relay/replication"
)

// Backfill configures publishing the rows already in the outbox table on first start.
type Backfill struct {
	// Since limits the backfill to rows whose CreatedColumn is at or after it; zero means all rows.
	Since time.Time
	// CreatedColumn is what Since applies to. Default "created_at".
	CreatedColumn string
	// OrderColumn orders the backfill: an insertion sequence such as the seq identity column that
	// `outbox-relay migrate` adds. Default "seq". Rows are published in its order, so the events of
	// one aggregate go out in insertion order, which is commit order when the writers of one
	// aggregate serialise on it. When the table has no such column (a table of the user's own
	// making), the backfill falls back to CreatedColumn and the id, with a warning: that order
	// is the transactions' start order, and random inside one transaction. Any other column that
	// the table lacks is an error.
	OrderColumn string
	// Where is an extra SQL predicate on the outbox table, written by the operator. It is sent
	// with the extended protocol, which takes one statement only, inside the read-only
	// transaction: a filter that closes its parenthesis and adds statements (a COMMIT, a DELETE)
	// is a syntax error, never run.
	Where string
}

// backfill publishes the outbox rows that predate the stream. With a snapshot exported by the
// slot's creation, the rows it shows are exactly those committed before the slot's consistent
// point, so together with the stream nothing is missed and nothing is published twice. Without one
// (the slot already existed), it runs only if the slot ledger records no completed backfill for the
// slot — a relay that stopped mid-backfill, or one that just enabled it — and then reads the table
// as it is now, which may publish some events twice but loses none.
func (w *walSource) backfill(ctx context.Context, snapshot string) error {
	b := w.cfg.Backfill
	rc := w.cfg.Replication
	conn, err := rc.Connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	ledger := replication.NewLedger(rc.Schema)
	if exists, err := ledger.Exists(ctx, conn); err != nil {
		return fmt.Errorf("look for the slot ledger: %w", err)
	} else if !exists {
		return replication.Fatal(fmt.Errorf("backfill needs the slot ledger table %s to remember that it is done: run outbox-relay migrate", replication.LedgerTable))
	}
	if snapshot == "" {
		e, _, err := ledger.Lookup(ctx, conn, rc.Slot)
		if err != nil {
			return err
		}
		if e.BackfillDone {
			return nil
		}
		w.log.Warn("no completed backfill is recorded for this slot (a previous start stopped mid-backfill, or backfill was just enabled); backfilling from the table's current rows, so some events may be published twice",
			zap.String("slot", rc.Slot))
	}

	started := time.Now()
	n, err := w.publishRows(ctx, conn, snapshot, b)
	if err := w.cancelledReads.note(ctx, "the backfill's rows", err); err != nil {
		return err
	}
	record := conn
	if rc.PrimaryDSN != "" {
		// Decoding on a standby: the rows were read there, and the ledger is written on the
		// primary, which the standby refuses.
		pconn, err := rc.ConnectPrimary(ctx)
		if err != nil {
			return fmt.Errorf("record the completed backfill in %s: connect to the primary: %w", replication.LedgerTable, err)
		}
		defer pconn.Close(context.WithoutCancel(ctx))
		record = pconn
	}
	if err := ledger.RecordBackfill(ctx, record, rc.Slot, n); err != nil {
		return fmt.Errorf("record the completed backfill in %s (the relay's role needs INSERT and UPDATE on it): %w", replication.LedgerTable, err)
	}
	w.log.Info("backfill complete", zap.Int64("events", n), zap.Duration("took", time.Since(started)),
		zap.Bool("from_slot_snapshot", snapshot != ""))
	return nil
}

// publishRows reads the rows in the snapshot (or as they are now) and publishes them in OrderColumn
// order, returning once Kafka has acknowledged them all.
func (w *walSource) publishRows(ctx context.Context, conn *pgx.Conn, snapshot string, b *Backfill) (int64, error) {
	tx, err := outboxrow.Begin(ctx, conn, snapshot)
	if err != nil {
		return 0, err
	}
	defer rollback(ctx, tx)
	t, err := w.outboxTable(ctx, tx, b.CreatedColumn, b.OrderColumn)
	if err != nil {
		return 0, err
	}
	var q rowQuery
	if !b.Since.IsZero() {
		q.args = append(q.args, b.Since)
		q.where = append(q.where, fmt.Sprintf("%s >= $1", t.created))
	}
	if b.Where != "" {
		// Checked on its own first, so a filter that is not one condition stops the relay with an
		// error naming the key, rather than a retried query error.
		// pgconn's ExecParams is the extended protocol whatever the arguments (pgx's Exec falls
		// back to the simple protocol, which runs several statements, when there are none).
		// One statement is not yet one condition: "x) OR (true" closes the parenthesis and ORs
		// away the conditions beside it, and a "--" comment swallows the rest of its line (the
		// ORDER BY: per-aggregate order lost). So the filter stands on lines of its own, and must
		// parse both inside ( ) and inside ARRAY[ ]: it is lexed alike in both, and a bracket it
		// leaves unmatched to escape one is a syntax error in the other.
		cond := "(\n" + b.Where + "\n)"
		check := fmt.Sprintf("SELECT 1 FROM %s WHERE %s AND ARRAY[\n%s\n] IS NOT NULL LIMIT 0", t.name, cond, b.Where)
		if _, err := tx.Conn().PgConn().ExecParams(ctx, check, nil, nil, nil, nil).Close(); err != nil {
			return 0, replication.Fatal(fmt.Errorf("backfill_where %q is not one SQL condition on the outbox table %s (it runs alone, read-only, as WHERE (...)): %w; fix the key", b.Where, t.name, err))
		}
		q.where = append(q.where, cond)
	}
	n, _, err := w.publishSelected(ctx, tx, t, q)
	return n, err
}
