package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LedgerTable is the table, in the outbox table's schema, where the relay records the slots it
// created (migrations/0002_slot_ledger.sql). It is optional: without it (or without the right to
// write it) the relay still works, but cannot tell a first start from a lost slot after a restart.
const LedgerTable = "outbox_relay_slots"

// Ledger reads and writes LedgerTable.
type Ledger struct {
	table string // quoted, schema-qualified
}

// NewLedger returns the ledger in schema.
func NewLedger(schema string) Ledger {
	if schema == "" {
		schema = "public"
	}
	return Ledger{table: pgx.Identifier{schema, LedgerTable}.Sanitize()}
}

// Table is the ledger's quoted, schema-qualified name, as an operator types it into SQL.
func (l Ledger) Table() string { return l.table }

// Entry is what the ledger knows of one slot.
type Entry struct {
	Slot              string
	ConsistentLSN     pglogrepl.LSN
	CreatedAt         time.Time
	BackfillDone      bool
	BackfillEvents    int64
	BackfillCompleted time.Time
}

type queryExecer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Exists reports whether the ledger table exists.
func (l Ledger) Exists(ctx context.Context, q queryExecer) (bool, error) {
	var exists bool
	err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", l.table).Scan(&exists)
	return exists, err
}

// Lookup returns the slot's entry; ok is false when the ledger has none (or does not exist).
func (l Ledger) Lookup(ctx context.Context, q queryExecer, slot string) (e Entry, ok bool, err error) {
	if exists, err := l.Exists(ctx, q); err != nil || !exists {
		return Entry{}, false, err
	}
	var lsn *string
	var events *int64
	var completed *time.Time
	err = q.QueryRow(ctx, fmt.Sprintf(`SELECT consistent_lsn::text, created_at, backfill_events, backfill_completed_at
		FROM %s WHERE slot = $1`, l.table), slot).Scan(&lsn, &e.CreatedAt, &events, &completed)
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("read %s: %w", l.table, err)
	}
	e.Slot = slot
	if lsn != nil {
		e.ConsistentLSN, _ = pglogrepl.ParseLSN(*lsn)
	}
	if completed != nil {
		e.BackfillDone, e.BackfillCompleted = true, *completed
	}
	if events != nil {
		e.BackfillEvents = *events
	}
	return e, true, nil
}

// RecordSlot notes that the relay created slot at lsn, replacing what an earlier slot of that name
// left. It returns an error when the ledger cannot be written; callers decide how much that matters.
// The server identity is recorded separately (RecordIdentity), so that a ledger not yet migrated
// to have it still records the slot.
func (l Ledger) RecordSlot(ctx context.Context, q queryExecer, slot string, lsn pglogrepl.LSN) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot, consistent_lsn) VALUES ($1, $2::pg_lsn)
		ON CONFLICT (slot) DO UPDATE SET consistent_lsn = EXCLUDED.consistent_lsn, created_at = now(),
			backfill_events = NULL, backfill_completed_at = NULL`, l.table), slot, lsn.String())
	return err
}

// RecordBackfill notes that the slot's backfill published events and completed.
func (l Ledger) RecordBackfill(ctx context.Context, q queryExecer, slot string, events int64) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot, backfill_events, backfill_completed_at) VALUES ($1, $2, now())
		ON CONFLICT (slot) DO UPDATE SET backfill_events = EXCLUDED.backfill_events, backfill_completed_at = now()`, l.table),
		slot, events)
	return err
}

// Identity is what IDENTIFY_SYSTEM says about a server: the database cluster (system identifier,
// shared by a primary and its physical standbys) and the history of its WAL (timeline, new after
// every promotion).
type Identity struct {
	SystemID string
	Timeline uint32
}

func (id Identity) String() string {
	return fmt.Sprintf("system identifier %s, timeline %d", id.SystemID, id.Timeline)
}

