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
// silent for Lease. The leader, which checks the session every CheckInterval, fences itself when a
// check goes unanswered for CheckTimeout, and in any case before Lease - leaseMargin has passed
// since the sending of the last answered check, so it has stopped before the server lets the lock
// go. TCP keepalives and tcp_user_timeout on the session are the backstop for older servers.
//
// The fence is the leader's own goroutine, so it holds only while the leader's process runs: a
// process paused for longer than the lease (SIGSTOP, a frozen VM) misses its fence, and when it
// resumes, what it had in flight may reach Kafka before its next check fences it, while another
// instance already leads. That is a duplicate, never a loss: a leader confirms to the slot only
// what Kafka acknowledged. Only a producer epoch in Kafka fences such a zombie for good.
package leader

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/credentials"
)

// Key is the advisory lock key for slot: an FNV-1a hash of "outbox-relay/<slot>". Relays of
// different slots never contend, and `outbox-relay status` finds the holder with the same key.
// Advisory locks are per database, like logical slots.
func Key(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("outbox-relay/" + slot))
	return int64(h.Sum64())
}

// candidateKey is the advisory lock key standbys ready to take over hold shared (see
// Config.BeforeLock and Term.Standbys); a different hash input than Key, so it never contends
// with the leader lock.
func candidateKey(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("outbox-relay-candidate/" + slot))
	return int64(h.Sum64())
}

// Config configures an Elector. Zero durations get the defaults noted.
type Config struct {
	DSN          string
	PasswordFile string // pg_password_file: read for every connection, so a rotated password is used at the next reconnect
	Slot         string
	// RetryInterval is how often a standby tries to take the lock. Default 2s.
	RetryInterval time.Duration
	// CheckInterval is how often the leader checks its lock connection. Default 1s: it bounds how
	// long a leader that lost the lock may go on streaming.
	CheckInterval time.Duration
	// CheckTimeout bounds one check (and one lock attempt). Default 5s: long enough for a loaded
	// server to answer a check, short enough that a partitioned leader fences itself quickly. A
	// check answered within it never fences the leader, however many in a row are that slow; it
	// lengthens the lease, and so a takeover after a network partition, two for one.
	CheckTimeout time.Duration
	// OnStandby, when set, is told after every attempt whether this standby is connected and
	// waiting (true) or cannot reach PostgreSQL (false).
	OnStandby func(connected bool)
	// BeforeLock, when set, is asked before every attempt to take the lock: while it returns an
	// error this standby does not try, leaving the lock to an instance that could work as leader
	// (the relay's: its Kafka must answer). contended says whether this campaign has seen another
	// instance hold the lock. It must honour ctx and return within a few seconds. A standby that
	// has seen another instance hold the lock and for which it passes holds a shared advisory lock
	// (candidateKey) on its session while it waits, so the leader knows that an instance ready to
	// take over is waiting (Term.Standbys).
	BeforeLock func(ctx context.Context, contended bool) error
	// OnSlowCheck, when set, is called for every check of the leader's lock connection that took
	// more than half of CheckTimeout: a near miss, a check that takes CheckTimeout fences the leader.
	OnSlowCheck func(took time.Duration)
}

// leaseMargin is how long before PostgreSQL may end a silent leader's lock session the leader has
// fenced itself: time for the fence to take effect, and for clocks that run at slightly different
// rates on the two hosts.
const leaseMargin = 2 * time.Second

// Lease is how long PostgreSQL keeps the lock session of a leader it has not heard from: its
// idle_session_timeout. The server's idle clock restarts no earlier than a check is sent. A check
// sent at s and answered within CheckTimeout is followed by the next at most CheckInterval after
// the answer, which may itself take CheckTimeout: s + CheckInterval + 2×CheckTimeout is the
// latest a check that never fences must be answered by, and the lease adds leaseMargin to that.
func (c Config) Lease() time.Duration {
	c.setDefaults()
	return c.CheckInterval + 2*c.CheckTimeout + leaseMargin
}

// fenceBy is how long after sending the last answered check the leader may go on: leaseMargin
// before PostgreSQL may end its session.
func (c Config) fenceBy() time.Duration { return c.Lease() - leaseMargin }

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

