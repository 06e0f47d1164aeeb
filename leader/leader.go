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
	"hash/fnv"
	"time"

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
	// WalsenderDSN, when set, leads to the server the leader's walsender runs on when that is not
	// the lock's: decoding on a hot standby, the lock is the primary's and the slot the standby's.
	// A leader then publishes its walsender's PID without finding it in the lock server's
	// pg_stat_activity (it is not there), and a new leader ends its predecessor's walsender on
	// this server, as it does on the lock's (see endStaleWalsender). PasswordFile applies.
	WalsenderDSN string
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