// Identity returns the server the relay last streamed slot from; ok is false when nothing is
// recorded (no entry, no ledger, or a ledger from before migration 0004).
func (l Ledger) Identity(ctx context.Context, q queryExecer, slot string) (id Identity, ok bool, err error) {
	if exists, err := l.Exists(ctx, q); err != nil || !exists {
		return Identity{}, false, err
	}
	var sysID *string
	var timeline *int64
	err = q.QueryRow(ctx, fmt.Sprintf("SELECT system_identifier, timeline FROM %s WHERE slot = $1", l.table), slot).Scan(&sysID, &timeline)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42703": // undefined_column: not migrated
		return Identity{}, false, nil
	case err != nil:
		return Identity{}, false, fmt.Errorf("read %s: %w", l.table, err)
	case sysID == nil:
		return Identity{}, false, nil
	}
	id.SystemID = *sysID
	if timeline != nil {
		id.Timeline = uint32(*timeline)
	}
	return id, true, nil
}

// RecordIdentity notes the server the relay streams slot from.
func (l Ledger) RecordIdentity(ctx context.Context, q queryExecer, slot string, id Identity) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot, system_identifier, timeline) VALUES ($1, $2, $3)
		ON CONFLICT (slot) DO UPDATE SET system_identifier = EXCLUDED.system_identifier, timeline = EXCLUDED.timeline`, l.table),
		slot, id.SystemID, int64(id.Timeline))
	return err
}

// Forget removes the slot's entry: an operator who dropped a slot on purpose and wants the relay to
// start afresh runs `outbox-relay forget-slot`, or deletes the row.
func (l Ledger) Forget(ctx context.Context, q queryExecer, slot string) (bool, error) {
	tag, err := q.Exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE slot = $1", l.table), slot)
	return tag.RowsAffected() > 0, err
}

// PositionRecord is what the ledger says of a slot's exactly-once delivery: that a position was
// committed in Kafka for it, under which transactional id and in which positions topic, and when
// that was first recorded (migrations/0005_exactly_once_positions.sql).
type PositionRecord struct {
	TransactionalID string
	PositionsTopic  string
	Since           time.Time
}

// ErrLedgerNotMigrated means the ledger table lacks columns a feature needs: run migrate.
var ErrLedgerNotMigrated = errors.New("the slot ledger lacks columns of a newer migration")

// Positions returns the slot's exactly-once record; ok is false when there is none. An error wraps
// ErrLedgerNotMigrated when the table predates migration 0005.
func (l Ledger) Positions(ctx context.Context, q queryExecer, slot string) (rec PositionRecord, ok bool, err error) {
	var id, topic *string
	var since *time.Time
	err = q.QueryRow(ctx, fmt.Sprintf("SELECT kafka_transactional_id, kafka_positions_topic, kafka_position_since FROM %s WHERE slot = $1", l.table), slot).
		Scan(&id, &topic, &since)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return PositionRecord{}, false, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42703": // undefined_column
		return PositionRecord{}, false, fmt.Errorf("%w (%s): run outbox-relay migrate", ErrLedgerNotMigrated, pgErr.Message)
	case err != nil:
		return PositionRecord{}, false, fmt.Errorf("read %s: %w", l.table, err)
	case id == nil:
		return PositionRecord{}, false, nil
	}
	rec.TransactionalID = *id
	if topic != nil {
		rec.PositionsTopic = *topic
	}
	if since != nil {
		rec.Since = *since
	}
	return rec, true, nil
}

// RecordPositions notes that a position for slot was committed in Kafka under transactionalID in
// topic.
func (l Ledger) RecordPositions(ctx context.Context, q queryExecer, slot, transactionalID, topic string) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot, kafka_transactional_id, kafka_positions_topic, kafka_position_since) VALUES ($1, $2, $3, now())
		ON CONFLICT (slot) DO UPDATE SET kafka_transactional_id = EXCLUDED.kafka_transactional_id,
			kafka_positions_topic = EXCLUDED.kafka_positions_topic, kafka_position_since = EXCLUDED.kafka_position_since`, l.table),
		slot, transactionalID, topic)
	return err
}

// Holder returns the process that last recorded streaming slot (RecordHolder); ok is false when
// the ledger cannot say (no ledger, no entry, nothing recorded, or a ledger from before migration
// 0006).
func (l Ledger) Holder(ctx context.Context, q queryExecer, slot string) (holder string, ok bool, err error) {
	if exists, err := l.Exists(ctx, q); err != nil || !exists {
		return "", false, err
	}
	var h *string
	err = q.QueryRow(ctx, fmt.Sprintf("SELECT streamed_by FROM %s WHERE slot = $1", l.table), slot).Scan(&h)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42703": // undefined_column: not migrated
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read %s: %w", l.table, err)
	case h == nil:
		return "", false, nil
	}
	return *h, true, nil
}

