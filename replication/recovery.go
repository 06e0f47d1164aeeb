package replication

// A lost slot's automatic recovery (on_slot_lost: recover), the stream's half: recording that a
// recovery is under way, replacing the slot with one whose exported snapshot the relay reads the
// gap from (Config.Recover, called by recover alone), and recording the outcome. Whether a slot is
// lost is decided in lost.go, for both policies. The ledger
// row is the state that outlives a process: a start that finds a recovery under way drops the
// replacement slot, which nothing has been confirmed to, and begins again from the same point.
// Whoever recovers owns the recovery for its whole length (the recovery lock, RecoveryLockKey):
// nobody else drops its replacement, publishes the gap or records the recovery as ended meanwhile.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
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
	// Created is when the replacement slot was created, as the ledger recorded it: with
	// ConsistentLSN, what identifies the replacement when the recovery is recorded as ended.
	Created time.Time
}

// replaceLost decides, with on_slot_lost: recover, whether slot (as the checks read it) is lost
// or a replacement whose recovery did not complete. If so it takes ownership of the recovery
// (ownRecovery: waiting while another process owns it, then deciding again), records the
// recovery as under way, drops what is left of the slot, and sets s.lost; the session then
// creates the replacement with an exported snapshot and calls Config.Recover before streaming.
// It returns the slot as the session should see it: missing, when it is to be replaced.
func (s *Stream) replaceLost(ctx context.Context, conn *pgx.Conn, slot SlotInfo, streamedHere bool) (SlotInfo, error) {
	s.lost = nil // decided afresh from the ledger and the slot, every session
	lost, err := s.lostSlot(ctx, conn, slot, streamedHere)
	if err != nil || lost == nil {
		return slot, err
	}
	// One process at a time replaces the slot and publishes its gap, from before the lost slot is
	// dropped until the recovery is recorded as ended: another one (a paused leader that resumes,
	// a deposed one, an instance without leader election) would drop the replacement under it, or
	// publish a second copy of the gap interleaved with the first.
	if s.owner, err = s.ownRecovery(ctx); err != nil {
		return SlotInfo{}, err
	}
	// What was read before may be stale: the previous owner may have ended its recovery.
	if slot, err = ReadSlot(ctx, conn, s.cfg.Slot); err != nil {
		return SlotInfo{}, err
	}
	// Decoding on a standby the ledger is read on the primary, where the previous owner wrote it:
	// the standby's copy lags by its replay, and may still show under way a recovery that owner
	// has ended, whose replacement this one would drop and make again (publishing the gap twice).
	fresh := conn
	if s.cfg.PrimaryDSN != "" {
		fresh = s.owner.conn
	}
	if lost, err = s.lostSlot(ctx, fresh, slot, streamedHere); err != nil || lost == nil {
		s.releaseRecovery(ctx)
		return slot, err
	}
	if slot.Exists && slot.Active {
		return SlotInfo{}, fmt.Errorf("%w: slot %q, which is to be replaced (%s), is being streamed by PostgreSQL backend PID %d%s", ErrSlotActive, s.cfg.Slot, lost.Reason, slot.ActivePID, describeBackend(ctx, conn, slot.ActivePID))
	}
	// The destructive steps run on the owner's connection (the drop: see dropLost): should it
	// have ended, they fail rather than act for a process that no longer owns the recovery.
	owner := s.owner.conn
	if lost.Again {
		s.log.Warn("a recovery of the lost slot's gap was under way and did not complete; starting it again with a new slot",
			zap.String("slot", s.cfg.Slot), zap.Time("gap_after", lost.Since))
	} else {
		s.log.Error("replication slot lost; recovering its gap from the outbox table (on_slot_lost: recover)",
			zap.String("slot", s.cfg.Slot), zap.String("reason", lost.Reason), zap.Time("gap_after", lost.Since),
			zap.Stringer("last_acknowledged_end_lsn", lost.SinceLSN), zap.Bool("from_slot_creation", lost.FromSlotCreation))
		// Recorded before the slot is dropped: from here on, every start finishes this recovery.
		if err := s.ledger.BeginRecovery(ctx, owner, s.cfg.Slot, lost.Since, lost.FromSlotCreation); err != nil {
			return SlotInfo{}, fmt.Errorf("record the recovery of slot %q in %s: %w", s.cfg.Slot, s.ledger.Table(), err)
		}
	}
	if slot.Exists {
		if err := s.dropLost(ctx, conn); err != nil {
			return SlotInfo{}, err
		}
		s.log.Info("dropped the slot to replace it", zap.String("slot", s.cfg.Slot))
	}
	s.lost = lost
	return SlotInfo{}, nil
}

