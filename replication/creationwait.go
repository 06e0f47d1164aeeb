package replication

// What a slot's creation waits for. CREATE_REPLICATION_SLOT of a logical slot waits until every
// transaction holding a transaction id when it began has ended, a prepared transaction (2PC)
// included: one left open or forgotten holds the creation, and so the relay's start or a lost
// slot's recovery, for ever, with nothing on the replication connection to say why. A watcher on
// an ordinary connection reads the walsender's lock wait and names the transaction.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// CreationWait is a transaction a slot's creation waits for.
type CreationWait struct {
	// Walsender is the backend that runs CREATE_REPLICATION_SLOT.
	Walsender int32 `json:"walsender_pid"`
	// XID is the transaction id it waits for.
	XID string `json:"xid"`
	// PID is the backend of the transaction; 0 for a prepared transaction, which has none.
	PID int32 `json:"pid,omitempty"`
	// Application, Client and State describe that backend (pg_stat_activity). Not its query: its
	// text may hold what must not be logged (a password in ALTER ROLE, an application's data).
	Application string `json:"application_name,omitempty"`
	Client      string `json:"client_addr,omitempty"`
	State       string `json:"state,omitempty"`
	// GID, Owner and Database describe a prepared transaction (pg_prepared_xacts).
	GID      string `json:"gid,omitempty"`
	Owner    string `json:"owner,omitempty"`
	Database string `json:"database,omitempty"`
	// Since is when the transaction began, or was prepared; zero when unknown.
	Since time.Time `json:"since"`
}

// Prepared reports whether the transaction is a prepared one.
func (w CreationWait) Prepared() bool { return w.PID == 0 }

// age is how long the transaction has run, or has been prepared, at now.
func (w CreationWait) age(now time.Time) string {
	if w.Since.IsZero() {
		return "for an unknown time"
	}
	return "for " + now.Sub(w.Since).Round(time.Second).String()
}

// Describe says what the creation waits for and how to end it, in one sentence for a human.
func (w CreationWait) Describe(now time.Time) string {
	if w.Prepared() {
		gid := w.GID
		if gid == "" {
			gid = "(see pg_prepared_xacts)"
		}
		return fmt.Sprintf("prepared transaction %s (xid %s, owner %s, database %s), prepared %s ago: a two-phase commit its coordinator has not finished (or forgot); end it with COMMIT PREPARED %s or ROLLBACK PREPARED %s, as its application intended",
			quoteLiteral(gid), w.XID, orUnknown(w.Owner), orUnknown(w.Database), strings.TrimPrefix(w.age(now), "for "), quoteLiteral(gid), quoteLiteral(gid))
	}
	return fmt.Sprintf("transaction %s of backend PID %d (application_name %q, client %s, %s %s): end it (commit it, or SELECT pg_terminate_backend(%d))",
		w.XID, w.PID, w.Application, orUnknown(w.Client), orUnknown(w.State), w.age(now), w.PID)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// creationWaitQuery reads the transaction id lock the walsender $1 waits for, and its holder:
// a backend, or a prepared transaction (a holder without a PID).
const creationWaitQuery = `SELECT w.transactionid::text, coalesce(h.pid, 0),
	coalesce(a.application_name, ''), coalesce(host(a.client_addr), CASE WHEN a.pid IS NOT NULL THEN 'local' END, ''),
	coalesce(a.state, ''),
	coalesce(p.gid, ''), coalesce(p.owner::text, ''), coalesce(p.database::text, ''),
	coalesce(a.xact_start, p.prepared)
FROM pg_locks w
JOIN pg_locks h ON h.locktype = 'transactionid' AND h.transactionid = w.transactionid AND h.granted
LEFT JOIN pg_stat_activity a ON a.pid = h.pid
LEFT JOIN pg_prepared_xacts p ON p.transaction = w.transactionid
WHERE w.pid = $1 AND w.locktype = 'transactionid' AND NOT w.granted
LIMIT 1`

type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SlotCreationWait reads what the walsender with PID walsender, creating a slot, waits for; ok is
// false when it waits for no transaction.
func SlotCreationWait(ctx context.Context, q rowQuerier, walsender int32) (w CreationWait, ok bool, err error) {
	var since *time.Time
	err = q.QueryRow(ctx, creationWaitQuery, walsender).Scan(&w.XID, &w.PID, &w.Application, &w.Client, &w.State,
		&w.GID, &w.Owner, &w.Database, &since)
	if errors.Is(err, pgx.ErrNoRows) {
		return CreationWait{}, false, nil
	}
	if err != nil {
		return CreationWait{}, false, fmt.Errorf("read what the creation of the replication slot waits for (pg_locks, pg_stat_activity, pg_prepared_xacts): %w", err)
	}
	if since != nil {
		w.Since = *since
	}
	w.Walsender = walsender
	return w, true, nil
}

// FindSlotCreationWait finds a walsender creating slot (its command, in pg_stat_activity: the
// caller's role needs to see the walsender's query, as the relay's own role or one with
// pg_read_all_stats does) and what it waits for; ok is false when none waits.
func FindSlotCreationWait(ctx context.Context, q rowQuerier, slot string) (w CreationWait, ok bool, err error) {
	like := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(slot)
	var pid int32
	err = q.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender' AND state = 'active'
		AND (query LIKE $1 OR query LIKE $2) ORDER BY backend_start LIMIT 1`,
		"CREATE\\_REPLICATION\\_SLOT "+like+" %", `CREATE\_REPLICATION\_SLOT "`+strings.ReplaceAll(like, `"`, `""`)+`" %`).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return CreationWait{}, false, nil
	}
	if err != nil {
		return CreationWait{}, false, fmt.Errorf("look for a walsender creating slot %q: %w", slot, err)
	}
	return SlotCreationWait(ctx, q, pid)
}

