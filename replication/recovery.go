package replication

// A lost slot's automatic recovery (on_slot_lost: recover), the stream's half: recognising the
// loss, recording that a recovery is under way, replacing the slot with one whose exported
// snapshot the relay reads the gap from (Config.Recover), and recording the outcome. The ledger
// row is the state that outlives a process: a start that finds a recovery under way drops the
// replacement slot, which nothing has been confirmed to, and begins again from the same point.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// What the stream does about a lost slot (Config.OnSlotLost).
const (
	// SlotLostStop stops with an error that says how to recover by hand.
	SlotLostStop = "stop"
	// SlotLostRecover replaces the slot and has the gap published from the outbox table.
	SlotLostRecover = "recover"
)

// LostSlot is a lost slot the stream has replaced; Config.Recover publishes its gap.
type LostSlot struct {
	Slot string
	// Reason says what happened to it, for the log.
	Reason string
	// Since is where the gap starts: the commit time of the last transaction Kafka acknowledged
	// with every one before it, as the ledger recorded it.
	Since time.Time
	// SinceLSN is the end LSN recorded with Since (0 when unknown), for the log.
	SinceLSN pglogrepl.LSN
	// FromSlotCreation: nothing was ever recorded as acknowledged, so Since is the time the lost
	// slot was created, and only the creation time rule can bound the gap.
	FromSlotCreation bool
	// Xmin is the horizon recorded with the last acknowledged point (0: none): every row of the
	// gap was written by a transaction with this full id or a later one (Confirmed.Xmin).
	Xmin uint64
	// PrunedThrough is the newest creation time the relay's pruning deleted (zero: none recorded).
	PrunedThrough time.Time
	// Again: an earlier recovery of this gap was under way and did not complete.
	Again bool
	// ConsistentLSN is where the replacement slot starts: the snapshot shows exactly the
	// transactions committed before it.
	ConsistentLSN pglogrepl.LSN
	// Server is the server the replacement slot was created on.
	Server Identity
	// Created is when the replacement slot was created.
	Created time.Time
}

// errSlotGone is a loss noticed while streaming, with on_slot_lost: recover. Not fatal: the next
// session's checks find the slot lost and recover it.
var errSlotGone = errors.New("the replication slot was lost while streaming; reconnecting to recover its gap from the outbox table (on_slot_lost: recover)")

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