// RecordHolder notes that the process holder streams slot now.
func (l Ledger) RecordHolder(ctx context.Context, q queryExecer, slot, holder string) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot, streamed_by, streamed_since) VALUES ($1, $2, now())
		ON CONFLICT (slot) DO UPDATE SET streamed_by = EXCLUDED.streamed_by, streamed_since = EXCLUDED.streamed_since`, l.table),
		slot, holder)
	return err
}

// Confirmed is how far Kafka holds the slot's events, as the ledger last recorded it: every event
// of the transactions up to the one that committed at CommitTime (by the server's clock) and ended
// at EndLSN. It trails the truth by the recording interval, which costs a recovery duplicates,
// never events.
type Confirmed struct {
	CommitTime time.Time
	EndLSN     pglogrepl.LSN
	// Xmin is a horizon PostgreSQL reported (0: none recorded): the xmin of a snapshot taken while
	// the WAL's insert position was at or before EndLSN, a full transaction id. Every transaction
	// with a lower id had ended then, so Kafka holds its events; every row of a lost slot's gap
	// was written by a transaction with this id or a later one (migration 0008).
	Xmin uint64
}

// RecordConfirmed notes c for slot. The recorded commit time never moves back: a later write with
// an earlier time (a process that started from an older position) leaves it. The horizon never
// moves back either, and is recorded also without a commit time (a slot whose outbox is idle): a
// horizon is valid for every later point, so the newest one recorded is the tightest.
func (l Ledger) RecordConfirmed(ctx context.Context, q queryExecer, slot string, c Confirmed) error {
	var commit *time.Time
	var end, xmin *string
	if !c.CommitTime.IsZero() {
		s := c.EndLSN.String()
		commit, end = &c.CommitTime, &s
	}
	if c.Xmin != 0 {
		s := strconv.FormatUint(c.Xmin, 10)
		xmin = &s
	}
	_, err := q.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s AS l (slot, confirmed_commit_time, confirmed_end_lsn, confirmed_xmin) VALUES ($1, $2, $3::pg_lsn, $4::xid8)
		ON CONFLICT (slot) DO UPDATE SET
			confirmed_commit_time = CASE WHEN `+newerCommit+` THEN EXCLUDED.confirmed_commit_time ELSE l.confirmed_commit_time END,
			confirmed_end_lsn = CASE WHEN `+newerCommit+` THEN EXCLUDED.confirmed_end_lsn ELSE l.confirmed_end_lsn END,
			confirmed_xmin = greatest(l.confirmed_xmin, EXCLUDED.confirmed_xmin)
		WHERE `+newerCommit+` OR EXCLUDED.confirmed_xmin > l.confirmed_xmin OR (l.confirmed_xmin IS NULL AND EXCLUDED.confirmed_xmin IS NOT NULL)`, l.table),
		slot, commit, end, xmin)
	return notMigrated(err)
}

// newerCommit is true when a RecordConfirmed's commit time is later than the recorded one.
const newerCommit = `(EXCLUDED.confirmed_commit_time IS NOT NULL AND (l.confirmed_commit_time IS NULL OR l.confirmed_commit_time < EXCLUDED.confirmed_commit_time))`

// RecoveryState is what the ledger knows that a lost slot's recovery needs, and what the last
// recovery did.
type RecoveryState struct {
	// Confirmed is zero when nothing was recorded (a slot that never had an event acknowledged,
	// or streamed only by relays from before migration 0007); Confirmed.Xmin is zero when no
	// horizon was recorded (relays from before migration 0008, or a loss in a slot's first
	// seconds).
	Confirmed Confirmed
	// Since is set while a recovery is under way: the commit time its gap starts from. A process
	// that finds it set starts that recovery again from the same point. SinceCreation says Since
	// is the lost slot's creation time.
	Since         time.Time
	SinceCreation bool
	// SlotCreated is when the relay created the slot (zero when the ledger has no entry).
	SlotCreated time.Time
	// PrunedThrough is the newest creation time the relay's pruning deleted (zero: none recorded).
	PrunedThrough time.Time
	// Last is the last completed recovery (Last.At zero: none).
	Last Recovery
}