// ErrCredentials means the leader-lock connection failed for a reason retrying cannot fix:
// PostgreSQL refused the credentials, or the relay does not trust its certificate.
var ErrCredentials = errors.New("cannot connect to PostgreSQL for the leader lock")

// ErrTransactionPooler means the leader-lock connection goes through a pooler in transaction mode
// (PgBouncer's pool_mode = transaction, or statement): a session-level advisory lock then sits on
// whichever pooled server connection ran the statement, which other clients share and which the
// pooler or PostgreSQL may close while the checks succeed on another: two instances could lead.
var ErrTransactionPooler = errors.New("the leader lock needs its own PostgreSQL session, but its connection goes through a pooler in transaction mode " +
	"(each statement may run on another server connection, shared with other clients): point leader_dsn (or pg_dsn) " +
	"at PostgreSQL directly or at a session-mode pool (PgBouncer pool_mode = session)")

// Campaign stands by until this instance holds the lock, and returns the leadership term. It
// returns an error only when ctx ends, PostgreSQL refuses the credentials, or the connection goes
// through a pooler in transaction mode (ErrTransactionPooler): retrying cannot fix those; an
// unreachable server is retried.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	// conn is the session that asks for the lock; probe is a second one, kept open alongside, that
	// makes sure the lock taken is conn's own (see verifySession).
	var conn, probe *pgx.Conn
	announced := false // conn holds the candidate lock
	drop := func() {
		for _, c := range []*pgx.Conn{conn, probe} {
			if c != nil {
				closeQuietly(c)
			}
		}
		conn, probe, announced = nil, nil, false
	}
	defer func() { drop() }()
	waitingLogged, downLogged, unfitLogged := false, false, false
	var previous *Holder // the session seen holding the lock while this instance stood by
	for {
		if conn == nil {
			c, err := e.connect(ctx)
			var p *pgx.Conn
			if err == nil {
				if p, err = e.connect(ctx); err != nil {
					closeQuietly(c)
				}
			}
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
				conn, probe = c, p
			}
		}
		var unfit error
		if conn != nil && e.cfg.BeforeLock != nil {
			unfit = e.cfg.BeforeLock(ctx, previous != nil)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if unfit != nil {
				// Still a standby connected to PostgreSQL: OnStandby stays as last reported.
				if !unfitLogged {
					e.log.Warn("standby: not trying to take the leader lock while this instance could not work as leader; checking again every retry interval",
						zap.String("slot", e.cfg.Slot), zap.Error(unfit), zap.Duration("retry_interval", e.cfg.RetryInterval))
					unfitLogged = true
				}
			} else if unfitLogged {
				e.log.Info("standby: this instance could work as leader again; competing for the leader lock", zap.String("slot", e.cfg.Slot))
				unfitLogged = false
			}
			if err := e.announce(ctx, conn, unfit == nil && previous != nil, &announced); err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				drop()
				e.cfg.OnStandby(false)
				e.log.Warn("leader lock: announcing this standby failed; reconnecting", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			}
		}
		if conn != nil && unfit == nil {
			sent := time.Now()
			got, pid, err := e.tryLock(ctx, conn)
			if err == nil && got {
				sent, err = e.verifySession(ctx, conn, probe, pid)
			}
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, ErrTransactionPooler):
				if got {
					e.unlockPooled(conn, pid)
				}
				return nil, err
			case err != nil:
				// The outcome is unknown; closing the session releases the lock if it was granted.
				drop()
				e.cfg.OnStandby(false)
				e.log.Warn("leader lock attempt failed; reconnecting", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			case got:
				t, err := e.begin(ctx, conn, sent, previous, pid)
				if err == nil {
					conn = nil // the term owns it now
					return t, nil
				}
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				// The session may be gone, and the lock with it: closing it makes sure, and the
				// next attempt starts over.
				drop()
				e.cfg.OnStandby(false)
				e.log.Warn("took the leader lock but lost the answer of its session while ending the previous leader's walsender; reconnecting",
					zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			default:
				e.cfg.OnStandby(true)
				downLogged = false
				hctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
				h, held, err := LockHolder(hctx, conn, e.cfg.Slot)
				cancel()
				if err == nil && held {
					previous = rememberHolder(previous, h)
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

// rememberHolder is the holder a standby keeps after seeing h hold the lock, having seen
// previous before (nil if none). LockHolder reads pg_locks and pg_stat_activity at slightly
// different moments, so a holder seen while its backend exits can be listed with the lock but
// without its activity row, and so without the walsender it published (3 in 300 sightings of an
// exiting holder here): that sighting must not make the standby forget the walsender it is to end
// when it takes over. A sighting with the row is believed, also for the same PID (a new session
// may reuse an exited one's PID).
func rememberHolder(previous *Holder, h Holder) *Holder {
	if previous != nil && previous.PID == h.PID && h.exiting {
		return previous
	}
	return &h
}

func (e *Elector) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := credentials.PostgresConfig(e.cfg.DSN, e.cfg.PasswordFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCredentials, err)
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "outbox-relay"
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second // a blackholed server must not stall the campaign
	}
	// One round trip per statement (no prepare first): a statement's time is then one round trip
	// plus the server's work, which the lease arithmetic counts on.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		if line, ok := credentials.ExplainTLS(err, credentials.PostgresTLSKeys); ok {
			return nil, fmt.Errorf("%w: %s", ErrCredentials, line)
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code[:2] == "28":
			return nil, fmt.Errorf("%w (%s): %s", ErrCredentials, pgErr.Message, credentials.PostgresRefusalFix(pgErr.Message))
		case errors.As(err, &pgErr) && pgErr.Code == "3D000":
			return nil, fmt.Errorf("%w (%s): fix the database in pg_dsn", ErrCredentials, pgErr.Message)
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

// announce makes conn hold the candidate lock (want) or not, when it does not already.
func (e *Elector) announce(ctx context.Context, conn *pgx.Conn, want bool, announced *bool) error {
	if want == *announced {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	q := "SELECT pg_advisory_unlock_shared($1)"
	if want {
		q = "SELECT pg_try_advisory_lock_shared($1)"
	}
	if _, err := conn.Exec(ctx, q, candidateKey(e.cfg.Slot)); err != nil {
		return fmt.Errorf("%s: %w", q, err)
	}
	*announced = want
	return nil
}

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

// begin starts a term on conn, whose backend pid has just taken the lock with a statement sent at sent, after
// ending the previous holder's walsender. It fails when the session's state is unknown (a statement
// went unanswered, so pgx closed the connection): the lock may be gone with it.
func (e *Elector) begin(ctx context.Context, conn *pgx.Conn, sent time.Time, previous *Holder, pid int32) (*Term, error) {
	if previous != nil {
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
	cancel  context.CancelFunc // ends a check in flight when the term is released
	done    chan struct{}
	pid     uint32
	publish chan publication // PublishWalsender's requests, served by watch
	// standbys is how many other sessions held the candidate lock at the last check.
	standbys atomic.Int32
}

// Standbys is how many standbys ready to take over (see Config.BeforeLock) waited at the last
// check of the lock connection.
func (t *Term) Standbys() int { return int(t.standbys.Load()) }

// newTerm starts watching the lock connection, whose backend pid holds the lock; sent is when the
// last statement the session answered was sent, where the first lease begins.
func newTerm(conn *pgx.Conn, cfg Config, log *zap.Logger, sent time.Time, pid uint32) *Term {
	ctx, cancel := context.WithCancel(context.Background())
	t := &Term{conn: conn, lost: make(chan struct{}), stop: make(chan struct{}), cancel: cancel,
		done: make(chan struct{}), pid: pid, publish: make(chan publication)}
	go t.watch(ctx, cfg, log, sent)
	return t
}

// PID is the PostgreSQL backend that holds the lock (pg_backend_pid: behind a pooler the
// connection's own PID is one the pooler made up).
func (t *Term) PID() uint32 { return t.pid }

// PublishWalsender publishes pid, the backend of this leader's replication connection, in the
// lock session's application_name (" walsender=<pid>" appended), so that the next leader ends
// exactly that walsender should this one be cut off, and returns once it is published. Call it
// in each replication session before the session uses the slot (replication.Config.OnWalsender):
// a leader that stalls at any moment after (a pause, a frozen VM) leaves the next leader the
// walsender it is to end, instead of a slot busy until wal_sender_timeout (60s by default). It
// publishes only a walsender of the lock session's role and client address, started after the lock
// session; another is left unpublished, with a warning. The publication is a check of the lock
// too: it fails when the term is lost or released, and the caller must then not stream.
func (t *Term) PublishWalsender(ctx context.Context, pid int32) error {
	p := publication{pid: pid, done: make(chan error, 1)}
	select {
	case t.publish <- p:
	case <-t.done:
		return t.ended()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-p.done: // watch answers every request it takes, also as it returns
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// publication is a request of PublishWalsender; done gets its outcome.
type publication struct {
	pid  int32
	done chan error
}

// ended is why a term whose watch has returned publishes nothing.
func (t *Term) ended() error {
	if err := t.Err(); err != nil {
		return fmt.Errorf("leader term lost: %w", err)
	}
	return errors.New("leader term released")
}

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

// walsenderTag precedes the walsender PID a leader publishes in its lock session's application_name.
const walsenderTag = " walsender="

// watch is the only user of the connection while the term lasts (pgx.Conn is not safe for
// concurrent use). A session lock lasts as long as its session, so each check makes sure the
// session is still the one that took it: the statement ran on the lock's backend and pg_locks
// shows the lock granted to it. A working connection alone proves nothing behind a pooler that
// runs statements on other server connections while the one that held the lock was closed (its
// idle_session_timeout, the pooler's server_lifetime). The server's idle clock for the session
// restarts no earlier than a check is sent, so the lease, as the server counts it, runs at least
// until the last answered check's sending plus Lease. A check ends at CheckTimeout, or at fenceBy
// after the sending of the last answered one, whichever is first (the latter only binds when this
// goroutine did not run for a while: see Config.Lease); an unanswered check, or one that finds
// another backend or the lock gone, ends the term.
func (t *Term) watch(ctx context.Context, cfg Config, log *zap.Logger, sent time.Time) {
	defer close(t.done)
	app := t.conn.Config().RuntimeParams["application_name"]
	hi, lo := keyHalves(Key(cfg.Slot))
	chi, clo := keyHalves(candidateKey(cfg.Slot))
	standbys := `(SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid <> pg_backend_pid()
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND classid::bigint = $3 AND objid::bigint = $4)`
	ticker := time.NewTicker(cfg.CheckInterval)
	defer ticker.Stop()
	warned := false // of a walsender it could not publish
	for {
		var pub *publication // a check that also publishes a walsender
		answer := func(err error) {
			if pub != nil {
				pub.done <- err
			}
		}
		select {
		case <-t.stop:
			return
		case <-ticker.C:
		case p := <-t.publish:
			pub = &p
		}
		start := time.Now()
		deadline := start.Add(cfg.CheckTimeout)
		if end := sent.Add(cfg.fenceBy()); end.Before(deadline) {
			deadline = end
		}
		query, args := `SELECT pg_backend_pid(), `+heldByBackend(1, 2)+`, `+standbys, []any{hi, lo, chi, clo}
		if pub != nil {
			query += `, (SELECT set_config('application_name', left($6::text, 63 - length($7::text || w.pid::text)) || $7::text || w.pid::text, false)
				FROM pg_stat_activity w JOIN pg_stat_activity me ON me.pid = pg_backend_pid()
				WHERE w.pid = $5 AND w.backend_type = 'walsender' AND w.usesysid = me.usesysid
				  AND w.client_addr IS NOT DISTINCT FROM me.client_addr AND w.backend_start >= me.backend_start) IS NOT NULL,
				EXISTS (SELECT FROM pg_stat_activity WHERE pid = $5 AND backend_type = 'walsender')`
			args = append(args, pub.pid, app, walsenderTag)
		}
		cctx, cancel := context.WithDeadline(ctx, deadline)
		var pid, waiting int32
		var held, published, exists bool
		var err error
		if pub != nil {
			err = t.conn.QueryRow(cctx, query, args...).Scan(&pid, &held, &waiting, &published, &exists)
		} else {
			err = t.conn.QueryRow(cctx, query, args...).Scan(&pid, &held, &waiting)
		}
		cancel()
		took := time.Since(start)
		select {
		case <-t.stop:
			answer(t.ended())
			return // released: the check was cut short on purpose
		default:
		}
		switch {
		case err != nil:
			t.lostErr = fmt.Errorf("leader lock connection (backend PID %d) failed, or did not answer a check within leader_check_timeout (%s) or %s after the last answered one (PostgreSQL may end a silent leader's lock session %s after it): %w",
				t.pid, cfg.CheckTimeout, cfg.fenceBy(), cfg.Lease(), err)
		case uint32(pid) != t.pid:
			t.lostErr = fmt.Errorf("leader lock of slot %q: the check ran on backend PID %d, not on backend PID %d that took the lock: the lock's session is gone (a pooler in transaction mode, or one that reconnected): %w",
				cfg.Slot, pid, t.pid, ErrTransactionPooler)
		case !held:
			t.lostErr = fmt.Errorf("leader lock of slot %q: pg_locks no longer shows it granted to backend PID %d (released by a statement outside the relay, e.g. pg_advisory_unlock_all or DISCARD ALL)",
				cfg.Slot, t.pid)
		}
		if t.lostErr != nil {
			close(t.lost)
			answer(t.ended())
			return
		}
		t.standbys.Store(waiting)
		sent = start
		// A walsender already gone (its connection cut meanwhile) fails its session anyway.
		if pub != nil && !published && exists && !warned {
			warned = true
			log.Warn("the replication connection's walsender was not published as this leader's: it is not of the leader lock session's role and client address (leader_dsn with another user than pg_dsn, or through a pooler on another host). Should this leader be cut off, the next one waits for the slot until PostgreSQL ends this walsender (wal_sender_timeout)",
				zap.Int32("walsender_pid", pub.pid), zap.Uint32("lock_pid", t.pid))
		}
		answer(nil)
		if took > cfg.CheckTimeout/2 {
			cfg.OnSlowCheck(took)
			log.Warn("the leader lock check was slow: a check that takes leader_check_timeout fences this leader; raise it if the database is often this slow",
				zap.Duration("took", took), zap.Duration("leader_check_timeout", cfg.CheckTimeout))
		}
	}
}

// Release ends the term: it stops the checks, cutting one in flight short, and closes the
// connection, which releases the lock.
func (t *Term) Release() {
	close(t.stop)
	t.cancel()
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
	ApplicationName string    `json:"application_name"` // as configured, without the published walsender
	ClientAddr      string    `json:"client_addr"`      // "local" for a Unix socket; empty when not visible to this role
	BackendStart    time.Time `json:"backend_start,omitzero"`
	// WalsenderPID is the walsender the holder published as its own (see Term.PublishWalsender); 0 if none.
	WalsenderPID int32 `json:"walsender_pid,omitempty"`

	exiting bool // listed in pg_locks without a pg_stat_activity row: its backend is exiting
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
	err := q.QueryRow(ctx, `SELECT l.pid, a.pid IS NULL, a.application_name, CASE WHEN a.pid IS NULL THEN NULL
			WHEN a.client_addr IS NULL AND a.backend_start IS NOT NULL THEN 'local' ELSE host(a.client_addr) END, a.backend_start
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid::bigint = $1 AND l.objid::bigint = $2
		LIMIT 1`, int64(key>>32), int64(key&0xffffffff)).Scan(&h.PID, &h.exiting, &app, &addr, &start)
	if errors.Is(err, pgx.ErrNoRows) {
		return Holder{}, false, nil
	}
	if err != nil {
		return Holder{}, false, fmt.Errorf("read the leader lock holder from pg_locks: %w", err)
	}
	if app != nil {
		h.ApplicationName = *app
		if i := strings.LastIndex(*app, walsenderTag); i >= 0 {
			if pid, err := strconv.ParseInt((*app)[i+len(walsenderTag):], 10, 32); err == nil {
				h.ApplicationName, h.WalsenderPID = (*app)[:i], int32(pid)
			}
		}
	}
	if addr != nil {
		h.ClientAddr = *addr
	}
	if start != nil {
		h.BackendStart = *start
	}
	return h, true, nil
}
