package replication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Whether the slot is lost, and what that makes the session do: the one place where both policies
// of Config.OnSlotLost decide, from a session's checks (decideLost) and from the server's refusal
// to stream the slot (slotGoneError). With SlotLostStop a lost slot stops the
// relay with what to do by hand; with SlotLostRecover it is replaced and its gap published
// (recovery.go, the stream's half; Config.Recover, the relay's).

// decideLost returns the slot as the session should see it (missing when the session is to create
// it: a first start, or the replacement of a lost slot), or an error when it is lost and the
// policy, or what is known, does not let the relay go on.
func (s *Stream) decideLost(ctx context.Context, conn *pgx.Conn, slot SlotInfo) (SlotInfo, error) {
	// What this process streamed outlives its leadership terms: a term after a promotion of a
	// standby without the slot finds it gone, ledger or not.
	known := s.mem.recall(s.cfg.Slot)
	if s.cfg.OnSlotLost == SlotLostRecover {
		var err error
		if slot, err = s.replaceLost(ctx, conn, slot, known.streamed); err != nil || s.lost != nil {
			return slot, err // missing, when replaced: the session creates the replacement
		}
	}
	if !slot.Exists {
		return slot, s.refuseMissing(ctx, conn, known)
	}
	if s.cfg.OnSlotLost != SlotLostRecover {
		return slot, s.refuseUnfinishedRecovery(ctx, conn)
	}
	return slot, nil
}

// refuseMissing refuses to create a missing slot that this process or the ledger knows the relay
// streamed or created (it was lost: a new slot would start after the gap and skip its events
// without a trace), or that create_slot does not allow the relay to create.
func (s *Stream) refuseMissing(ctx context.Context, conn *pgx.Conn, known slotMemory) error {
	switch {
	case s.streamed.Load() || known.streamed:
		return fmt.Errorf("%w: slot %q no longer exists (it was dropped while the relay was using it, or pg_dsn now leads to a promoted standby, where logical slots exist only as failover slots from PostgreSQL 17 on); the relay does not recreate it because events committed after its last confirmed position %s would be skipped. %s",
			ErrSlotLost, s.cfg.Slot, max(s.reported, known.confirmed), s.recovery())
	case !s.cfg.CreateSlot:
		return fatalf("replication slot %q does not exist and create_slot is off: create it with SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", s.cfg.Slot, s.cfg.Slot)
	}
	e, recorded, err := s.ledger.Lookup(ctx, conn, s.cfg.Slot)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		// The ledger is optional; a least-privilege role may not read it.
		s.log.Warn("cannot read the slot ledger, so a lost slot cannot be told from a first start: GRANT SELECT, INSERT, UPDATE ON it to the relay's role",
			zap.String("table", LedgerTable), zap.Error(err))
		err, recorded = nil, false
	}
	switch {
	case err != nil:
		return err
	case recorded && e.ConsistentLSN == 0:
		return fmt.Errorf("%w: slot %q, which the relay streamed (recorded on %s), no longer exists (dropped, or invalidated because PostgreSQL removed WAL it needed, or the server is a promoted standby, where logical slots exist only as failover slots from PostgreSQL 17 on); events committed after its last confirmed position may never be published. %s",
			ErrSlotLost, s.cfg.Slot, e.CreatedAt.Format(time.RFC3339), s.recovery())
	case recorded:
		return fmt.Errorf("%w: slot %q, created by the relay on %s at %s, no longer exists (dropped, or invalidated because PostgreSQL removed WAL it needed, or the server is a promoted standby, where logical slots exist only as failover slots from PostgreSQL 17 on); events committed after its last confirmed position may never be published. %s",
			ErrSlotLost, s.cfg.Slot, e.CreatedAt.Format(time.RFC3339), e.ConsistentLSN, s.recovery())
	}
	return nil
}

