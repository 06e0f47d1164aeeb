package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/credentials"
)

// begin starts a term on conn, whose backend pid has just taken the lock with a statement sent at sent, after
// ending the previous holder's walsender. It fails when the session's state is unknown (a statement
// went unanswered, so pgx closed the connection): the lock may be gone with it.
func (e *Elector) begin(ctx context.Context, conn *pgx.Conn, sent time.Time, previous *Holder, pid int32) (*Term, error) {
	if previous != nil && e.cfg.WalsenderDSN != "" {
		e.endStaleWalsenderElsewhere(ctx, *previous)
	} else if previous != nil {
		answered, err := e.endStaleWalsender(ctx, conn, *previous, sent)
		if !answered.IsZero() {
			sent = answered // its statements restart the server's idle clock, and so the lease
		}
		if err != nil {
			return nil, err
		}
	}
	if conn.IsClosed() {
		return nil, errors.New("the leader-lock connection closed")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return newTerm(conn, e.cfg, e.log, sent, uint32(pid)), nil
}

// endStaleWalsender ends the walsender of the previous leader when it still streams the slot. A
// leader cut off from the network leaves its replication connection behind too, and PostgreSQL
// keeps the slot active for it until wal_sender_timeout (60s by default) while the new leader
// cannot stream. That leader has fenced itself before its lease ended (unless its process was
// paused through it, see the package comment), so that walsender serves nobody. A leader publishes
// its walsender's PID in its lock session's application_name before it uses the slot
// (PublishWalsender); this ends exactly that backend, and only while it is still the slot's active
// one, in one statement: the walsender of anything outside the election (a relay with
// leader_election off, Debezium) is left alone.
// Without the right to end it (another role's backend needs pg_signal_backend; a superuser's,
// superuser) the new leader waits for the slot as for any busy one.
//
// Its statement gets CheckTimeout, like a check: answered within it, it keeps the term's first
// check inside the lease (see Config.Lease), as its sending restarts the server's idle clock.
// Waiting for the walsender to exit gets what is left of that after two round trips (as long as
// the lock statement's, which was sent at lockSent). It returns when the statement was sent if the
// server answered it (zero if not), and an error when it went unanswered: the session, and the
// lock, may be gone.
func (e *Elector) endStaleWalsender(ctx context.Context, conn *pgx.Conn, prev Holder, lockSent time.Time) (answered time.Time, err error) {
	pid := prev.WalsenderPID
	if pid == 0 {
		return time.Time{}, nil // it published none: no replication session yet, or one of another role or host
	}
	sent := time.Now()
	ctx, cancel := context.WithDeadline(ctx, sent.Add(e.cfg.CheckTimeout))
	defer cancel()
	wait := e.cfg.CheckTimeout - 2*sent.Sub(lockSent)
	if wait < 0 {
		wait = 0
	}
	query := `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE slot_name = $1 AND database = current_database() AND active_pid = $2`
	args := []any{e.cfg.Slot, pid}
	if serverMajor(conn) >= 14 && wait > 0 {
		// Wait for it to exit, so the slot is free when streaming starts.
		query = `SELECT pg_terminate_backend(active_pid, $3) FROM pg_replication_slots
			WHERE slot_name = $1 AND database = current_database() AND active_pid = $2`
		args = append(args, wait.Milliseconds())
	} else {
		wait = 0
	}
	var exited bool
	err = conn.QueryRow(ctx, query, args...).Scan(&exited)
	fields := []zap.Field{zap.String("slot", e.cfg.Slot), zap.Int32("walsender_pid", pid), zap.Int32("previous_lock_pid", prev.PID),
		zap.String("previous_leader_application_name", prev.ApplicationName), zap.String("previous_leader_client", prev.ClientAddr)}
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return sent, nil // it no longer streams the slot
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		e.log.Warn("cannot end the previous leader's walsender, which keeps the slot active after that leader lost the lock (the relay's role needs pg_signal_backend to end another role's backends); waiting until PostgreSQL ends it (wal_sender_timeout)",
			append(fields, zap.Error(err))...)
		return sent, nil
	case errors.As(err, &pgErr):
		e.log.Warn("cannot end the previous leader's walsender, which keeps the slot active after that leader lost the lock; waiting until PostgreSQL ends it (wal_sender_timeout)",
			append(fields, zap.Error(err))...)
		return sent, nil
	case err != nil:
		return time.Time{}, fmt.Errorf("end the previous leader's walsender (PID %d), leader_check_timeout %s: %w", pid, e.cfg.CheckTimeout, err)
	}
	if exited || wait == 0 {
		e.log.Info("ended the previous leader's walsender, which kept the slot active after that leader lost the lock",
			append(fields, zap.Bool("waited_for_exit", wait > 0))...)
	} else {
		e.log.Warn("told the previous leader's walsender to end, but it had not exited within the time left of leader_check_timeout; streaming waits until it has",
			append(fields, zap.Duration("waited", wait))...)
	}
	return sent, nil
}

// endStaleWalsenderElsewhere is endStaleWalsender where the walsender runs on another server than
// the lock (Config.WalsenderDSN: decoding on a hot standby, whose walsender a session on the
// primary can neither see nor end). It connects there and ends the previous leader's published
// walsender, only while it still streams the slot, in one statement, waiting for it to exit for
// half of CheckTimeout. The lock session stays idle meanwhile, so the whole takes at most
// CheckTimeout, which the term's first check allows for (the lease counts from the lock
// statement's sending). Any failure costs the wait for the standby's wal_sender_timeout, as
// before, never the lock: a warning says so.
func (e *Elector) endStaleWalsenderElsewhere(ctx context.Context, prev Holder) {
	pid := prev.WalsenderPID
	if pid == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	fields := []zap.Field{zap.String("slot", e.cfg.Slot), zap.Int32("walsender_pid", pid), zap.Int32("previous_lock_pid", prev.PID),
		zap.String("previous_leader_application_name", prev.ApplicationName), zap.String("previous_leader_client", prev.ClientAddr)}
	cfg, err := credentials.PostgresConfig(e.cfg.WalsenderDSN, e.cfg.PasswordFile)
	var conn *pgx.Conn
	if err == nil {
		conn, err = pgx.ConnectConfig(ctx, cfg)
	}
	if err != nil {
		e.log.Warn("cannot connect to pg_dsn to end the previous leader's walsender there, which keeps the slot active after that leader lost the lock; waiting until PostgreSQL ends it (wal_sender_timeout)",
			append(fields, zap.Error(err))...)
		return
	}
	defer closeQuietly(conn)
	wait := e.cfg.CheckTimeout / 2
	var exited bool
	err = conn.QueryRow(ctx, `SELECT pg_terminate_backend(active_pid, $3) FROM pg_replication_slots
		WHERE slot_name = $1 AND database = current_database() AND active_pid = $2`, e.cfg.Slot, pid, wait.Milliseconds()).Scan(&exited)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return // it no longer streams the slot
	case err != nil:
		e.log.Warn("cannot end the previous leader's walsender on pg_dsn, which keeps the slot active after that leader lost the lock (the relay's role needs pg_signal_backend to end another role's backends); waiting until PostgreSQL ends it (wal_sender_timeout)",
			append(fields, zap.Error(err))...)
	case exited:
		e.log.Info("ended the previous leader's walsender on pg_dsn, which kept the slot active after that leader lost the lock", fields...)
	default:
		e.log.Warn("told the previous leader's walsender on pg_dsn to end, but it had not exited within half of leader_check_timeout; streaming waits until it has",
			append(fields, zap.Duration("waited", wait))...)
	}
}
