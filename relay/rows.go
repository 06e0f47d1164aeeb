package relay

// The relay's reads of the outbox table, shared by the backfill and a lost slot's recovery: the
// table's columns and order checked, the chosen rows read through outboxrow and published, and
// reads that PostgreSQL keeps cancelling turned into a stop.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxrow"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

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
func (w *walSource) outboxTable(ctx context.Context, tx pgx.Tx, createdColumn, orderColumn string) (outboxTable, error) {
	rc := w.cfg.Replication
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
	order, err := w.backfillOrder(ctx, tx, table, orderColumn, createdColumn, w.cfg.Decoder.Columns.ID)
	if err != nil {
		return outboxTable{}, err
	}
	return outboxTable{name: table, created: pgx.Identifier{createdColumn}.Sanitize(), order: order,
		rows: outboxrow.NewReader(w.cfg.Decoder, createdColumn)}, nil
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
func (w *walSource) publishSelected(ctx context.Context, tx pgx.Tx, t outboxTable, q rowQuery) (n, flagged int64, err error) {
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
		publish := w.sink.Publish
		if row.Unusable != nil {
			publish = w.reject(row.Unusable) // to the failure policy, as from the stream
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
func (w *walSource) backfillOrder(ctx context.Context, tx pgx.Tx, table, column, created, id string) (string, error) {
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
	w.log.Warn("the outbox table has no insertion sequence column, so the backfill publishes in creation time order: events of one aggregate written in one transaction, or by transactions that started in another order than they committed, may go out of order. Run `outbox-relay migrate` (it adds seq) or name your table's sequence column in backfill_order_column",
		zap.String("table", table), zap.String("backfill_order_column", column))
	return pgx.Identifier{created}.Sanitize() + ", " + pgx.Identifier{id}.Sanitize(), nil
}
