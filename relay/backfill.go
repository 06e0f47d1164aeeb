package relay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
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
	// Where is an extra SQL predicate on the outbox table, written by the operator.
	Where string
}

// backfill publishes the outbox rows that predate the stream. With a snapshot exported by the
// slot's creation, the rows it shows are exactly those committed before the slot's consistent
// point, so together with the stream nothing is missed and nothing is published twice. Without one
// (the slot already existed), it runs only if the slot ledger records no completed backfill for the
// slot — a relay that stopped mid-backfill, or one that just enabled it — and then reads the table
// as it is now, which may publish some events twice but loses none.
func (r *Relay) backfill(ctx context.Context, snapshot string) error {
	b := r.cfg.Backfill
	rc := r.cfg.Replication
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
		r.log.Warn("no completed backfill is recorded for this slot (a previous start stopped mid-backfill, or backfill was just enabled); backfilling from the table's current rows, so some events may be published twice",
			zap.String("slot", rc.Slot))
	}

	started := time.Now()
	n, err := r.publishRows(ctx, conn, snapshot, b)
	if err != nil {
		return err
	}
	if err := ledger.RecordBackfill(ctx, conn, rc.Slot, n); err != nil {
		return fmt.Errorf("record the completed backfill in %s (the relay's role needs INSERT and UPDATE on it): %w", replication.LedgerTable, err)
	}
	r.log.Info("backfill complete", zap.Int64("events", n), zap.Duration("took", time.Since(started)),
		zap.Bool("from_slot_snapshot", snapshot != ""))
	return nil
}

// publishRows reads the rows in the snapshot (or as they are now) and publishes them in OrderColumn
// order, returning once Kafka has acknowledged them all.
func (r *Relay) publishRows(ctx context.Context, conn *pgx.Conn, snapshot string, b *Backfill) (int64, error) {
	rc := r.cfg.Replication
	if rc.Schema == "" {
		rc.Schema = "public"
	}
	cols := r.cfg.Decoder.Columns
	created := b.CreatedColumn
	if created == "" {
		created = "created_at"
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if snapshot != "" {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
			return 0, fmt.Errorf("use the slot's snapshot: %w", err)
		}
	}
	// Timestamps in the format the stream reads (its connection sets the same).
	if _, err := tx.Exec(ctx, "SET LOCAL DateStyle = ISO"); err != nil {
		return 0, fmt.Errorf("set DateStyle for the backfill: %w", err)
	}
	table := pgx.Identifier{rc.Schema, rc.Table}.Sanitize()
	if ok, err := replication.HasColumn(ctx, tx, table, created); err != nil {
		return 0, fmt.Errorf("backfill: %w", err)
	} else if !ok {
		return 0, replication.Fatal(fmt.Errorf("columns.created_at %q: the outbox table %s has no such column; the backfill reads each row's creation time from it (the record timestamp, and backfill_since): name the table's creation time column in columns.created_at, or add one (Debezium's outbox table has none), or start without backfill", created, table))
	}
	order, err := r.backfillOrder(ctx, tx, table, b.OrderColumn, created, cols.ID)
	if err != nil {
		return 0, err
	}

	// Every column comes back in text form, as pgoutput sends it, so events look the same
	// whichever way they were read.
	selected := r.cfg.Decoder.RowColumns()
	quoted := make([]string, len(selected))
	for i, c := range selected {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	where := []string{"true"}
	var args []any
	if !b.Since.IsZero() {
		args = append(args, b.Since)
		where = append(where, fmt.Sprintf("%s >= $1", pgx.Identifier{created}.Sanitize()))
	}
	if b.Where != "" {
		where = append(where, "("+b.Where+")")
	}
	query := fmt.Sprintf("SELECT %s, %s FROM %s WHERE %s ORDER BY %s",
		strings.Join(quoted, ", "), pgx.Identifier{created}.Sanitize(), table, strings.Join(where, " AND "), order)
	rows, err := tx.Query(ctx, query, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	if err != nil {
		return 0, fmt.Errorf("read the outbox table: %w", err)
	}
	defer rows.Close()

	oids := make([]uint32, 0, len(selected))
	for _, f := range rows.FieldDescriptions()[:len(selected)] {
		oids = append(oids, f.DataTypeOID)
	}
	var acks sink.AckGroup
	var n int64
	for rows.Next() {
		raw := rows.RawValues()
		vals := make([][]byte, len(raw))
		for i, v := range raw {
			if v != nil {
				vals[i] = append([]byte{}, v...) // RawValues is reused by the next row
			}
		}
		ch, err := r.cfg.Decoder.FromRow(vals[:len(vals)-1], oids)
		if err != nil {
			return n, err
		}
		ev := ch.Event
		if t, err := decoder.ParseTimestamp(vals[len(vals)-1], true); err == nil { // any offset: +05:30 too
			ev.Tx.CommitTime = t
		}
		acks.Add()
		publish := r.sink.Publish
		if ch.Unusable != nil {
			publish = r.reject(ch.Unusable) // to the failure policy, as from the stream
		}
		if err := publish(ctx, ev, &acks); err != nil {
			return n, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("read the outbox table: %w", err)
	}
	if err := acks.Wait(ctx); err != nil {
		return n, fmt.Errorf("waiting for Kafka to acknowledge the backfill: %w", err)
	}
	return n, nil
}

// defaultOrderColumn is the insertion sequence `outbox-relay migrate` adds.
const defaultOrderColumn = "seq"

// backfillOrder returns the ORDER BY list: the insertion sequence column when the table has it.
// Without the default one (a table of the user's own), the creation time and the id, with a
// warning that this order is not insertion order; without a column the operator named, an error:
// a typo must not quietly cost the order it was named for.
func (r *Relay) backfillOrder(ctx context.Context, tx pgx.Tx, table, column, created, id string) (string, error) {
	if column == "" {
		column = defaultOrderColumn
	}
	exists, err := replication.HasColumn(ctx, tx, table, column)
	if err != nil {
		return "", fmt.Errorf("backfill: %w", err)
	}
	if exists {
		// The id breaks ties, should the column not be unique.
		return pgx.Identifier{column}.Sanitize() + ", " + pgx.Identifier{id}.Sanitize(), nil
	}
	if column != defaultOrderColumn {
		return "", replication.Fatal(fmt.Errorf("backfill_order_column %q: the outbox table %s has no such column; name its insertion sequence column, or leave the key unset to use seq (which `outbox-relay migrate` adds)", column, table))
	}
	r.log.Warn("the outbox table has no insertion sequence column, so the backfill publishes in creation time order: events of one aggregate written in one transaction, or by transactions that started in another order than they committed, may go out of order. Run `outbox-relay migrate` (it adds seq) or name your table's sequence column in backfill_order_column",
		zap.String("table", table), zap.String("backfill_order_column", column))
	return pgx.Identifier{created}.Sanitize() + ", " + pgx.Identifier{id}.Sanitize(), nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
