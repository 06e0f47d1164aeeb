package outboxrow

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Begin begins the read-only, repeatable read transaction that outbox rows are read in: in
// snapshot, when one is named (a slot's exported snapshot), with timestamps in the format the
// stream reads them (its connection sets the same DateStyle). On an error it rolls back under ctx
// (see the caller's rollback).
func Begin(ctx context.Context, conn *pgx.Conn, snapshot string) (pgx.Tx, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	if snapshot != "" {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("use the slot's snapshot: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, "SET LOCAL DateStyle = ISO"); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("set DateStyle: %w", err)
	}
	return tx, nil
}

// ClearTimeouts lifts, for the rest of tx, the timeouts the reading role may carry. A read that
// publishes its rows runs at Kafka's pace, as long as they take to publish: statement_timeout or
// transaction_timeout would cancel it midway (idle_in_transaction_session_timeout, the wait for
// the last acknowledgements), and every session would begin the read again, to be cancelled
// again. transaction_timeout exists from PostgreSQL 17 on; SET LOCAL of it stops its running
// timer.
func ClearTimeouts(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', '0', true), set_config('idle_in_transaction_session_timeout', '0', true),
		CASE WHEN current_setting('transaction_timeout', true) IS NOT NULL THEN set_config('transaction_timeout', '0', true) END`); err != nil {
		return fmt.Errorf("clear statement_timeout, transaction_timeout and idle_in_transaction_session_timeout for the read of the outbox table: %w", err)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
