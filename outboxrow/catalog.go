package outboxrow

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// QueryRower is a connection or a transaction.
type QueryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// HasColumn reports whether table (a name regclass accepts, e.g. a sanitized identifier) has the
// column, for readers of the outbox table that name what is missing.
func HasColumn(ctx context.Context, q QueryRower, table, column string) (bool, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname = $2 AND attnum > 0 AND NOT attisdropped)`, table, column).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for the column %q in %s: %w", column, table, err)
	}
	return exists, nil
}

// IsIntegerColumn reports whether the column of table is of an integer or numeric type, which
// orders and compares as numbers (a text version column would sort "10" before "9").
func IsIntegerColumn(ctx context.Context, q QueryRower, table, column string) (bool, error) {
	var ok bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname = $2 AND attnum > 0 AND NOT attisdropped
		  AND atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'numeric'::regtype))`, table, column).Scan(&ok); err != nil {
		return false, fmt.Errorf("look up the type of column %q in %s: %w", column, table, err)
	}
	return ok, nil
}
