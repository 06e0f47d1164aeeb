// Package leader elects the one relay instance that streams a replication slot: the instance whose
// ordinary PostgreSQL connection holds a session-level advisory lock keyed by the slot's name. The
// others stand by, retrying on an interval. The lock lives exactly as long as its connection, so
// the leader checks that connection often and gives up leadership (fences itself) the moment it
// fails: by then another instance may already hold the lock.
//
// The lock is a lease that PostgreSQL enforces. A leader cut off from the network without a reset
// would otherwise keep its idle session, and the lock, until the operating system's TCP keepalive
// gave up (two hours by default). So the lock session carries idle_session_timeout = Lease
// (PostgreSQL 14 and later): the server ends it, and releases the lock, once the leader has been
// silent for Lease. The leader, which checks the session every CheckInterval, fences itself when
// no check sent within the last Lease - leaseMargin has been answered, so it has stopped before
// the server lets the lock go. TCP keepalives and tcp_user_timeout on the session are the backstop
// for older servers.
package leader

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Key is the advisory lock key for slot: an FNV-1a hash of "outbox-relay/<slot>". Relays of
// different slots never contend, and `outbox-relay status` finds the holder with the same key.
// Advisory locks are per database, like logical slots.
func Key(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("outbox-relay/" + slot))
	return int64(h.Sum64())
}

// Config configures an Elector. Zero durations get the defaults noted.
type Config struct {
	DSN  string
	Slot string
	// RetryInterval is how often a standby tries to take the lock. Default 2s.
	RetryInterval time.Duration
	// CheckInterval is how often the leader checks its lock connection. Default 1s: it bounds how
	// long a leader that lost the lock may go on streaming.
	CheckInterval time.Duration
	// CheckTimeout bounds one check (and one lock attempt). Default 5s: long enough for a loaded
	// server to answer SELECT 1, short enough that a partitioned leader fences itself quickly. It
	// lengthens the lease, and so a takeover after a network partition, one for one.
	CheckTimeout time.Duration
	// OnStandby, when set, is told after every attempt whether this standby is connected and
	// waiting (true) or cannot reach PostgreSQL (false).
	OnStandby func(connected bool)
	// OnSlowCheck, when set, is called for every check of the leader's lock connection that took
	// more than half of CheckTimeout: a near miss, the leader was that close to fencing itself.
	OnSlowCheck func(took time.Duration)
}

// leaseMargin is how long before PostgreSQL may end a silent leader's lock session the leader has
// fenced itself: time for the fence to take effect, and for clocks that run at slightly different
// rates on the two hosts.
const leaseMargin = 2 * time.Second

// Lease is how long PostgreSQL keeps the lock session of a leader it has not heard from: its
// idle_session_timeout. A leader's checks are CheckInterval apart and each may take CheckTimeout,
// and the leader fences itself leaseMargin before the lease runs out.
func (c Config) Lease() time.Duration {
	c.setDefaults()
	return c.CheckInterval + c.CheckTimeout + leaseMargin
}

func (c *Config) setDefaults() {
	if c.RetryInterval <= 0 {
		c.RetryInterval = 2 * time.Second
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = time.Second
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = 5 * time.Second
	}
	if c.OnStandby == nil {
		c.OnStandby = func(bool) {}
	}
	if c.OnSlowCheck == nil {
		c.OnSlowCheck = func(time.Duration) {}
	}
}

// Elector campaigns for the leader lock of one slot.
type Elector struct {
	cfg       Config
	key       int64
	log       *zap.Logger
	warnedOld bool // about a server without idle_session_timeout
}

// New returns an Elector. Nothing is contacted until Campaign.
func New(cfg Config, log *zap.Logger) *Elector {
	cfg.setDefaults()
	return &Elector{cfg: cfg, key: Key(cfg.Slot), log: log}
}

// ErrCredentials means PostgreSQL refused the connection for a reason retrying cannot fix.
var ErrCredentials = errors.New("PostgreSQL refused the leader-lock connection")