// dropLost drops the lost slot, which is to be replaced, as the owner of its recovery. On a
// primary it runs on the owner's connection: should that session have ended, and the ownership
// with it, the drop fails rather than act for a process that no longer owns the recovery.
// Decoding on a standby the slot is the standby's while the recovery lock is the primary's
// (primary_dsn), so the drop runs on conn, the session's checks' connection to the standby, once
// the owner's session has shown that it still holds the lock (a drop of another owner's
// replacement would need that owner to have taken the lock in the moment between the two).
func (s *Stream) dropLost(ctx context.Context, conn *pgx.Conn) error {
	on := s.owner.conn
	if s.cfg.PrimaryDSN != "" {
		hi, lo := lockArgs(s.owner.key)
		var mine bool
		if err := s.owner.conn.QueryRow(ctx, "SELECT "+owns("$1", "$2"), hi, lo).Scan(&mine); err != nil {
			return fmt.Errorf("check the recovery lock of slot %q before dropping the slot on the standby: %w", s.cfg.Slot, err)
		}
		if !mine {
			return fmt.Errorf("the recovery lock of slot %q is no longer held by this process's session on the primary (primary_dsn): not dropping the slot on the standby", s.cfg.Slot)
		}
		on = conn
	}
	if _, err := on.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s.cfg.Slot); err != nil {
		return fmt.Errorf("drop slot %q to replace it: %w", s.cfg.Slot, err)
	}
	return nil
}

// recover runs Config.Recover for the replacement slot just created, then records the recovery as
// complete. An error leaves it under way in the ledger: the next session begins it again.
func (s *Stream) recover(ctx context.Context, out chan<- Message, slot SlotInfo, snapshot string) error {
	lost := *s.lost
	if s.owner == nil || lost.Created.IsZero() {
		return fmt.Errorf("slot %q was replaced to recover its gap, but the replacement was not recorded by the recovery's owner; starting over", s.cfg.Slot)
	}
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
	lost.ConsistentLSN, lost.Server = slot.ConfirmedFlush, s.identity
	if s.cfg.Recover == nil {
		return fatalf("slot %q was replaced to recover its gap, but nothing publishes the gap (no Recover hook)", s.cfg.Slot)
	}
	// The gap is published only while this process owns the recovery: should the owner's
	// connection end (and the lock with it), another process may begin the recovery again, and
	// this one stops publishing at once rather than interleave a second copy with that one's.
	rctx, stop := s.owner.watch(ctx)
	rec, err := s.cfg.Recover(rctx, snapshot, lost)
	lostOwnership := stop()
	if lostOwnership != nil {
		return fmt.Errorf("recover the gap of lost slot %q: stopped publishing it: %w", s.cfg.Slot, lostOwnership)
	}
	if err != nil {
		return fmt.Errorf("recover the gap of lost slot %q: %w", s.cfg.Slot, err)
	}
	// The gap is in Kafka: record it, under a bound like the slot's own record, so that a stop
	// now does not make the next start publish it all again. On the owner's connection, whose
	// lock the UPDATE requires, and only for the replacement this process created.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerWriteTimeout)
	defer cancel()
	done, err := s.ledger.EndRecovery(wctx, s.owner.conn, s.cfg.Slot, Replacement{ConsistentLSN: lost.ConsistentLSN, Created: lost.Created}, RecoveryLockKey(s.cfg.Slot), rec)
	if err != nil {
		return fmt.Errorf("record the completed recovery of slot %q in %s: %w", s.cfg.Slot, s.ledger.Table(), err)
	}
	if !done {
		return fmt.Errorf("slot %q was replaced again by another process while this one recovered its gap; starting over", s.cfg.Slot)
	}
	s.releaseRecovery(ctx)
	s.lost = nil
	return nil
}

