// Package workload is the load of a chaos run and its observers: writers that write outbox
// transactions (committed, rolled back on purpose, aborted mid-way, or cut off in doubt) and record
// each one in a history, and consumers that read every topic back and record every record. The
// writers and consumers survive the faults a nemesis applies (server restarts, failovers, broker
// stops and freezes): they retry, and never give up on their own.
package workload

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Shape is how events are written.
type Shape int

const (
	Table            Shape = iota // rows of a plain outbox table
	PartitionedTable              // rows of a partitioned outbox table (Prepare makes it)
	Messages                      // transactional logical decoding messages (outbox.Emitter), no table
)

func (s Shape) String() string {
	switch s {
	case Table:
		return "table"
	case PartitionedTable:
		return "partitioned-table"
	case Messages:
		return "messages"
	}
	return fmt.Sprintf("Shape(%d)", int(s))
}

// The tables Prepare creates beside the relay's.
const (
	markerTable = "chaos_markers" // one row per transaction, its Txn.ID: how an in-doubt commit is settled
	otherTable  = "chaos_other"   // load without events
)

// Prepare creates what the writers need beside the relay's migrations (which must have been
// applied): the marker table and the table for load without events, and, for PartitionedTable, the
// outbox table table replaced by a partitioned one with the same columns. Run it before the relays
// first start: dropping the table takes it out of any publication that listed it.
func Prepare(ctx context.Context, dsn string, shape Shape, table string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("workload: prepare: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	stmts := []string{
		"CREATE TABLE IF NOT EXISTS " + markerTable + " (id text PRIMARY KEY, at timestamptz DEFAULT now())",
		"CREATE TABLE IF NOT EXISTS " + otherTable + " (id bigserial, pad text)",
	}
	if shape == PartitionedTable {
		p, err := partitionStatements(ctx, conn, table)
		if err != nil {
			return err
		}
		stmts = append(stmts, p...)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("workload: prepare %s: %w", shape, err)
	}
	return nil
}

// partitionStatements replaces table by a table partitioned by range of created_at, like the
// relay's own partition tests do: a range around now that is itself hash-partitioned (rows land in
// partitions of a partition), a range after it, and a default partition for whatever a long run
// writes after that. The columns are the migration's; the backfill's seq column is left out (an
// identity column on a partitioned table needs PostgreSQL 17, and the stream does not use it). A
// table that is already partitioned is kept.
func partitionStatements(ctx context.Context, conn *pgx.Conn, table string) ([]string, error) {
	var kind string
	if err := conn.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = $1::regclass", table).Scan(&kind); err != nil {
		return nil, fmt.Errorf("workload: prepare: read %s (apply the relay's migrations first): %w", table, err)
	}
	if kind == "p" {
		return nil, nil
	}
	leaf := func(suffix string) string { return pgx.Identifier{tableName(table) + suffix}.Sanitize() }
	schema := schemaName(table)
	if schema != "" {
		leaf = func(suffix string) string { return pgx.Identifier{schema, tableName(table) + suffix}.Sanitize() }
	}
	return []string{
		"DROP TABLE " + table,
		"CREATE TABLE " + table + ` (id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
			aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, headers jsonb,
			created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		"CREATE TABLE " + leaf("_cur") + " PARTITION OF " + table +
			" FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '1 day') PARTITION BY HASH (id)",
		"CREATE TABLE " + leaf("_cur_0") + " PARTITION OF " + leaf("_cur") + " FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
		"CREATE TABLE " + leaf("_cur_1") + " PARTITION OF " + leaf("_cur") + " FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
		"CREATE TABLE " + leaf("_next") + " PARTITION OF " + table +
			" FOR VALUES FROM (now() + interval '1 day') TO (now() + interval '2 days')",
		"CREATE TABLE " + leaf("_default") + " PARTITION OF " + table + " DEFAULT",
	}, nil
}

// schemaName and tableName split "schema.table" (unquoted names, as the harness spells them).
func schemaName(qualified string) string {
	for i := len(qualified) - 1; i >= 0; i-- {
		if qualified[i] == '.' {
			return qualified[:i]
		}
	}
	return ""
}

func tableName(qualified string) string {
	return qualified[len(schemaName(qualified))+min(1, len(schemaName(qualified))):]
}

// errStopped is what a writer's context ends with when Stop stops it.
var errStopped = errors.New("workload: writers stopped")