// Campaign stands by until this instance holds the lock, and returns the leadership term. It
// returns an error only when ctx ends or PostgreSQL refuses the credentials (retrying cannot fix
// that); an unreachable server is retried.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeQuietly(conn)
		}
	}()
	waitingLogged, downLogged := false, false
	var previous *Holder // the session seen holding the lock while this instance stood by
	for {
		if conn == nil {
			c, err := e.connect(ctx)
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, ErrCredentials):
				return nil, err
			case err != nil:
				e.cfg.OnStandby(false)
				if !downLogged {
					e.log.Warn("standby cannot reach PostgreSQL; retrying", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
					downLogged = true
				}
			default:
				conn = c
			}
		}
		if conn != nil {
			sent := time.Now()
			got, err := e.tryLock(ctx, conn)
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case err != nil:
				// The outcome is unknown; closing the session releases the lock if it was granted.
				closeQuietly(conn)
				conn = nil
				e.cfg.OnStandby(false)
				e.log.Warn("leader lock attempt failed; reconnecting", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			case got:
				if previous != nil {
					// Its statements restart the server's idle clock, and so the lease.
					if answered := e.endStaleWalsender(ctx, conn, *previous); !answered.IsZero() {
						sent = answered
					}
				}
				t := newTerm(conn, e.cfg, e.log, sent)
				conn = nil // the term owns it now
				return t, nil
			default:
				e.cfg.OnStandby(true)
				downLogged = false
				hctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
				h, held, err := LockHolder(hctx, conn, e.cfg.Slot)
				cancel()
				if err == nil && held {
					previous = &h
				}
				if !waitingLogged {
					fields := []zap.Field{zap.String("slot", e.cfg.Slot), zap.Duration("retry_interval", e.cfg.RetryInterval)}
					if err == nil && held {
						fields = append(fields, zap.Int32("leader_pid", h.PID), zap.String("leader_application_name", h.ApplicationName),
							zap.String("leader_client", h.ClientAddr))
					}
					e.log.Info("standby: another instance holds the leader lock; waiting to take over", fields...)
					waitingLogged = true
				}
			}
		}
		select {
		case <-time.After(e.cfg.RetryInterval):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (e *Elector) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(e.cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("%w: pg_dsn: %w", ErrCredentials, err)
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "outbox-relay"
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second // a blackholed server must not stall the campaign
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code[:2] == "28" || pgErr.Code == "3D000") {
			return nil, fmt.Errorf("%w (%s): fix the user, password or database in pg_dsn", ErrCredentials, pgErr.Message)
		}
		return nil, fmt.Errorf("connect to PostgreSQL for the leader lock: %w", err)
	}
	if err := e.setKeepalives(ctx, conn); err != nil {
		closeQuietly(conn)
		return nil, err
	}
	return conn, nil
}

// setKeepalives makes PostgreSQL notice a peer that went silent on the lock session: keepalive
// probes after Lease of silence, one a second, three unanswered ones end the session; and
// tcp_user_timeout ends it when what the server sent goes unacknowledged for Lease. They are the
// lease's backstop where idle_session_timeout is missing (before PostgreSQL 14), and they work
// only on a real network path: a proxy or load balancer in between answers them itself. They are
// session settings any role may make, set after the connection so that an older server's
// unknown parameter does not refuse it.
func (e *Elector) setKeepalives(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	lease := e.cfg.Lease()
	idle := strconv.Itoa(int(math.Ceil(lease.Seconds())))
	sql := `SELECT set_config('tcp_keepalives_idle', $1, false), set_config('tcp_keepalives_interval', '1', false),
		set_config('tcp_keepalives_count', '3', false)`
	args := []any{idle}
	if serverMajor(conn) >= 12 {
		sql += `, set_config('tcp_user_timeout', $2, false)`
		args = append(args, strconv.FormatInt(lease.Milliseconds(), 10))
	}
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("set TCP keepalives on the leader-lock connection: %w", err)
	}
	return nil
}

// tryLock asks for the lock. On PostgreSQL 14 and later the session that gets it gets the lease
// (idle_session_timeout) in the same statement, so no moment exists in which the lock is held
// without one; a session that does not get it keeps no timeout, since a standby is idle for
// RetryInterval between attempts.
func (e *Elector) tryLock(ctx context.Context, conn *pgx.Conn) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	var got bool
	if serverMajor(conn) < 14 {
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", e.key).Scan(&got); err != nil {
			return false, fmt.Errorf("pg_try_advisory_lock: %w", err)
		}
		if got && !e.warnedOld {
			e.warnedOld = true
			e.log.Warn("PostgreSQL before 14 has no idle_session_timeout, so it cannot end the lock session of a leader cut off from the network before TCP keepalives do (and a proxy in between may answer those): a standby may wait long to take over",
				zap.String("server_version", conn.PgConn().ParameterStatus("server_version")))
		}
		return got, nil
	}
	err := conn.QueryRow(ctx, `SELECT CASE WHEN pg_try_advisory_lock($1)
		THEN set_config('idle_session_timeout', $2, false) IS NOT NULL ELSE false END`,
		e.key, strconv.FormatInt(e.cfg.Lease().Milliseconds(), 10)).Scan(&got)
	if err != nil {
		return false, fmt.Errorf("pg_try_advisory_lock: %w", err)
	}
	return got, nil
}