// RecoveryLockKey is the key of the session-level advisory lock that the process recovering
// slot's gap holds for the recovery's whole length: an FNV-1a hash of
// "outbox-relay-recovery/<slot>", so it never contends with the leader lock (leader.Key).
func RecoveryLockKey(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("outbox-relay-recovery/" + slot))
	return int64(h.Sum64())
}

// recoveryOwner is this process's ownership of a lost slot's recovery: the recovery lock, held by
// a connection of its own.
type recoveryOwner struct {
	conn *pgx.Conn
	slot string
	key  int64
	log  *zap.Logger
}

// How the recovery lock is waited for and watched.
const (
	// ownerPoll is how often a process that waits for another's recovery tries the lock.
	ownerPoll = 500 * time.Millisecond
	// ownerWaitLog is how often it says it is still waiting.
	ownerWaitLog = 30 * time.Second
	// ownerCheckInterval is how often the owner checks its lock connection while the gap is
	// published: it bounds how long the owner may go on publishing after losing the lock.
	ownerCheckInterval = time.Second
	// ownerCheckTimeout bounds one check: a connection that does not answer within it is taken
	// for lost (the server ends it, and releases the lock, once keepalives go unanswered).
	ownerCheckTimeout = 5 * time.Second
)

// ownRecovery takes the recovery lock of the slot on a new connection, waiting (and saying so)
// while another process holds it, until ctx ends.
//
// The lock lives as long as its session. A process that is paused (SIGSTOP) keeps it, and the
// others wait for it to resume or end: its kernel answers TCP keepalives, and the session is
// exempt from idle_session_timeout, so nothing else can take over a recovery it is in the middle
// of. A host that is gone, or frozen whole (a frozen VM), stops answering keepalives: the server
// ends the session within about 20 s (tcp_keepalives_*), and the lock is free.
//
// Decoding on a standby, the lock and the ledger's writes it carries are the primary's
// (primary_dsn): the standby refuses the writes.
func (s *Stream) ownRecovery(ctx context.Context) (*recoveryOwner, error) {
	conn, err := s.cfg.ConnectPrimary(ctx)
	if err != nil {
		return nil, classifyConnect(err, "recovery lock")
	}
	o := &recoveryOwner{conn: conn, slot: s.cfg.Slot, key: RecoveryLockKey(s.cfg.Slot), log: s.log}
	ok := false
	defer func() {
		if !ok {
			o.close(ctx)
		}
	}()
	// Session settings any role may make; a role's own timeouts would otherwise end the lock
	// session of a paused owner, or of one waiting here.
	if _, err := conn.Exec(ctx, `SELECT set_config('idle_session_timeout', '0', false), set_config('statement_timeout', '0', false),
		set_config('idle_in_transaction_session_timeout', '0', false),
		set_config('tcp_keepalives_idle', '10', false), set_config('tcp_keepalives_interval', '2', false), set_config('tcp_keepalives_count', '3', false)`); err != nil {
		return nil, fmt.Errorf("set up the recovery lock session: %w", err)
	}
	var waitingSince, logged time.Time
	for {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", o.key).Scan(&got); err != nil {
			return nil, fmt.Errorf("take the recovery lock of slot %q: %w", s.cfg.Slot, err)
		}
		if got {
			// The lock must be this session's: behind a pooler in transaction mode it stays on
			// whichever server connection ran the statement, and EndRecovery, which requires it,
			// would never succeed.
			hi, lo := lockArgs(o.key)
			var mine bool
			if err := conn.QueryRow(ctx, "SELECT "+owns("$1", "$2"), hi, lo).Scan(&mine); err != nil {
				return nil, fmt.Errorf("check the recovery lock of slot %q: %w", s.cfg.Slot, err)
			}
			if !mine {
				return nil, fatalf("the recovery lock of slot %q was taken, but its session does not hold it: pg_dsn goes through a pooler in transaction mode, which a lost slot's recovery cannot work through; point pg_dsn at PostgreSQL directly or at a session-mode pool", s.cfg.Slot)
			}
			if !waitingSince.IsZero() {
				s.log.Info("the other process's recovery of the lost slot ended; this one owns it now and decides again from the slot and the ledger",
					zap.String("slot", s.cfg.Slot), zap.Duration("waited", time.Since(waitingSince).Round(time.Millisecond)))
			}
			ok = true
			return o, nil
		}
		if waitingSince.IsZero() {
			waitingSince = time.Now()
		}
		if logged.IsZero() || time.Since(logged) >= ownerWaitLog {
			s.log.Warn("another process owns the recovery of the lost slot's gap (it replaces the slot and publishes the gap); waiting for it to end before deciding again, never taking the recovery over while its session lives (a paused process keeps it)",
				zap.String("slot", s.cfg.Slot), zap.String("owner", describeLockHolder(ctx, conn, o.key)),
				zap.Duration("waited", time.Since(waitingSince).Round(time.Millisecond)))
			logged = time.Now()
		}
		select {
		case <-time.After(ownerPoll):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// describeLockHolder says who holds the advisory lock key, for the waiting line.
func describeLockHolder(ctx context.Context, conn *pgx.Conn, key int64) string {
	hi, lo := lockArgs(key)
	var pid int32
	var app, addr string
	var since *time.Time
	err := conn.QueryRow(ctx, `SELECT l.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), 'local'), a.backend_start
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = 1`, hi, lo).Scan(&pid, &app, &addr, &since)
	if err != nil {
		return "unknown (it ended meanwhile, or this role may not see it)"
	}
	d := fmt.Sprintf("PostgreSQL backend PID %d (application_name=%q, client %s", pid, app, addr)
	if since != nil {
		d += ", connected " + since.UTC().Format(time.RFC3339)
	}
	return d + ")"
}

// errOwnershipLost ends a recovery's publication when its owner's connection, and the lock with
// it, is gone.
var errOwnershipLost = errors.New("lost the recovery lock: its connection to PostgreSQL failed, so another process may own the recovery now; nothing is recorded as ended, the next owner publishes the gap again")

// watch returns a context for the gap's publication that ends when the owner's connection fails
// a check, and stop, which ends the checks and returns errOwnershipLost (wrapped) if one failed.
// The connection is the checks' alone until stop returns. stop never cancels a check in progress
// (pgx closes a connection whose query is cancelled, and the lock with it, which EndRecovery
// needs next): it waits for it. Only ctx's end (the session's) cuts one short.
func (o *recoveryOwner) watch(ctx context.Context) (context.Context, func() error) {
	wctx, cancel := context.WithCancelCause(ctx)
	quit, done := make(chan struct{}), make(chan struct{})
	var lost error
	go func() {
		defer close(done)
		tick := time.NewTicker(ownerCheckInterval)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			cctx, ccancel := context.WithTimeout(ctx, ownerCheckTimeout)
			err := o.conn.Ping(cctx)
			ccancel()
			if err != nil && ctx.Err() == nil {
				lost = fmt.Errorf("%w: %v", errOwnershipLost, err)
				o.log.Error("lost the recovery lock while publishing the lost slot's gap; stopping the publication before recording anything",
					zap.String("slot", o.slot), zap.Error(err))
				cancel(lost)
				return
			}
		}
	}()
	return wctx, func() error {
		close(quit)
		<-done
		cancel(nil)
		return lost
	}
}

func (o *recoveryOwner) close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	o.conn.Close(ctx)
}

// releaseRecovery gives up the recovery lock, if held: its connection ends, and the lock with it.
func (s *Stream) releaseRecovery(ctx context.Context) {
	if s.owner != nil {
		s.owner.close(ctx)
		s.owner = nil
	}
}
