package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SlotInfo is the state of the replication slot as pg_replication_slots shows it.
type SlotInfo struct {
	Exists         bool
	Plugin         string
	SlotType       string
	Database       string
	Active         bool
	ActivePID      int32
	ConfirmedFlush pglogrepl.LSN
	RestartLSN     pglogrepl.LSN
	WALStatus      string
	// InvalidationReason says why the server will not stream the slot any more (PostgreSQL 17+:
	// wal_removed, rows_removed, wal_level_insufficient, and idle_timeout from 18); "" while
	// usable or on older servers, where wal_status "lost" is all there is.
	InvalidationReason string
}

// querier is the part of pgx.Conn the checks need.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// preflight checks everything the relay needs from the database before it streams, creating the
// publication when allowed, and says what to fix when something is wrong.
func preflight(ctx context.Context, q querier, cfg *Config) error {
	var walLevel string
	if err := q.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return fatalf("wal_level is %q but logical replication needs \"logical\": run ALTER SYSTEM SET wal_level = logical (or set it in postgresql.conf) and restart PostgreSQL", walLevel)
	}

	var role string
	var canReplicate bool
	// Managed services grant replication through a role instead of the attribute (Amazon RDS and
	// Aurora: rds_replication), so membership counts too.
	if err := q.QueryRow(ctx, `SELECT current_user, r.rolreplication OR r.rolsuper OR EXISTS (
			SELECT 1 FROM pg_roles g WHERE g.rolname = 'rds_replication' AND pg_has_role(current_user, g.oid, 'member'))
		FROM pg_roles r WHERE r.rolname = current_user`).Scan(&role, &canReplicate); err != nil {
		return fmt.Errorf("read role attributes: %w", err)
	}
	if !canReplicate {
		return fatalf("role %q lacks the REPLICATION attribute: run ALTER ROLE %s REPLICATION (as a superuser)", role, pgx.Identifier{role}.Sanitize())
	}

	if cfg.NoTable {
		return EnsureMessagePublication(ctx, q, cfg.Publication, cfg.CreatePublication)
	}
	if err := checkTable(ctx, q, cfg); err != nil {
		return err
	}
	return EnsurePublication(ctx, q, cfg.Publication, cfg.Schema, cfg.Table, cfg.CreatePublication)
}

// EnsureMessagePublication checks that publication exists, for a relay whose outbox is logical
// decoding messages only: pgoutput needs a publication to start, but sends messages whatever it
// publishes. A missing one is created empty when create is set (CREATE on the database suffices,
// no table ownership); an existing one is used as it is, and rows of its tables are ignored.
func EnsureMessagePublication(ctx context.Context, q querier, publication string, create bool) error {
	pub := pgx.Identifier{publication}.Sanitize()
	var exists bool
	if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", publication).Scan(&exists); err != nil {
		return fmt.Errorf("read publication %q: %w", publication, err)
	}
	if exists {
		return nil
	}
	if !create {
		return fatalf("publication %q does not exist; pgoutput needs one even for logical decoding messages: run `outbox-relay migrate`, or CREATE PUBLICATION %s (without tables: messages do not depend on it)",
			publication, pub)
	}
	_, err := q.Exec(ctx, "CREATE PUBLICATION "+pub)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" {
		return nil // another instance created it a moment ago
	}
	if err != nil {
		return fatalf("create publication %q: %w (the role needs CREATE on the database; or create it once: CREATE PUBLICATION %s)", publication, err, pub)
	}
	return nil
}

