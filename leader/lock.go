package leader

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// heldByBackend is a condition that the session's backend holds the advisory lock keyed by the
// parameters $hi and $lo (the key's halves: see LockHolder).
func heldByBackend(hi, lo int) string {
	return fmt.Sprintf(`EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid = pg_backend_pid()
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = $%d AND objid::bigint = $%d)`, hi, lo)
}

// keyHalves are the lock key as pg_locks shows it: its high half in classid, its low in objid.
func keyHalves(key int64) (hi, lo int64) {
	return int64(uint64(key) >> 32), int64(uint64(key) & 0xffffffff)
}

// tryLock asks for the lock, and returns whether it got it and the PostgreSQL backend that ran the
// statement (pg_backend_pid: behind a pooler, the client's own PID is one the pooler made up). On
// PostgreSQL 14 and later the session that gets it gets the lease (idle_session_timeout) in the
// same statement, so no moment exists in which the lock is held without one; a session that does
// not get it keeps no timeout, since a standby is idle for RetryInterval between attempts.
//
// A fresh session never holds the lock before asking for it; one that does shares its backend
// with another client, the holder, through a pooler in transaction mode. Advisory locks are
// re-entrant, so pg_try_advisory_lock would succeed there too: two leaders. The statement reads
// that before asking (the select list is evaluated in order) and returns ErrTransactionPooler.
func (e *Elector) tryLock(ctx context.Context, conn *pgx.Conn) (got bool, pid int32, err error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	hi, lo := keyHalves(e.key)
	var already bool
	if serverMajor(conn) < 14 {
		err = conn.QueryRow(ctx, `SELECT pg_backend_pid(), `+heldByBackend(2, 3)+`, pg_try_advisory_lock($1)`,
			e.key, hi, lo).Scan(&pid, &already, &got)
		if err != nil {
			return false, 0, fmt.Errorf("pg_try_advisory_lock: %w", err)
		}
		if got && !already && !e.warnedOld {
			e.warnedOld = true
			e.log.Warn("PostgreSQL before 14 has no idle_session_timeout, so it cannot end the lock session of a leader cut off from the network before TCP keepalives do (and a proxy in between may answer those): a standby may wait long to take over",
				zap.String("server_version", conn.PgConn().ParameterStatus("server_version")))
		}
	} else {
		err = conn.QueryRow(ctx, `SELECT pg_backend_pid(), `+heldByBackend(3, 4)+`, CASE WHEN pg_try_advisory_lock($1)
			THEN set_config('idle_session_timeout', $2, false) IS NOT NULL ELSE false END`,
			e.key, strconv.FormatInt(e.cfg.Lease().Milliseconds(), 10), hi, lo).Scan(&pid, &already, &got)
		if err != nil {
			return false, 0, fmt.Errorf("pg_try_advisory_lock: %w", err)
		}
	}
	if already {
		return got, pid, fmt.Errorf("%w (slot %q: this connection's statement ran on backend PID %d, which already held the leader lock for another client)",
			ErrTransactionPooler, e.cfg.Slot, pid)
	}
	return got, pid, nil
}

// verifySession makes sure that the lock just taken by backend pid belongs to conn's session: the
// next statement runs on the same backend and pg_locks shows the lock granted to it, and probe (a
// second session, opened before) does not find it on its own backend. A pooler in transaction
// mode fails one of these: it runs statements on whichever server connection is free, and hands
// the one that holds the lock to the next client (PgBouncer hands the most recently used first).
// A direct connection or a session-mode pool passes all three. It returns when its statement on
// conn was sent: the server's idle clock, and so the lease, restarts then.
func (e *Elector) verifySession(ctx context.Context, conn, probe *pgx.Conn, pid int32) (time.Time, error) {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	hi, lo := keyHalves(e.key)
	var now int32
	var held bool
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid(), `+heldByBackend(1, 2), hi, lo).Scan(&now, &held); err != nil {
		return sent, fmt.Errorf("verify the leader lock's session: %w", err)
	}
	switch {
	case now != pid:
		return sent, fmt.Errorf("%w (slot %q: the lock was taken on backend PID %d, the next statement ran on backend PID %d)", ErrTransactionPooler, e.cfg.Slot, pid, now)
	case !held:
		return sent, fmt.Errorf("%w (slot %q: backend PID %d took the leader lock, and pg_locks does not show it held by that backend a statement later)", ErrTransactionPooler, e.cfg.Slot, pid)
	}
	var other int32
	if err := probe.QueryRow(ctx, `SELECT pg_backend_pid(), `+heldByBackend(1, 2), hi, lo).Scan(&other, &held); err != nil {
		return sent, fmt.Errorf("verify the leader lock's session from a second connection: %w", err)
	}
	if held {
		return sent, fmt.Errorf("%w (slot %q: another connection's statement ran on backend PID %d, which holds this session's leader lock)", ErrTransactionPooler, e.cfg.Slot, other)
	}
	return sent, nil
}

// unlockPooled undoes a lock this elector took on backend pid through a pooler in transaction
// mode. Neither closing the connection (the pooled server session, and so the lock, outlives it)
// nor pg_advisory_unlock (it runs on whichever server connection the pooler picks) can be trusted
// to: ending that backend does, and the pooler opens another server connection when it needs one.
func (e *Elector) unlockPooled(conn *pgx.Conn, pid int32) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.CheckTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "57P01") { // admin_shutdown: the statement ran on that very backend
		e.log.Warn("could not end the pooled PostgreSQL backend that took the leader lock through a pooler in transaction mode; the lock stays with it until the pooler closes that server connection",
			zap.String("slot", e.cfg.Slot), zap.Int32("backend_pid", pid), zap.Error(err))
	}
}