// slotGoneError is what the server's refusal to stream the slot means, by policy: the slot is
// missing (undefined_object), or it can no longer be streamed (invalidated: the slot's WAL was
// removed). With SlotLostRecover the next session's checks decide, as for any missing slot.
func (s *Stream) slotGoneError(pgErr *pgconn.PgError, invalidated bool) error {
	switch {
	case s.cfg.OnSlotLost == SlotLostRecover:
		// Also before this process streamed it: the session's checks found the slot, and it went
		// while the session waited (for Kafka, say) before START_REPLICATION. The next session's
		// checks decide from the slot ledger, as for any missing slot.
		return fmt.Errorf("%w: %s", errSlotGone, pgErr.Message)
	case invalidated:
		return fmt.Errorf("%w: %s: the slot can no longer be streamed; drop and recreate it, then reconcile outbox rows written since %s", ErrSlotLost, pgErr.Message, s.reported)
	case s.streamed.Load():
		return fmt.Errorf("%w: %s", ErrSlotLost, pgErr.Message)
	}
	return fatalf("%s: check the slot and publication settings", pgErr.Message)
}

// What the stream does about a lost slot (Config.OnSlotLost).
const (
	// SlotLostStop stops with an error that says how to recover by hand.
	SlotLostStop = "stop"
	// SlotLostRecover replaces the slot and has the gap published from the outbox table.
	SlotLostRecover = "recover"
)

// errSlotGone is a loss noticed by the stream (while streaming, or by START_REPLICATION after the
// session's checks had found the slot), with on_slot_lost: recover. Not fatal: the next session's
// checks find the slot lost and recover it.
var errSlotGone = errors.New("the replication slot is gone; reconnecting to recover its gap from the outbox table (on_slot_lost: recover)")

// lostReason says why an existing slot can no longer be streamed, "" when it can.
func lostReason(s SlotInfo) string {
	switch {
	case s.InvalidationReason == "idle_timeout":
		return "invalidated (idle_timeout): nothing streamed it for longer than idle_replication_slot_timeout"
	case s.InvalidationReason != "" && s.InvalidationReason != "wal_removed":
		return fmt.Sprintf("invalidated (%s)", s.InvalidationReason)
	case s.WALStatus == "lost" || s.InvalidationReason == "wal_removed":
		return `wal_status "lost": PostgreSQL removed WAL it still needed (max_slot_wal_keep_size)`
	}
	return ""
}

