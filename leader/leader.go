// Package leader elects the one relay instance that streams a replication slot: the instance whose
// ordinary PostgreSQL connection holds a session-level advisory lock keyed by the slot's name. The
// others stand by, retrying on an interval. The lock lives exactly as long as its connection, so
// the leader checks that connection often and gives up leadership (fences itself) the moment it
// fails: by then another instance may already hold the lock.
package leader

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
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
	// CheckTimeout bounds one check (and one lock attempt). Default 3s: long enough for a loaded
	// server to answer SELECT 1, short enough that a partitioned leader fences itself quickly.
	CheckTimeout time.Duration
	// OnStandby, when set, is told after every attempt whether this standby is connected and
	// waiting (true) or cannot reach PostgreSQL (false).
	OnStandby func(connected bool)
}

func (c *Config) setDefaults() {
	if c.RetryInterval <= 0 {
		c.RetryInterval = 2 * time.Second
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = time.Second
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = 3 * time.Second
	}
	if c.OnStandby == nil {
		c.OnStandby = func(bool) {}
	}
}

// Elector campaigns for the leader lock of one slot.
type Elector struct {
	cfg Config
	key int64
	log *zap.Logger
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
				t := newTerm(conn, e.cfg)
				conn = nil // the term owns it now
				return t, nil
			default:
				e.cfg.OnStandby(true)
				downLogged = false
				if !waitingLogged {
					fields := []zap.Field{zap.String("slot", e.cfg.Slot), zap.Duration("retry_interval", e.cfg.RetryInterval)}
					if h, held, err := LockHolder(ctx, conn, e.cfg.Slot); err == nil && held {
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
	return conn, nil
}

func (e *Elector) tryLock(ctx context.Context, conn *pgx.Conn) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", e.key).Scan(&got); err != nil {
		return false, fmt.Errorf("pg_try_advisory_lock: %w", err)
	}
	return got, nil
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

func newTerm(conn *pgx.Conn, cfg Config) *Term {
	t := &Term{conn: conn, lost: make(chan struct{}), stop: make(chan struct{}),
		done: make(chan struct{}), pid: conn.PgConn().PID()}
	go t.watch(cfg.CheckInterval, cfg.CheckTimeout)
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
// lock is still held.
func (t *Term) watch(interval, timeout time.Duration) {
	defer close(t.done)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-ticker.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, err := t.conn.Exec(ctx, "SELECT 1")
		cancel()
		if err != nil {
			t.lostErr = fmt.Errorf("leader lock connection (backend PID %d) failed: %w", t.pid, err)
			close(t.lost)
			return
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