// When the watcher of a slot's creation looks, and how often it repeats its line while the
// creation waits. A creation that waits for nothing takes milliseconds; the first look is late
// enough to leave those alone, early enough that an operator watching a start sees why it hangs.
var defaultCreationWaitTimes = creationWaitTimes{first: 2 * time.Second, poll: 2 * time.Second, logEvery: 15 * time.Second}

// creationWaitTimes are the watcher's first look, its polling interval, and how often it repeats
// its line while the creation waits for the same transaction.
type creationWaitTimes struct{ first, poll, logEvery time.Duration }

// watchSlotCreation watches, on an ordinary connection, what the walsender with PID walsender
// waits for while it creates the slot: a WARN line naming the transaction at the first look,
// again every logEvery (and whenever it waits for another), and the gauge
// outbox_relay_slot_creation_wait_seconds. The returned stop ends the watcher and waits for it;
// call it when the creation returns.
func (s *Stream) watchSlotCreation(ctx context.Context, walsender int32) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	times := s.creationWaitTimes
	if times == (creationWaitTimes{}) {
		times = defaultCreationWaitTimes
	}
	began := time.Now()
	go func() {
		defer close(done)
		s.watchCreation(ctx, walsender, began, times)
	}()
	nudged := make(chan struct{})
	if s.cfg.PrimaryDSN != "" {
		go func() {
			defer close(nudged)
			s.nudgeStandbyCreation(ctx, began)
		}()
	} else {
		close(nudged)
	}
	return func() {
		cancel()
		<-done
		<-nudged
	}
}

// standbySnapshotEvery is how often a slot's creation on a standby asks the primary for a
// running-transactions record.
const standbySnapshotEvery = time.Second

// nudgeStandbyCreation speeds up the creation of a slot on a hot standby. There the creation
// waits, besides the transactions a primary waits for, for a running-transactions record from the
// primary in the replayed WAL: the primary writes one about every 15 s while it is active and none
// while it is idle, so the creation would take up to 15 s, or wait for the next write. Until ctx
// ends (the creation returned), it asks the primary for one every standbySnapshotEvery
// (pg_log_standby_snapshot(), PostgreSQL 16+: a small WAL record), as several may be needed while
// transactions are open there. A role that may not call it (superuser only unless granted) is
// told once, and the creation then waits for the primary's own records.
func (s *Stream) nudgeStandbyCreation(ctx context.Context, began time.Time) {
	s.log.Info("creating the replication slot on a standby: it waits for a running-transactions record from the primary (written about every 15 s on an active primary, none on an idle one); asking the primary for one with pg_log_standby_snapshot() every second",
		zap.String("slot", s.cfg.Slot))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			conn.Close(cctx)
		}
	}()
	warned := false
	ticker := time.NewTicker(standbySnapshotEvery)
	defer ticker.Stop()
	for {
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = s.cfg.ConnectPrimary(ctx)
		}
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT pg_catalog.pg_log_standby_snapshot()")
		}
		if err != nil && ctx.Err() == nil && !warned {
			warned = true
			s.log.Warn("cannot ask the primary for a running-transactions record (pg_log_standby_snapshot(), superuser only unless granted: GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO <role>); the slot's creation on the standby waits for the primary's own, about every 15 s while it writes",
				zap.String("slot", s.cfg.Slot), zap.Duration("waited", time.Since(began).Round(time.Millisecond)), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (s *Stream) watchCreation(ctx context.Context, walsender int32, began time.Time, times creationWaitTimes) {
	defer s.m.SlotCreationWait.Set(0)
	var conn *pgx.Conn
	closeConn := func() {
		// ctx has ended, or the connection failed: a goodbye bounded in time, then the socket.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		conn.Close(cctx)
		conn = nil
	}
	defer func() {
		if conn != nil {
			closeConn()
		}
	}()
	var logged time.Time
	var last string
	timer := time.NewTimer(times.first)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		timer.Reset(times.poll)
		if conn == nil {
			c, err := s.cfg.Connect(ctx)
			if err != nil {
				s.log.Debug("cannot look at what the slot's creation waits for", zap.Error(err))
				continue
			}
			conn = c
		}
		w, ok, err := SlotCreationWait(ctx, conn, walsender)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Debug("cannot look at what the slot's creation waits for", zap.Error(err))
			}
			closeConn()
			continue
		}
		if !ok {
			s.m.SlotCreationWait.Set(0)
			continue
		}
		now := time.Now()
		s.m.SlotCreationWait.Set(now.Sub(began).Seconds())
		if w.XID == last && now.Sub(logged) < times.logEvery {
			continue
		}
		logged, last = now, w.XID
		fields := []zap.Field{zap.String("slot", s.cfg.Slot), zap.Duration("waited", now.Sub(began).Round(time.Millisecond)),
			zap.Int32("walsender_pid", walsender), zap.String("xid", w.XID)}
		if w.Prepared() {
			fields = append(fields, zap.String("prepared_gid", w.GID), zap.String("owner", w.Owner), zap.String("database", w.Database))
		} else {
			fields = append(fields, zap.Int32("blocking_pid", w.PID), zap.String("application_name", w.Application),
				zap.String("client_addr", w.Client), zap.String("state", w.State))
		}
		if !w.Since.IsZero() {
			fields = append(fields, zap.Duration("transaction_age", now.Sub(w.Since).Round(time.Second)))
		}
		s.log.Warn("creating the replication slot waits for a transaction that began before it to end (PostgreSQL waits for every one holding a transaction id, prepared ones too): "+w.Describe(now), fields...)
	}
}