// lostSlot returns the lost slot to recover, or nil when slot (as the checks read it) is not lost
// and no recovery is under way; an error when it is lost and cannot be recovered. The ledger is
// read on ledgerConn.
func (s *Stream) lostSlot(ctx context.Context, ledgerConn *pgx.Conn, slot SlotInfo, streamedHere bool) (*LostSlot, error) {
	st, err := s.ledger.Recovery(ctx, ledgerConn, s.cfg.Slot)
	if errors.Is(err, ErrLedgerNotMigrated) {
		return nil, fatalf("on_slot_lost: recover: %v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("read the slot ledger %s: %w", s.ledger.Table(), err)
	}
	var reason string
	switch {
	case !st.Since.IsZero():
		reason = "a recovery of its gap was under way and did not complete"
	case slot.Exists:
		if reason = lostReason(slot); reason == "" {
			return nil, nil
		}
	case s.streamed.Load() || streamedHere:
		reason = "it no longer exists (dropped, or pg_dsn now leads to a promoted standby, where logical slots exist only as failover slots from PostgreSQL 17 on)"
	case !st.SlotCreated.IsZero():
		reason = "it no longer exists, although the slot ledger records that the relay created it (dropped, invalidated and removed, or the server is a promoted standby or a restore)"
	default:
		return nil, nil // a first start
	}
	if s.cfg.NoTable || s.cfg.MessageEvents {
		what := "The outbox is logical decoding messages only"
		if !s.cfg.NoTable {
			what = "Events also come as logical decoding messages (message_prefix)"
		}
		return nil, fmt.Errorf("%w: slot %q is lost: %s. %s, which are stored nowhere but the WAL: those committed after %s cannot be recovered (how many, PostgreSQL cannot say), so on_slot_lost: recover does not replace the slot, which would pass a partial gap off as whole. To go on, accepting that loss: stop every instance, run outbox-relay forget-slot (or DELETE FROM %s WHERE slot = %s), and start again; the new slot streams what is committed from then on",
			ErrSlotLost, s.cfg.Slot, reason, what, timeOrUnknown(st.Confirmed.CommitTime), s.ledger.Table(), quoteLiteral(s.cfg.Slot))
	}
	lost := LostSlot{Slot: s.cfg.Slot, Reason: reason, Since: st.Since, FromSlotCreation: st.SinceCreation,
		SinceLSN: st.Confirmed.EndLSN, Xmin: st.Confirmed.Xmin, PrunedThrough: st.PrunedThrough, Again: !st.Since.IsZero()}
	if lost.Since.IsZero() {
		lost.Since = st.Confirmed.CommitTime
	}
	if lost.Since.IsZero() {
		// Nothing was ever recorded as acknowledged: from the lost slot's creation, for the log;
		// only a recorded horizon, or the creation time rule with a margin set by hand, can bound
		// the gap (the ledger's creation time is when the relay wrote its row, not the slot's
		// consistent point).
		if st.SlotCreated.IsZero() {
			return nil, fmt.Errorf("%w: slot %q is lost: %s, and the slot ledger %s records neither what Kafka acknowledged nor when the slot was created, so where its gap starts is unknown and on_slot_lost: recover cannot recover it. %s",
				ErrSlotLost, s.cfg.Slot, reason, s.ledger.Table(), s.recovery())
		}
		lost.Since, lost.FromSlotCreation = st.SlotCreated, true
	}
	return &lost, nil
}

// refuseUnfinishedRecovery refuses, with on_slot_lost other than recover, to stream a slot while the
// ledger records a recovery of its gap under way: the slot is then the replacement of a lost one
// (or its remains) whose gap was not all published, and streaming it from its consistent point
// would skip the rest of that gap without a word. A ledger that cannot say (none, not migrated,
// not readable by the role) records no recovery.
func (s *Stream) refuseUnfinishedRecovery(ctx context.Context, conn *pgx.Conn) error {
	var since *time.Time
	err := conn.QueryRow(ctx, fmt.Sprintf("SELECT recovery_since FROM %s WHERE slot = $1", s.ledger.Table()), s.cfg.Slot).Scan(&since)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "42501"):
		return nil
	case err != nil:
		return fmt.Errorf("read the slot ledger %s: %w", s.ledger.Table(), err)
	case since == nil:
		return nil
	}
	return fatalf("slot %q replaced a lost slot whose gap (the outbox rows committed after %s) a recovery was publishing and did not finish (the slot ledger %s records it under way), and on_slot_lost is %s: streaming the slot would skip the rest of that gap. Set on_slot_lost: recover and start again to finish the recovery, or recover by hand: stop every instance, run outbox-relay forget-slot, and start once with backfill: true and backfill_since: a time before the oldest transaction open at %s",
		s.cfg.Slot, since.UTC().Format(time.RFC3339), s.ledger.Table(), cmp.Or(s.cfg.OnSlotLost, SlotLostStop), since.UTC().Format(time.RFC3339))
}

func timeOrUnknown(t time.Time) string {
	if t.IsZero() {
		return "the last acknowledged event (not recorded)"
	}
	return t.Format(time.RFC3339Nano)
}

// recovery is what to do about a lost slot: the new slot's backfill publishes the gap from the
// outbox table, once the ledger lets the relay create it.
func (s *Stream) recovery() string {
	standby := ""
	if s.cfg.PrimaryDSN != "" {
		// Decoding on a standby, the likeliest cause is one the generic causes do not name.
		standby = "Decoding on a standby, a slot is that standby's own: pg_dsn leading to a new or rebuilt standby (pg_basebackup copies no slot) finds none; on_slot_lost: recover creates it there and publishes the gap from the outbox table, without the steps below. "
	}
	return standby + fmt.Sprintf("To recover: stop every instance, run `outbox-relay forget-slot` (or DELETE FROM %s WHERE slot = %s) so that the relay may create a new slot, and start one instance once with backfill: true and backfill_since covering the gap (from before the last event Kafka acknowledged): it publishes those events from the outbox table, consistently with the new slot (docs/operations.md, \"Recovering a lost or missing slot\")",
		s.ledger.Table(), quoteLiteral(s.cfg.Slot))
}