// endStaleWalsender ends the walsender of the previous leader when it still streams the slot. A
// leader cut off from the network leaves its replication connection behind too, and PostgreSQL
// keeps the slot active for it until wal_sender_timeout (60s by default) while the new leader
// cannot stream. Holding the lock proves that the previous leader has fenced itself (it does so
// before its lease ends), so that walsender serves nobody. It is told apart by coming from the
// same client (address and application_name) as the lock session seen before, and starting no
// earlier: the walsender of anything outside the election (a relay with leader_election off,
// Debezium) is left alone. Without the right to end it (another role's backend needs
// pg_signal_backend; a superuser's, superuser) the new leader waits for the slot as for any busy one.
// It returns when the last statement the server answered was sent (zero if none).
func (e *Elector) endStaleWalsender(ctx context.Context, conn *pgx.Conn, prev Holder) (answered time.Time) {
	if prev.ApplicationName == "" || prev.ClientAddr == "" {
		return // the previous holder's session was not visible to this role: nothing to match
	}
	ctx, cancel := context.WithTimeout(ctx, 2*e.cfg.CheckTimeout)
	defer cancel()
	var pgErr *pgconn.PgError
	var pid int32
	sent := time.Now()
	err := conn.QueryRow(ctx, `SELECT s.active_pid FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1 AND s.active AND s.database = current_database()
		  AND a.application_name = $2 AND a.backend_start >= $4
		  AND CASE WHEN a.client_addr IS NULL THEN 'local' ELSE host(a.client_addr) END = $3`,
		e.cfg.Slot, prev.ApplicationName, prev.ClientAddr, prev.BackendStart).Scan(&pid)
	if err == nil || errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pgErr) {
		answered = sent
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return answered
	}
	fields := []zap.Field{zap.String("slot", e.cfg.Slot), zap.Int32("walsender_pid", pid), zap.Int32("previous_lock_pid", prev.PID),
		zap.String("previous_leader_application_name", prev.ApplicationName), zap.String("previous_leader_client", prev.ClientAddr)}
	if err != nil {
		e.log.Warn("cannot look for the previous leader's walsender; if it still holds the slot, waiting until PostgreSQL ends it (wal_sender_timeout)",
			append(fields, zap.Error(err))...)
		return answered
	}
	// Wait (PostgreSQL 14 and later) for it to exit, so the slot is free when streaming starts.
	query := "SELECT pg_terminate_backend($1)"
	args := []any{pid}
	if serverMajor(conn) >= 14 {
		query = "SELECT pg_terminate_backend($1, $2)"
		args = append(args, e.cfg.CheckTimeout.Milliseconds())
	}
	var ended bool
	sent = time.Now()
	err = conn.QueryRow(ctx, query, args...).Scan(&ended)
	if err == nil || errors.As(err, &pgErr) {
		answered = sent
	}
	if err != nil {
		e.log.Warn("cannot end the previous leader's walsender, which keeps the slot active after that leader lost the lock (the relay's role needs pg_signal_backend to end another role's backends); waiting until PostgreSQL ends it (wal_sender_timeout)",
			append(fields, zap.Error(err))...)
		return answered
	}
	e.log.Info("ended the previous leader's walsender, which kept the slot active after that leader lost the lock",
		append(fields, zap.Bool("exited", ended))...)
	return answered
}

// serverMajor is the connected server's major version, 0 when unknown.
func serverMajor(conn *pgx.Conn) int {
	v := conn.PgConn().ParameterStatus("server_version")
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, _ := strconv.Atoi(v[:end])
	return n
}

// Term is one period of leadership. It ends when Release is called or the lock connection fails
// (Lost is closed); either way the caller must stop streaming at once and call Release.
type Term struct {
	conn *pgx.Conn

	lost    chan struct{}
	lostErr error
	stop    chan struct{}
	done    chan struct{}
	pid     uint32
}

