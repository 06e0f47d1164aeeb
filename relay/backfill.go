package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxrow"
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
	if err := r.cancelledReads.note(ctx, "the backfill's rows", err); err != nil {
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
	tx, err := outboxrow.Begin(ctx, conn, snapshot)
	if err != nil {
		return 0, err
	}
	defer rollback(ctx, tx)
	t, err := r.outboxTable(ctx, tx, b.CreatedColumn, b.OrderColumn)
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
	n, _, err := r.publishSelected(ctx, tx, t, q)
	return n, err
}

// rollback ends a read of the outbox table under the caller's context. A ROLLBACK waits for the
// server's answer, and a fence or a stop must not wait for a server that has gone silent (a cut
// network answers nothing until it heals, long after the next leader took over): a ROLLBACK cut
// short closes the connection, which ends the read-only transaction all the same.
func rollback(ctx context.Context, tx pgx.Tx) { _ = tx.Rollback(ctx) }

// cancelledReads counts the reads of the outbox table (a backfill, a lost slot's recovery) that
// PostgreSQL cancelled in a row. With the role's timeouts cleared, what still cancels one is
// outside the relay (a watchdog's pg_cancel_backend, a timeout the role cannot lift): every
// session would begin the read again from its start, duplicates growing, for ever. After
// maxCancelledReads the relay stops instead, saying so.
type cancelledReads struct {
	mu sync.Mutex
	n  int
}

// maxCancelledReads is how many cancellations in a row end the relay: one may be a DBA's
// one-off; three is a rule.
const maxCancelledReads = 3

// note is called with the outcome of a read of the outbox table (what: of what, for the line); it
// returns err, made fatal once cancellations repeat. A success starts the count again.
func (c *cancelledReads) note(ctx context.Context, what string, err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.n = 0
		return nil
	}
	var pgErr *pgconn.PgError
	if ctx.Err() != nil || !errors.As(err, &pgErr) {
		return err // a stop cancels the read too (pgx sends a cancel request): not counted
	}
	switch pgErr.Code {
	case "57014", // query_canceled: statement_timeout, pg_cancel_backend
		"25P03", // idle_in_transaction_session_timeout
		"25P04": // transaction_timeout
	default:
		return err
	}
	c.n++
	if c.n < maxCancelledReads {
		return err
	}
	return replication.Fatal(fmt.Errorf("PostgreSQL cancelled the read of %s from the outbox table %d times in a row (%s, SQLSTATE %s), although the relay clears statement_timeout, transaction_timeout and idle_in_transaction_session_timeout for it: something else cancels the relay's long statements (a watchdog calling pg_cancel_backend, a setting the role cannot lift). Exempt the relay's role from it and start again; nothing past what Kafka acknowledged is confirmed, and the next start begins the read again: %w",
		what, c.n, pgErr.Message, pgErr.Code, err))
}

// outboxTable is the outbox table as a read of its rows needs it, every name quoted.
type outboxTable struct {
	name    string // schema-qualified
	created string // the creation time column
	order   string // the ORDER BY list
	rows    outboxrow.Reader
}

// outboxTable checks the columns a read of the table relies on and chooses its order.
func (r *Relay) outboxTable(ctx context.Context, tx pgx.Tx, createdColumn, orderColumn string) (outboxTable, error) {
	rc := r.cfg.Replication
	if rc.Schema == "" {
		rc.Schema = "public"
	}
	if createdColumn == "" {
		createdColumn = "created_at"
	}
	table := pgx.Identifier{rc.Schema, rc.Table}.Sanitize()
	if ok, err := outboxrow.HasColumn(ctx, tx, table, createdColumn); err != nil {
		return outboxTable{}, err
	} else if !ok {
		return outboxTable{}, replication.Fatal(fmt.Errorf("columns.created_at %q: the outbox table %s has no such column; reading rows from the table (a backfill, a lost slot's recovery) needs each row's creation time from it (the record timestamp, which rows to read): name the table's creation time column in columns.created_at, or add one (Debezium's outbox table has none)", createdColumn, table))
	}
	order, err := r.backfillOrder(ctx, tx, table, orderColumn, createdColumn, r.cfg.Decoder.Columns.ID)
	if err != nil {
		return outboxTable{}, err
	}
	return outboxTable{name: table, created: pgx.Identifier{createdColumn}.Sanitize(), order: order,
		rows: outboxrow.NewReader(r.cfg.Decoder, createdColumn)}, nil
}

// rowQuery chooses outbox rows to publish.
type rowQuery struct {
	where []string // ANDed; none: every row
	args  []any
	// flag, when set, is a boolean SQL expression over the row: publishSelected counts the rows it
	// holds for.
	flag string
	// stamp, when set, is called with each event before it is published, and its place (from 0).
	stamp func(ev *decoder.Event, n int64)
}

// publishSelected publishes the rows q chooses in t.order, returning once Kafka has acknowledged
// them all: how many, and how many of them q.flag held for.
func (r *Relay) publishSelected(ctx context.Context, tx pgx.Tx, t outboxTable, q rowQuery) (n, flagged int64, err error) {
	where := append([]string{"true"}, q.where...)
	query := fmt.Sprintf("SELECT %s, coalesce(%s, false) FROM %s WHERE %s ORDER BY %s",
		t.rows.Select(""), cmp.Or(q.flag, "false"), t.name, strings.Join(where, " AND "), t.order)
	if err := outboxrow.ClearTimeouts(ctx, tx); err != nil {
		return 0, 0, err
	}
	// The extended protocol (one statement: backfill_where cannot add any) with text results;
	// pgx's Query keeps to it without arguments too (unlike its Exec).
	rows, err := t.rows.Query(ctx, tx, query, append([]any{pgx.QueryExecModeExec}, q.args...)...)
	if err != nil {
		return 0, 0, fmt.Errorf("read the outbox table: %w", err)
	}
	defer rows.Close()
	var acks sink.AckGroup
	for rows.Next() {
		row := rows.Row()
		if string(row.Rest[0]) == "t" {
			flagged++
		}
		if q.stamp != nil {
			q.stamp(row.Event, n)
		}
		acks.Add()
		publish := r.sink.Publish
		if row.Unusable != nil {
			publish = r.reject(row.Unusable) // to the failure policy, as from the stream
		}
		if err := publish(ctx, row.Event, &acks); err != nil {
			return n, flagged, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, flagged, fmt.Errorf("read the outbox table: %w", err)
	}
	if err := acks.Wait(ctx); err != nil {
		return n, flagged, fmt.Errorf("waiting for Kafka to acknowledge: %w", err)
	}
	return n, flagged, nil
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
	exists, err := outboxrow.HasColumn(ctx, tx, table, column)
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
