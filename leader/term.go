package leader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

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

// answer gives the request its outcome; a check without a request (nil) has no one to answer.
func (p *publication) answer(err error) {
	if p != nil {
		p.done <- err
	}
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
	check := newLockCheck(t.conn, cfg.Slot, cfg.WalsenderDSN != "")
	ticker := time.NewTicker(cfg.CheckInterval)
	defer ticker.Stop()
	warned := false // of a walsender it could not publish
	for {
		var pub *publication // a check that also publishes a walsender
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
		cctx, cancel := context.WithDeadline(ctx, deadline)
		found, err := check.run(cctx, t.conn, pub)
		cancel()
		took := time.Since(start)
		select {
		case <-t.stop:
			pub.answer(t.ended())
			return // released: the check was cut short on purpose
		default:
		}
		if lost := t.lossIn(cfg, found, err); lost != nil {
			t.lostErr = lost
			close(t.lost)
			pub.answer(t.ended())
			return
		}
		t.standbys.Store(found.standbys)
		sent = start
		// A walsender already gone (its connection cut meanwhile) fails its session anyway.
		if pub != nil && !found.published && found.exists && !warned {
			warned = true
			log.Warn("the replication connection's walsender was not published as this leader's: it is not of the leader lock session's role and client address (leader_dsn with another user than pg_dsn, or through a pooler on another host). Should this leader be cut off, the next one waits for the slot until PostgreSQL ends this walsender (wal_sender_timeout)",
				zap.Int32("walsender_pid", pub.pid), zap.Uint32("lock_pid", t.pid))
		}
		pub.answer(nil)
		if took > cfg.CheckTimeout/2 {
			cfg.OnSlowCheck(took)
			log.Warn("the leader lock check was slow: a check that takes leader_check_timeout fences this leader; raise it if the database is often this slow",
				zap.Duration("took", took), zap.Duration("leader_check_timeout", cfg.CheckTimeout))
		}
	}
}

// lossIn says why a check ends the term (err is the check's own), nil while the lock holds.
func (t *Term) lossIn(cfg Config, found checked, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("leader lock connection (backend PID %d) failed, or did not answer a check within leader_check_timeout (%s) or %s after the last answered one (PostgreSQL may end a silent leader's lock session %s after it): %w",
			t.pid, cfg.CheckTimeout, cfg.fenceBy(), cfg.Lease(), err)
	case uint32(found.pid) != t.pid:
		return fmt.Errorf("leader lock of slot %q: the check ran on backend PID %d, not on backend PID %d that took the lock: the lock's session is gone (a pooler in transaction mode, or one that reconnected): %w",
			cfg.Slot, found.pid, t.pid, ErrTransactionPooler)
	case !found.held:
		return fmt.Errorf("leader lock of slot %q: pg_locks no longer shows it granted to backend PID %d (released by a statement outside the relay, e.g. pg_advisory_unlock_all or DISCARD ALL)",
			cfg.Slot, t.pid)
	}
	return nil
}

// lockCheck is the statement a term checks its lock session with, built once per term.
type lockCheck struct {
	query   string // the check alone; a publication appends publish
	publish string // publishWalsender, or publishWalsenderElsewhere
	args    []any  // the halves of the lock's key and of the candidate lock's
	app     string // the lock session's application_name, which a publication extends
}

// Parts of the check's statement. standbysWaiting counts the other sessions that hold the
// candidate lock keyed by $3 and $4: standbys ready to take over. publishWalsender appends
// walsenderTag and the walsender $5 to the session's application_name $6, cut to fit 63 bytes,
// when that walsender is of the session's role and client address and started after it
// (published), and says whether it is a walsender at all (exists).
const (
	standbysWaiting = `(SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid <> pg_backend_pid()
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND classid::bigint = $3 AND objid::bigint = $4)`
	publishWalsender = `, (SELECT set_config('application_name', left($6::text, 63 - length($7::text || w.pid::text)) || $7::text || w.pid::text, false)
				FROM pg_stat_activity w JOIN pg_stat_activity me ON me.pid = pg_backend_pid()
				WHERE w.pid = $5 AND w.backend_type = 'walsender' AND w.usesysid = me.usesysid
				  AND w.client_addr IS NOT DISTINCT FROM me.client_addr AND w.backend_start >= me.backend_start) IS NOT NULL,
				EXISTS (SELECT FROM pg_stat_activity WHERE pid = $5 AND backend_type = 'walsender')`
	// publishWalsenderElsewhere publishes the walsender $5 of a leader whose walsender runs on
	// another server than the lock (Config.WalsenderDSN), where this session cannot see it: the
	// PID is the leader's own replication connection's, and the next leader ends it only while it
	// streams the slot there.
	publishWalsenderElsewhere = `, set_config('application_name', left($6::text, 63 - length($7::text || $5::int::text)) || $7::text || $5::int::text, false) IS NOT NULL, true`
)

func newLockCheck(conn *pgx.Conn, slot string, walsenderElsewhere bool) lockCheck {
	hi, lo := keyHalves(Key(slot))
	chi, clo := keyHalves(candidateKey(slot))
	c := lockCheck{
		query:   `SELECT pg_backend_pid(), ` + heldByBackend(1, 2) + `, ` + standbysWaiting,
		publish: publishWalsender,
		args:    []any{hi, lo, chi, clo},
		app:     conn.Config().RuntimeParams["application_name"],
	}
	if walsenderElsewhere {
		c.publish = publishWalsenderElsewhere
	}
	return c
}

// checked is what one check found: the backend that ran it, whether pg_locks shows the lock
// granted to that backend, the standbys waiting, and with a publication its outcome.
type checked struct {
	pid, standbys     int32
	held              bool
	published, exists bool
}

// run sends one check, publishing pub's walsender with it when pub is set.
func (c lockCheck) run(ctx context.Context, conn *pgx.Conn, pub *publication) (checked, error) {
	var found checked
	if pub == nil {
		err := conn.QueryRow(ctx, c.query, c.args...).Scan(&found.pid, &found.held, &found.standbys)
		return found, err
	}
	args := append(slices.Clip(c.args), pub.pid, c.app, walsenderTag)
	err := conn.QueryRow(ctx, c.query+c.publish, args...).Scan(&found.pid, &found.held, &found.standbys, &found.published, &found.exists)
	return found, err
}

// Release ends the term: it stops the checks, cutting one in flight short, and closes the
// connection, which releases the lock.
func (t *Term) Release() {
	close(t.stop)
	t.cancel()
	<-t.done
	closeQuietly(t.conn)
}