// newTerm starts watching the lock connection; sent is when the statement that took the lock was
// sent, where the first lease begins.
func newTerm(conn *pgx.Conn, cfg Config, log *zap.Logger, sent time.Time) *Term {
	t := &Term{conn: conn, lost: make(chan struct{}), stop: make(chan struct{}),
		done: make(chan struct{}), pid: conn.PgConn().PID()}
	go t.watch(cfg, log, sent)
	return t
}

// PID is the PostgreSQL backend that holds the lock.
func (t *Term) PID() uint32 { return t.pid }

// Lost is closed when the lock connection failed: the lock may already belong to another instance.
func (t *Term) Lost() <-chan struct{} { return t.lost }

// Err says why the term was lost; nil while it holds.
func (t *Term) Err() error {
	select {
	case <-t.lost:
		return t.lostErr
	default:
		return nil
	}
}

// watch is the only user of the connection while the term lasts (pgx.Conn is not safe for
// concurrent use). A session lock lasts as long as its session, so a working connection means the
// lock is still held. The server's idle clock for the session restarts no earlier than a check is
// sent, so the lease, as the server counts it, runs at least until the last answered check's
// sending plus Lease; every check must be answered leaseMargin before that, else the term ends.
func (t *Term) watch(cfg Config, log *zap.Logger, sent time.Time) {
	defer close(t.done)
	fenceBy := cfg.Lease() - leaseMargin
	ticker := time.NewTicker(cfg.CheckInterval)
	defer ticker.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-ticker.C:
		}
		start := time.Now()
		deadline := start.Add(cfg.CheckTimeout)
		if end := sent.Add(fenceBy); end.Before(deadline) {
			deadline = end
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, err := t.conn.Exec(ctx, "SELECT 1")
		cancel()
		took := time.Since(start)
		if err != nil {
			t.lostErr = fmt.Errorf("leader lock connection (backend PID %d) failed, or did not answer a check within leader_check_timeout (%s) or %s after the last answered one (PostgreSQL may end a silent leader's lock session %s after it): %w",
				t.pid, cfg.CheckTimeout, fenceBy, cfg.Lease(), err)
			close(t.lost)
			return
		}
		sent = start
		if took > cfg.CheckTimeout/2 {
			cfg.OnSlowCheck(took)
			log.Warn("the leader lock check was slow: at leader_check_timeout this leader fences itself; raise it if the database is often this slow",
				zap.Duration("took", took), zap.Duration("leader_check_timeout", cfg.CheckTimeout))
		}
	}
}

// Release ends the term: it stops the checks and closes the connection, which releases the lock.
func (t *Term) Release() {
	close(t.stop)
	<-t.done
	closeQuietly(t.conn)
}

func closeQuietly(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn.Close(ctx)
}

// Holder describes the session that holds a slot's leader lock.
type Holder struct {
	PID             int32     `json:"pid"`
	ApplicationName string    `json:"application_name"`
	ClientAddr      string    `json:"client_addr"` // "local" for a Unix socket; empty when not visible to this role
	BackendStart    time.Time `json:"backend_start,omitzero"`
}

// LockHolder finds who holds the leader lock of slot in the connected database. pg_locks shows a
// bigint advisory key as its high half in classid and its low half in objid, with objsubid 1.
// Another role's client address and start time are visible only with pg_read_all_stats.
func LockHolder(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, slot string) (Holder, bool, error) {
	key := uint64(Key(slot))
	var h Holder
	var app, addr *string
	var start *time.Time
	err := q.QueryRow(ctx, `SELECT l.pid, a.application_name, CASE WHEN a.pid IS NULL THEN NULL
			WHEN a.client_addr IS NULL AND a.backend_start IS NOT NULL THEN 'local' ELSE host(a.client_addr) END, a.backend_start
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid::bigint = $1 AND l.objid::bigint = $2
		LIMIT 1`, int64(key>>32), int64(key&0xffffffff)).Scan(&h.PID, &app, &addr, &start)
	if errors.Is(err, pgx.ErrNoRows) {
		return Holder{}, false, nil
	}
	if err != nil {
		return Holder{}, false, fmt.Errorf("read the leader lock holder from pg_locks: %w", err)
	}
	if app != nil {
		h.ApplicationName = *app
	}
	if addr != nil {
		h.ClientAddr = *addr
	}
	if start != nil {
		h.BackendStart = *start
	}
	return h, true, nil
}