// replaceLost decides, with on_slot_lost: recover, whether slot (as the checks read it) is lost
// or a replacement whose recovery did not complete. If so it records the recovery as under way,
// drops what is left of the slot, and sets s.lost; the session then creates the replacement with
// an exported snapshot and calls Config.Recover before streaming. It returns the slot as the
// session should see it: missing, when it is to be replaced.
func (s *Stream) replaceLost(ctx context.Context, conn *pgx.Conn, slot SlotInfo, streamedHere bool) (SlotInfo, error) {
	s.lost = nil // decided afresh from the ledger and the slot, every session
	st, err := s.ledger.Recovery(ctx, conn, s.cfg.Slot)
	if errors.Is(err, ErrLedgerNotMigrated) {
		return SlotInfo{}, fatalf("on_slot_lost: recover: %v", err)
	}
	if err != nil {
		return SlotInfo{}, fmt.Errorf("read the slot ledger %s: %w", s.ledger.Table(), err)
	}
	var reason string
	switch {
	case !st.Since.IsZero():
		reason = "a recovery of its gap was under way and did not complete"
	case slot.Exists:
		if reason = lostReason(slot); reason == "" {
			return slot, nil
		}
	case s.streamed.Load() || streamedHere:
		reason = "it no longer exists (dropped, or pg_dsn now leads to a promoted standby, where logical slots exist only as failover slots from PostgreSQL 17 on)"
	case !st.SlotCreated.IsZero():
		reason = "it no longer exists, although the slot ledger records that the relay created it (dropped, invalidated and removed, or the server is a promoted standby or a restore)"
	default:
		return slot, nil // a first start
	}
	if s.cfg.NoTable || s.cfg.MessageEvents {
		what := "The outbox is logical decoding messages only"
		if !s.cfg.NoTable {
			what = "Events also come as logical decoding messages (message_prefix)"
		}
		return SlotInfo{}, fmt.Errorf("%w: slot %q is lost: %s. %s, which are stored nowhere but the WAL: those committed after %s cannot be recovered (how many, PostgreSQL cannot say), so on_slot_lost: recover does not replace the slot, which would pass a partial gap off as whole. To go on, accepting that loss: stop every instance, run outbox-relay forget-slot (or DELETE FROM %s WHERE slot = %s), and start again; the new slot streams what is committed from then on",
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
			return SlotInfo{}, fmt.Errorf("%w: slot %q is lost: %s, and the slot ledger %s records neither what Kafka acknowledged nor when the slot was created, so where its gap starts is unknown and on_slot_lost: recover cannot recover it. %s",
				ErrSlotLost, s.cfg.Slot, reason, s.ledger.Table(), s.recovery())
		}
		lost.Since, lost.FromSlotCreation = st.SlotCreated, true
	}
	if slot.Exists && slot.Active {
		return SlotInfo{}, fmt.Errorf("%w: slot %q, which is to be replaced (%s), is being streamed by PostgreSQL backend PID %d%s", ErrSlotActive, s.cfg.Slot, reason, slot.ActivePID, describeBackend(ctx, conn, slot.ActivePID))
	}
	if lost.Again {
		s.log.Warn("a recovery of the lost slot's gap was under way and did not complete; starting it again with a new slot",
			zap.String("slot", s.cfg.Slot), zap.Time("gap_after", lost.Since))
	} else {
		s.log.Error("replication slot lost; recovering its gap from the outbox table (on_slot_lost: recover)",
			zap.String("slot", s.cfg.Slot), zap.String("reason", reason), zap.Time("gap_after", lost.Since),
			zap.Stringer("last_acknowledged_end_lsn", lost.SinceLSN), zap.Bool("from_slot_creation", lost.FromSlotCreation))
		// Recorded before the slot is dropped: from here on, every start finishes this recovery.
		if err := s.ledger.BeginRecovery(ctx, conn, s.cfg.Slot, lost.Since, lost.FromSlotCreation); err != nil {
			return SlotInfo{}, fmt.Errorf("record the recovery of slot %q in %s: %w", s.cfg.Slot, s.ledger.Table(), err)
		}
	}
	if slot.Exists {
		if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s.cfg.Slot); err != nil {
			return SlotInfo{}, fmt.Errorf("drop slot %q to replace it: %w", s.cfg.Slot, err)
		}
		s.log.Info("dropped the slot to replace it", zap.String("slot", s.cfg.Slot))
	}
	s.lost = &lost
	return SlotInfo{}, nil
}

// recover runs Config.Recover for the replacement slot just created, then records the recovery as
// complete. An error leaves it under way in the ledger: the next session begins it again.
func (s *Stream) recover(ctx context.Context, out chan<- Message, slot SlotInfo, snapshot string) error {
	lost := *s.lost
	if s.streamed.Load() {
		// Lost while streaming: what the lost slot streamed may still be on its way to the sink
		// (buffered, or in the consumer's hands). The gap repeats those events; published after
		// them it leaves every aggregate at its latest event, published before them it would not.
		done := make(chan struct{})
		select {
		case out <- Message{Kind: Barrier, Done: done}:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	lost.ConsistentLSN, lost.Server, lost.Created = slot.ConfirmedFlush, s.identity, time.Now()
	if s.cfg.Recover == nil {
		return fatalf("slot %q was replaced to recover its gap, but nothing publishes the gap (no Recover hook)", s.cfg.Slot)
	}
	rec, err := s.cfg.Recover(ctx, snapshot, lost)
	if err != nil {
		return fmt.Errorf("recover the gap of lost slot %q: %w", s.cfg.Slot, err)
	}
	// The gap is in Kafka: record it, under a bound like the slot's own record, so that a stop
	// now does not make the next start publish it all again.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerWriteTimeout)
	defer cancel()
	conn, err := s.cfg.Connect(wctx)
	if err != nil {
		return fmt.Errorf("record the completed recovery of slot %q: %w", s.cfg.Slot, err)
	}
	defer conn.Close(wctx)
	done, err := s.ledger.EndRecovery(wctx, conn, s.cfg.Slot, lost.ConsistentLSN, rec)
	if err != nil {
		return fmt.Errorf("record the completed recovery of slot %q in %s: %w", s.cfg.Slot, s.ledger.Table(), err)
	}
	if !done {
		return fmt.Errorf("slot %q was replaced again by another process while this one recovered its gap; starting over", s.cfg.Slot)
	}
	s.lost = nil
	return nil
}

func timeOrUnknown(t time.Time) string {
	if t.IsZero() {
		return "the last acknowledged event (not recorded)"
	}
	return t.Format(time.RFC3339Nano)
}