// Recovery describes one completed recovery of a lost slot.
type Recovery struct {
	At     time.Time     // when it completed
	Events int64         // rows published from the outbox table
	From   time.Time     // the commit time the gap started after
	Rule   string        // how rows were chosen: RuleCommitTime or RuleCreatedAt
	Took   time.Duration // from the new slot's creation to Kafka's last acknowledgement
}

// The rules by which a recovery chooses the outbox rows of the gap.
const (
	// RuleCommitTime chooses rows by their transaction's commit time (track_commit_timestamp).
	RuleCommitTime = "commit_time"
	// RuleCreatedAt chooses rows by their creation time, from a margin before the gap: only with
	// slot_recovery_margin set, when nothing PostgreSQL recorded bounds the gap.
	RuleCreatedAt = "created_at"
	// RuleXmin chooses rows by their transaction id, from the horizon recorded with the last
	// acknowledged commit (Confirmed.Xmin).
	RuleXmin = "xmin"
)

// Recovery reads slot's recovery state. An error wraps ErrLedgerNotMigrated when the table predates
// migration 0008.
func (l Ledger) Recovery(ctx context.Context, q queryExecer, slot string) (RecoveryState, error) {
	var st RecoveryState
	var commit, since, created, pruned, at, from *time.Time
	var endLSN, rule, xmin *string
	var events *int64
	var took *time.Duration
	var fromCreation *bool
	err := q.QueryRow(ctx, fmt.Sprintf(`SELECT confirmed_commit_time, confirmed_end_lsn::text, confirmed_xmin::text, recovery_since, recovery_from_creation, created_at, pruned_through,
			recovered_at, recovered_events, recovered_from, recovered_rule, recovered_took
		FROM %s WHERE slot = $1`, l.table), slot).
		Scan(&commit, &endLSN, &xmin, &since, &fromCreation, &created, &pruned, &at, &events, &from, &rule, &took)
	if errors.Is(err, pgx.ErrNoRows) {
		return RecoveryState{}, nil
	}
	if err != nil {
		return RecoveryState{}, notMigrated(err)
	}
	set := func(dst *time.Time, src *time.Time) {
		if src != nil {
			*dst = *src
		}
	}
	set(&st.Confirmed.CommitTime, commit)
	set(&st.Since, since)
	set(&st.SlotCreated, created)
	set(&st.PrunedThrough, pruned)
	set(&st.Last.At, at)
	set(&st.Last.From, from)
	st.SinceCreation = fromCreation != nil && *fromCreation
	if endLSN != nil {
		st.Confirmed.EndLSN, _ = pglogrepl.ParseLSN(*endLSN)
	}
	if xmin != nil {
		if st.Confirmed.Xmin, err = strconv.ParseUint(*xmin, 10, 64); err != nil {
			return RecoveryState{}, fmt.Errorf("read %s: confirmed_xmin %q: %w", l.table, *xmin, err)
		}
	}
	if events != nil {
		st.Last.Events = *events
	}
	if rule != nil {
		st.Last.Rule = *rule
	}
	if took != nil {
		st.Last.Took = *took
	}
	return st, nil
}