func checkTable(ctx context.Context, q querier, cfg *Config) error {
	table := cfg.qualifiedTable()
	rows, err := q.Query(ctx, `SELECT a.attname FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, table)
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", table, err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", table, err)
	}
	if len(have) == 0 {
		return fatalf("outbox table %s does not exist: run `outbox-relay migrate`, or set table to the outbox table's name", table)
	}
	var missing []string
	for _, c := range cfg.Columns {
		found := false
		for _, h := range have {
			found = found || h == c
		}
		if !found {
			missing = append(missing, fmt.Sprintf("%q", c))
		}
	}
	if len(missing) > 0 {
		return fatalf("outbox table %s has no column %s (it has %s): add the column or fix the columns.* settings",
			table, strings.Join(missing, ", "), strings.Join(have, ", "))
	}
	return nil
}

// EnsurePublication checks that publication exists, publishes INSERTs and includes the outbox
// table (listed, its schema published, or FOR ALL TABLES) with neither a row filter nor a column
// list; when it does not exist and create is set, it creates it for INSERTs on that table only.
//
// A partitioned outbox needs publish_via_partition_root: without it pgoutput names the leaf
// partitions instead of the table. The publication is created with it (it changes nothing for a
// plain table); an existing one without it is altered when create is set, and refused otherwise.
// WAL written before the change still names the leaves (pgoutput decodes with the catalog of the
// time); the relay recognises those through BelongsToOutbox.
func EnsurePublication(ctx context.Context, q querier, publication, schema, tableName string, create bool) error {
	cfg := &Config{Publication: publication, Schema: schema, Table: tableName}
	table := cfg.qualifiedTable()
	var exists bool
	if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", cfg.Publication).Scan(&exists); err != nil {
		return fmt.Errorf("read publication %q: %w", cfg.Publication, err)
	}
	if !exists {
		if !create {
			return fatalf("publication %q does not exist: run `outbox-relay migrate`, or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
				cfg.Publication, pgx.Identifier{cfg.Publication}.Sanitize(), table)
		}
		_, err := q.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
			pgx.Identifier{cfg.Publication}.Sanitize(), pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			return nil // another instance created it a moment ago
		}
		if err != nil {
			return fatalf("create publication %q for %s: %w (create it as the table owner, or grant the relay's role ownership of the table)", cfg.Publication, table, err)
		}
		return nil
	}
	// The same rules as the publication check while streaming (membership.go).
	m, err := readMembership(ctx, q, table, cfg.Publication)
	if err != nil {
		return err
	}
	if err := m.problem(table, cfg.Publication); err != nil {
		return err
	}
	partitioned, viaRoot := m.partitioned, m.viaRoot
	if partitioned && !viaRoot {
		alter := fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pgx.Identifier{cfg.Publication}.Sanitize())
		if !create {
			return fatalf("outbox table %s is partitioned but publication %q does not publish via the partition root, so its rows would arrive under the partitions' names: run %s (or set create_publication to let the relay do it)",
				table, cfg.Publication, alter)
		}
		if _, err := q.Exec(ctx, alter); err != nil {
			return fatalf("%s: %w (run it as the publication's owner)", alter, err)
		}
	}
	return nil
}

// ReadSlot returns the slot's row in pg_replication_slots; Exists is false when there is none.
func ReadSlot(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, slot string) (SlotInfo, error) {
	var s SlotInfo
	var database, walStatus, reason *string
	var pid *int32
	var confirmed, restart *string
	// invalidation_reason through to_jsonb: NULL, not an error, on a server without the column.
	// PostgreSQL 16 has no invalidation_reason, and reports a slot a standby invalidated in a
	// recovery conflict with wal_status lost, which alone reads as WAL removed: its conflicting
	// column says which.
	err := q.QueryRow(ctx, `SELECT plugin, slot_type, database, active, active_pid,
			confirmed_flush_lsn::text, restart_lsn::text, wal_status,
			coalesce(to_jsonb(s) ->> 'invalidation_reason', CASE WHEN to_jsonb(s) ->> 'conflicting' = 'true'
				THEN 'a recovery conflict on the standby: rows_removed (hot_standby_feedback off or broken) or wal_level_insufficient' END)
		FROM pg_replication_slots s WHERE slot_name = $1`, slot).
		Scan(&s.Plugin, &s.SlotType, &database, &s.Active, &pid, &confirmed, &restart, &walStatus, &reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotInfo{}, nil
	}
	if err != nil {
		return SlotInfo{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	s.Exists = true
	if database != nil {
		s.Database = *database
	}
	if walStatus != nil {
		s.WALStatus = *walStatus
	}
	if reason != nil {
		s.InvalidationReason = *reason
	}
	if pid != nil {
		s.ActivePID = *pid
	}
	if confirmed != nil {
		if s.ConfirmedFlush, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return SlotInfo{}, fmt.Errorf("slot %q confirmed_flush_lsn: %w", slot, err)
		}
	}
	if restart != nil {
		if s.RestartLSN, err = pglogrepl.ParseLSN(*restart); err != nil {
			return SlotInfo{}, fmt.Errorf("slot %q restart_lsn: %w", slot, err)
		}
	}
	return s, nil
}

// checkSlot refuses a slot the relay cannot use, with the fix in the message.
func checkSlot(s SlotInfo, cfg *Config, database string) error {
	switch {
	case s.SlotType != "logical":
		return fatalf("replication slot %q is a %s slot; the relay needs a logical slot: choose another slot name", cfg.Slot, s.SlotType)
	case s.Plugin != "pgoutput":
		return fatalf("replication slot %q uses output plugin %q; the relay needs pgoutput: choose another slot name, or drop the slot with SELECT pg_drop_replication_slot('%s') if nothing else uses it", cfg.Slot, s.Plugin, cfg.Slot)
	case s.Database != database:
		return fatalf("replication slot %q belongs to database %q, not %q: choose another slot name or point pg_dsn at %q", cfg.Slot, s.Database, database, s.Database)
	case s.InvalidationReason == "idle_timeout":
		return fmt.Errorf("%w: slot %q was invalidated (idle_timeout): nothing streamed it for longer than idle_replication_slot_timeout, so events committed meanwhile may never be published; drop and recreate the slot, then reconcile the outbox rows written since the slot's confirmed position %s, and raise idle_replication_slot_timeout above the longest time the relay may be down", ErrSlotLost, cfg.Slot, s.ConfirmedFlush)
	case s.InvalidationReason != "" && s.InvalidationReason != "wal_removed":
		return fmt.Errorf("%w: slot %q was invalidated (%s), so PostgreSQL can no longer decode changes for it and events committed meanwhile may never be published; drop and recreate the slot, then reconcile the outbox rows written since the slot's confirmed position %s", ErrSlotLost, cfg.Slot, s.InvalidationReason, s.ConfirmedFlush)
	case s.WALStatus == "lost" || s.InvalidationReason == "wal_removed":
		return fmt.Errorf("%w: slot %q has wal_status \"lost\": PostgreSQL removed WAL it still needed (max_slot_wal_keep_size), so events committed meanwhile may never be published; drop and recreate the slot, then reconcile the outbox rows written since the slot's confirmed position %s", ErrSlotLost, cfg.Slot, s.ConfirmedFlush)
	}
	return nil
}

// readMembership reads how publication includes table (membershipSQL) with the extended protocol.
func readMembership(ctx context.Context, q querier, table, publication string) (membership, error) {
	var major int
	if err := q.QueryRow(ctx, "SELECT current_setting('server_version_num')::int / 10000").Scan(&major); err != nil {
		return membership{}, fmt.Errorf("read the server version: %w", err)
	}
	rows, err := q.Query(ctx, membershipSQL(major), table, publication)
	if err != nil {
		return membership{}, fmt.Errorf("read tables of publication %q: %w", publication, err)
	}
	defer rows.Close()
	var m membership
	found := false
	for rows.Next() {
		raw := rows.RawValues()
		row := make([][]byte, len(raw))
		for i, v := range raw {
			if v != nil {
				row[i] = append([]byte{}, v...)
			}
		}
		if m, err = parseMembership(row); err != nil {
			return membership{}, err
		}
		found = true
	}
	if err := rows.Err(); err != nil {
		return membership{}, fmt.Errorf("read tables of publication %q: %w", publication, err)
	}
	if !found {
		return membership{}, fmt.Errorf("read tables of publication %q: no row", publication)
	}
	return m, nil
}