// BeginRecovery notes that a recovery of slot's gap from since is under way, before the lost slot
// is dropped and a new one created: until EndRecovery, every start begins it again. fromCreation
// says since is the lost slot's creation, not an acknowledged commit.
func (l Ledger) BeginRecovery(ctx context.Context, q queryExecer, slot string, since time.Time, fromCreation bool) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot, recovery_since, recovery_from_creation) VALUES ($1, $2, $3)
		ON CONFLICT (slot) DO UPDATE SET recovery_since = EXCLUDED.recovery_since, recovery_from_creation = EXCLUDED.recovery_from_creation`, l.table),
		slot, since, fromCreation)
	return notMigrated(err)
}

// Replacement identifies the slot a recovery created to replace a lost one: where it starts and
// when the ledger recorded its creation (RecordReplacementSlot). Two replacements of one slot
// never share both.
type Replacement struct {
	ConsistentLSN pglogrepl.LSN
	Created       time.Time
}

// ErrNotRecoveryOwner means the session writing a recovery's outcome does not hold the recovery's
// lock (RecoveryLockKey): its connection is not the one that took it (a pooler in transaction
// mode), or the lock was given up.
var ErrNotRecoveryOwner = errors.New("this process no longer owns the recovery: its lock session does not hold the recovery lock")

// owns is an SQL condition true in the session that holds the recovery lock, whose key's halves
// (lockArgs) are the parameters hi and lo.
func owns(hi, lo string) string {
	return fmt.Sprintf(`EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
		AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1)`, hi, lo)
}

// lockArgs are key's halves as pg_locks shows a one-key advisory lock: classid the high 32 bits,
// objid the low ones, both unsigned.
func lockArgs(key int64) (hi, lo int64) {
	return int64(uint64(key) >> 32), int64(uint32(key))
}

// EndRecovery notes that the recovery under way completed as r, with the replacement slot
// created: the session q must hold the recovery lock (lockKey), checked in the same statement.
// It reports false, recording nothing, when the ledger names another replacement (another process
// began the recovery again), and an error wrapping ErrNotRecoveryOwner when q does not hold the
// lock.
func (l Ledger) EndRecovery(ctx context.Context, q queryExecer, slot string, created Replacement, lockKey int64, r Recovery) (bool, error) {
	hi, lo := lockArgs(lockKey)
	tag, err := q.Exec(ctx, fmt.Sprintf(`UPDATE %s SET recovery_since = NULL, recovery_from_creation = NULL, recovered_at = now(),
			recovered_events = $3, recovered_from = $4, recovered_rule = $5, recovered_took = $6
		WHERE slot = $1 AND consistent_lsn = $2::pg_lsn AND created_at = $7 AND recovery_since IS NOT NULL AND %s`, l.table, owns("$8", "$9")),
		slot, created.ConsistentLSN.String(), r.Events, r.From, r.Rule, r.Took, created.Created, hi, lo)
	if err != nil {
		return false, notMigrated(err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	var owned bool
	var ended *bool
	err = q.QueryRow(ctx, fmt.Sprintf(`SELECT %s,
			(SELECT recovery_since IS NULL FROM %s WHERE slot = $1 AND consistent_lsn = $2::pg_lsn AND created_at = $5)`, owns("$3", "$4"), l.table),
		slot, created.ConsistentLSN.String(), hi, lo, created.Created).Scan(&owned, &ended)
	switch {
	case err != nil:
		return false, err
	case ended != nil && *ended:
		// Already ended for this slot (a reply lost after the UPDATE committed) counts as done.
		return true, nil
	case !owned:
		return false, ErrNotRecoveryOwner
	}
	return false, nil
}

// RecordReplacementSlot notes the slot created at lsn to replace a lost one, and returns the
// creation time recorded, which with lsn identifies the replacement to EndRecovery. Unlike
// RecordSlot it keeps the record of the first start's backfill: the replacement's gap is the
// recovery's, not a first start's.
func (l Ledger) RecordReplacementSlot(ctx context.Context, q queryExecer, slot string, lsn pglogrepl.LSN) (time.Time, error) {
	var created time.Time
	err := q.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s (slot, consistent_lsn) VALUES ($1, $2::pg_lsn)
		ON CONFLICT (slot) DO UPDATE SET consistent_lsn = EXCLUDED.consistent_lsn, created_at = now()
		RETURNING created_at`, l.table), slot, lsn.String()).Scan(&created)
	return created, err
}

// RecordPruned notes that the relay's pruning deleted rows created up to through.
func (l Ledger) RecordPruned(ctx context.Context, q queryExecer, slot string, through time.Time) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`UPDATE %s SET pruned_through = greatest(pruned_through, $2) WHERE slot = $1`, l.table), slot, through)
	return notMigrated(err)
}

// notMigrated marks an undefined column as a ledger that needs `outbox-relay migrate`.
func notMigrated(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42703" {
		return fmt.Errorf("%w (%s): run outbox-relay migrate", ErrLedgerNotMigrated, pgErr.Message)
	}
	return err
}
