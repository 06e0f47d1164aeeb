package replication

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/metrics"
)

// horizon is the verified horizon: the WAL position up to which the outbox table is known to have
// been, continuously, the table the relay started with and a member of the publication. pgoutput
// sends nothing for a table that left the publication (ALTER PUBLICATION ... DROP TABLE, or DROP
// TABLE and a new table of the same name, which a FOR TABLE publication does not include), so the
// stream alone cannot see those rows: the slot must never be confirmed past a position that no
// check covered. sendStatus caps the confirmed position at Verified.
//
// Each check is one simple-protocol query, so that the server never waits for the relay while it
// holds the lock (a relay or network that freezes mid-check must not leave the table locked: a
// DDL statement queued behind that lock would block every writer). It runs BEGIN ISOLATION LEVEL
// READ COMMITTED, SET LOCAL lock_timeout = '200ms', then:
//
//  1. LOCK TABLE ONLY <outbox> IN ACCESS SHARE MODE. DROP TABLE (and RENAME) need ACCESS
//     EXCLUSIVE, so from here until the check commits the table cannot be dropped: a drop commits
//     after L below, and inserts into a recreated table commit after the drop.
//  2. L = pg_current_wal_lsn().
//  3. In a new statement (READ COMMITTED: a snapshot taken after L was read): the table's OID is
//     the one the relay started with, and the publication includes it by the rules preflight
//     applies (membership.go): listed, its schema published, or FOR ALL TABLES; publishing
//     INSERTs; no row filter, no column list. The publication's OID and the catalog rows through
//     which it includes the table must be those of the previous check, so that a removal and a
//     re-addition between two checks (ALTER PUBLICATION ... DROP TABLE then ADD TABLE, or DROP
//     and CREATE PUBLICATION) is caught although the table is a member again. So must the
//     version (xmin) of the publication's pg_publication row: publish switched off and on again
//     between two checks leaves everything else as it was (membership.altered).
//  4. COMMIT.
//
// The check connection also carries idle_in_transaction_session_timeout and TCP keepalives, a
// backstop should the server ever wait for it inside the transaction.
//
// ALTER PUBLICATION ... DROP TABLE does not conflict with that lock, and a commit becomes visible
// to new snapshots only some time after its commit record is written (it is written, flushed,
// possibly waited on by synchronous replication, and only then shown). So L of a check is trusted
// only once a check that started at least one interval (half a status interval) after L was read
// still finds the table in the publication: a removal whose commit record precedes L has become
// visible by then, unless making its commit visible took longer than that margin (a synchronous
// standby that stalls for that long). Checks run every half status interval, so confirmation
// trails what Kafka acknowledged by at most about one status interval.
//
// A check that keeps failing without a verdict (the table always locked by DDL, a query error)
// holds confirmation back; after staleLimit of such failures the relay stops with an error rather
// than let the slot retain WAL without a word. publication_check_age_seconds shows it. Failures
// without an answer from PostgreSQL (down, unreachable) do not count: the stream has the same
// problem and reports it.
type horizon struct {
	conf        func() (*pgx.ConnConfig, error) // pg_dsn and the password as they are now
	table       string                          // qualified, sanitized
	schema      string
	name        string
	publication string
	// standby: pg_dsn leads to a hot standby (primary_dsn set). The check runs there as on a
	// primary, with the replay position for L: a catalog change replayed before it is visible to
	// the check's snapshot, and the replayed locks of DDL conflict with its lock as on the primary.
	standby    bool
	every      atomic.Int64  // time.Duration between checks: half the session's status interval, also the safety margin
	staleLimit time.Duration // the longest time without a good check before the relay stops
	log        *zap.Logger
	m          *metrics.Metrics // may be nil

	verified atomic.Uint64 // pglogrepl.LSN
	oid      atomic.Uint32 // the outbox table's OID when the relay started; 0 before the first session
	failed   atomic.Pointer[error]
	changed  chan struct{} // receives (without blocking) when verified moves
	// mu orders a reset against a check's promotion: epoch counts resets, and a check promotes only
	// if no reset happened since it began.
	mu    sync.Mutex
	epoch uint64
	// cluster is the system identifier of the server the stream identified; a check connection
	// that reaches another cluster (a multi-host pg_dsn or a DNS move) would judge another table.
	cluster atomic.Pointer[string]
	// stoppingAt is when the last check refused with 57P03 (the server shutting down) began, in
	// Unix nanoseconds; 0 if none (see shutdown.go).
	stoppingAt atomic.Int64

	checkedEpoch uint64        // the epoch the check connection and pending belong to
	connCluster  string        // the cluster the check connection was compared with; "" if not compared
	pending      pglogrepl.LSN // L of the last successful check, trusted once a later check succeeds
	pendingAt    time.Time     // when that check returned: L was read before
	// member is what the last good check read (pubOID nil before the first), memberAt when that
	// check started, first what the first good check of this stream read; carried what the
	// process's previous term last read, for the first check to compare with (carry). Under mu:
	// carry runs on the stream's goroutine.
	member   membership
	memberAt time.Time
	first    membership
	carried  *carriedMembership
	// mem keeps each good check's membership for the process's next term on slot.
	mem       *Memory
	slot      string
	lastGood  time.Time // when a check last succeeded (or the checks began)
	badSince  time.Time // since when checks have failed with an answer from PostgreSQL; zero if not
	lockSkips int       // consecutive checks skipped because DDL held the table
	// noLock: the role may not lock the table (LOCK needs SELECT on it); checks then rely on the
	// margin for a drop too.
	noLock bool
	// off: there is no outbox table (logical decoding messages only). pgoutput sends every message
	// whatever the publication holds, so there is nothing a check could find missing: Verified
	// caps nothing and no check runs.
	off bool
}

// staleLimit is how long the publication checks may fail without a verdict (see horizon) before
// the relay stops: long enough for DDL and a database restart, short enough that WAL retention
// and the confirmed position do not lag unnoticed.
const staleLimit = 5 * time.Minute

// checkIdleTimeout ends the check session when it sits inside a transaction that long (the check
// is one query, so only a server waiting on a frozen client could).
const checkIdleTimeout = 2 * time.Second

func newHorizon(cfg *Config, log *zap.Logger) *horizon {
	h := &horizon{
		conf: cfg.ConnConfig, table: cfg.qualifiedTable(), schema: cfg.Schema, name: cfg.Table, publication: cfg.Publication,
		staleLimit: staleLimit, log: log, changed: make(chan struct{}, 1), off: cfg.NoTable, standby: cfg.PrimaryDSN != "",
	}
	h.setStatusInterval(cfg.StatusInterval)
	return h
}

// walEndSQL is the server's end of WAL: pg_current_wal_lsn() on a primary, the replay position
// on a hot standby, where pg_current_wal_lsn() fails ("recovery is in progress").
const walEndSQL = "CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END"

// setStatusInterval sets the checks' pace from the session's status interval (capped by the
// server's timeouts): a check every half interval keeps confirmation within about one interval.
func (h *horizon) setStatusInterval(d time.Duration) {
	h.every.Store(int64(max(d/2, 10*time.Millisecond)))
}

// interval is the time between checks, and the safety margin.
func (h *horizon) interval() time.Duration { return time.Duration(h.every.Load()) }

// Verified is the highest position the slot may be confirmed to.
func (h *horizon) Verified() pglogrepl.LSN {
	if h.off {
		return pglogrepl.LSN(math.MaxUint64)
	}
	return pglogrepl.LSN(h.verified.Load())
}

// Err is the fatal error a check found, if any.
func (h *horizon) Err() error {
	if p := h.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func (h *horizon) fail(err error) {
	h.failed.CompareAndSwap(nil, &err)
}

// expectCluster tells the checks which database cluster the stream is on.
func (h *horizon) expectCluster(systemID string) { h.cluster.Store(&systemID) }

// server says which server the stream is on, for other connections that must follow it: the
// number of resets (timeline changes) so far, and the cluster's system identifier ("" before the
// stream identified it).
func (h *horizon) server() (epoch uint64, cluster string) {
	h.mu.Lock()
	epoch = h.epoch
	h.mu.Unlock()
	if c := h.cluster.Load(); c != nil {
		cluster = *c
	}
	return epoch, cluster
}

// reset forgets the positions checked so far: on another timeline (a promoted standby) they are
// not positions of this server's history. The next checks start over.
func (h *horizon) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.epoch++
	h.verified.Store(0)
}

// start records the outbox's OID for a new session: the first one sets it, later ones must find
// the same table, or it was dropped and recreated while the relay was reconnecting.
func (h *horizon) start(oid uint32) error {
	if h.oid.CompareAndSwap(0, oid) || h.oid.Load() == oid {
		return nil
	}
	err := h.recreatedError(h.oid.Load(), oid)
	h.fail(err)
	return err
}

// run checks every interval until ctx ends or a check finds the outbox gone from the stream.
func (h *horizon) run(ctx context.Context) {
	if h.off {
		return
	}
	var conn *pgconn.PgConn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	// A timer rather than a ticker: a ticker delivers a tick missed during a slow check at once.
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		}
		if h.oid.Load() != 0 {
			if h.lastGood.IsZero() {
				h.lastGood = time.Now()
			}
			began := time.Now()
			err := h.check(ctx, &conn)
			h.count(err, began)
			if !h.carryOn(ctx, err, &conn) {
				return
			}
		}
		timer.Reset(h.interval())
	}
}

// count notes a check's outcome: when the last good one was (publication_check_age_seconds), and
// since when checks have failed with an answer from PostgreSQL (what staleLimit bounds).
func (h *horizon) count(err error, began time.Time) {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		h.lastGood, h.lockSkips, h.badSince = time.Now(), 0, time.Time{}
	case isCannotConnectNow(err):
		// Shutting down (or not up yet): the stream leaves the server so that it can stop
		// (shutdown.go), and the checks wait for it as for a server that is down.
		h.noteStopping(began)
		h.badSince = time.Time{}
	case !errors.As(err, &pgErr):
		// PostgreSQL did not answer (down, restarting, unreachable): the stream sees that
		// too and reports it; only failures the server answered count toward staleLimit.
		h.badSince = time.Time{}
	case h.badSince.IsZero():
		h.badSince = time.Now()
	}
	if h.m != nil {
		h.m.PublicationCheckAge.Set(time.Since(h.lastGood).Seconds())
	}
}

// carryOn says what a check's error means for the checks: false when they end (a fatal finding,
// which Err reports from then on, or ctx's end); otherwise it says so at the level the error
// deserves, and drops a connection that may be the cause.
func (h *horizon) carryOn(ctx context.Context, err error, conn **pgconn.PgConn) bool {
	switch {
	case err == nil:
	case IsFatal(err):
		h.fail(err)
		h.log.Error("publication check failed; the relay stops", zap.Error(err))
		return false
	case ctx.Err() != nil:
		return false
	case !h.badSince.IsZero() && time.Since(h.badSince) > h.staleLimit:
		err = fatalf("no publication check of outbox table %s succeeded for %s, PostgreSQL refusing each (last error: %w), so the slot could not be confirmed meanwhile: fix the cause and restart",
			h.table, time.Since(h.lastGood).Round(time.Second), err)
		h.fail(err)
		h.log.Error("publication check failed; the relay stops", zap.Error(err))
		return false
	case isLockTimeout(err):
		// DDL on the table (ATTACH/DETACH PARTITION, ALTER TABLE) holds or awaits a
		// conflicting lock: skip this round rather than queue behind it.
		h.lockSkips++
		level := zap.DebugLevel
		if h.lockSkips%10 == 0 {
			level = zap.WarnLevel
		}
		h.log.Check(level, "the outbox table is locked by DDL; publication check skipped this round").Write(
			zap.Int("rounds_skipped", h.lockSkips), zap.Error(err))
	case isCannotConnectNow(err):
		h.log.Info("PostgreSQL refuses connections (shutting down or starting up): the publication checks wait for it, the slot is not confirmed further meanwhile, and a streaming session leaves the server so that it can stop", zap.Error(err))
	default:
		// Not fatal: the horizon stays where it is this time, and confirmation waits.
		h.log.Warn("cannot check the outbox table's publication; the slot is not confirmed further until a check succeeds", zap.Error(err))
		if *conn != nil {
			(*conn).Close(context.WithoutCancel(ctx))
			*conn = nil
		}
	}
	return true
}

// connect opens the check connection: a session that ends itself when it idles inside a
// transaction, and TCP keepalives both ways, so that a lost peer never keeps the lock.
func (h *horizon) connect(ctx context.Context) (*pgconn.PgConn, error) {
	conf, err := h.conf()
	if err != nil {
		return nil, Fatal(err)
	}
	cfg := &conf.Config
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "outbox-relay publication check"
	}
	dialer := &net.Dialer{KeepAlive: 5 * time.Second, Timeout: 10 * time.Second}
	cfg.DialFunc = dialer.DialContext
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, classifyConnect(err, "the publication check")
	}
	// Session settings rather than startup parameters, which a connection pooler may refuse.
	_, err = c.Exec(ctx, "SET idle_in_transaction_session_timeout = "+strconv.FormatInt(checkIdleTimeout.Milliseconds(), 10)+
		"; SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = 3").ReadAll()
	if err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("set the publication check's session timeouts: %w", err)
	}
	if err := h.sameCluster(ctx, c); err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	// A standby answers the check with "recovery is in progress", which would count toward
	// staleLimit as a refusal; it is a server to wait for, as the stream does.
	if err := refuseStandby(ctx, c, "publication check", h.standby); err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

// sameCluster refuses a check connection to another database cluster than the stream's: its
// table would have another OID, and the error would blame a recreated table. A role that may not
// read pg_control_system is not refused: the stream's own comparison still runs every session.
func (h *horizon) sameCluster(ctx context.Context, c *pgconn.PgConn) error {
	want := h.cluster.Load()
	h.connCluster = ""
	if want == nil {
		return nil
	}
	// Compared as far as the role allows: a refused read is not asked again on this connection.
	h.connCluster = *want
	return sameClusterAs(ctx, c, *want, "the publication check")
}

// check runs one check (see horizon) and moves the horizon.
func (h *horizon) check(ctx context.Context, conn **pgconn.PgConn) error {
	// A check must finish well within the interval, or confirmation falls behind.
	ctx, cancel := context.WithTimeout(ctx, max(h.interval(), 5*time.Second))
	defer cancel()
	h.mu.Lock()
	epoch := h.epoch
	h.mu.Unlock()
	if err := h.checkConn(ctx, conn, epoch); err != nil {
		return err
	}
	started := time.Now()
	lsn, m, err := h.query(ctx, conn)
	if errors.Is(err, errCheckWithoutLock) {
		return h.check(ctx, conn)
	}
	if err != nil {
		return err
	}
	if err := h.judge(m); err != nil {
		return err
	}
	return h.advance(epoch, started, lsn, m)
}

// checkConn opens the check connection, or opens it again when the server it reached may not be
// the stream's any more: after a reset (a promoted standby), or when the stream identified its
// cluster after the connection was compared.
func (h *horizon) checkConn(ctx context.Context, conn **pgconn.PgConn, epoch uint64) error {
	renew := false
	if epoch != h.checkedEpoch {
		// Another server (a promoted standby): what was checked before is no position of its
		// history, and the connection may still reach the old one.
		h.checkedEpoch = epoch
		h.pending, h.pendingAt = 0, time.Time{}
		renew = true
	}
	if want := h.cluster.Load(); want != nil && *want != h.connCluster {
		renew = true // connected before the stream identified its server: compare it now
	}
	if renew && *conn != nil {
		(*conn).Close(context.WithoutCancel(ctx))
		*conn = nil
	}
	if *conn == nil {
		c, err := h.connect(ctx)
		if err != nil {
			return err
		}
		*conn = c
	}
	return nil
}

// errCheckWithoutLock asks check to run again: the role may not lock the outbox table, and the
// check now goes without the lock (noLock).
var errCheckWithoutLock = errors.New("the publication check runs again without locking the outbox table")

// query runs the check's one simple-protocol query (see horizon) and returns L and the
// publication's membership as the check's snapshot read them.
func (h *horizon) query(ctx context.Context, conn **pgconn.PgConn) (pglogrepl.LSN, membership, error) {
	lock := ""
	if !h.noLock {
		lock = "LOCK TABLE ONLY " + h.table + " IN ACCESS SHARE MODE;\n"
	}
	major := serverMajor((*conn).ParameterStatus("server_version"))
	catalog := strings.NewReplacer("$1", quoteLiteral(h.table), "$2", quoteLiteral(h.publication)).Replace(membershipSQL(major))
	// A short lock timeout: a DDL statement waiting for the table must not queue the check, and
	// the check must not hold back the DDL; a skipped round only delays confirmation.
	sql := "BEGIN ISOLATION LEVEL READ COMMITTED;\nSET LOCAL lock_timeout = '200ms';\n" + lock +
		"SELECT " + walEndSQL + "::text;\n" + catalog + ";\nCOMMIT"
	results, err := (*conn).Exec(ctx, sql).ReadAll()
	if err == nil && (*conn).TxStatus() != 'I' {
		err = fmt.Errorf("the check transaction did not end (status %c)", (*conn).TxStatus())
	}
	if err != nil && !(*conn).IsClosed() && (*conn).TxStatus() != 'I' {
		// The statements after the failing one were skipped, COMMIT too: the transaction is
		// aborted (holding no locks) until it is rolled back.
		if _, rbErr := (*conn).Exec(ctx, "ROLLBACK").ReadAll(); rbErr != nil {
			(*conn).Close(context.WithoutCancel(ctx))
		}
	}
	if (*conn).IsClosed() {
		*conn = nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" && !h.noLock { // insufficient_privilege
		h.noLock = true
		h.log.Warn("the relay's role may not lock the outbox table, so the publication check relies on its time margin for a dropped table too: GRANT SELECT ON it to the relay's role",
			zap.String("table", h.table), zap.Error(err))
		return 0, membership{}, errCheckWithoutLock
	}
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // undefined_table, invalid_schema_name
		return 0, membership{}, h.goneError()
	}
	if err != nil {
		return 0, membership{}, fmt.Errorf("check outbox table %s in publication %q: %w", h.table, h.publication, err)
	}
	// BEGIN, SET, [LOCK,] SELECT lsn, SELECT membership, COMMIT.
	if len(results) < 4 || len(results[len(results)-3].Rows) != 1 || len(results[len(results)-2].Rows) != 1 {
		return 0, membership{}, fmt.Errorf("check outbox table %s in publication %q: unexpected answer (%d results)", h.table, h.publication, len(results))
	}
	lsnRow := results[len(results)-3].Rows[0]
	if len(lsnRow) != 1 {
		return 0, membership{}, fmt.Errorf("check outbox table %s in publication %q: unexpected answer", h.table, h.publication)
	}
	lsn, err := pglogrepl.ParseLSN(string(lsnRow[0]))
	if err != nil {
		return 0, membership{}, err
	}
	m, err := parseMembership(results[len(results)-2].Rows[0])
	return lsn, m, err
}

// judge refuses a check's membership when the outbox table is gone or another one, or the
// publication does not include it as the relay needs.
func (h *horizon) judge(m membership) error {
	if m.oid == nil {
		// No table of that name (without the lock, a drop is seen here rather than by LOCK).
		return h.goneError()
	}
	if known := h.oid.Load(); *m.oid != known {
		return h.recreatedError(known, *m.oid)
	}
	if err := m.problem(h.table, h.publication); err != nil {
		return fatalf("publication check: %w; outbox rows written while the publication was so are not in the replication stream: republish them (backfill_since), then restart", err)
	}
	return nil
}

// advance compares a good check's membership m with the previous check's (or the previous term's,
// carry), keeps it, and moves the horizon: the pending L of the previous check becomes verified
// once this check, which started at started, began at least an interval after it was read; lsn,
// this check's L, becomes pending.
func (h *horizon) advance(epoch uint64, started time.Time, lsn pglogrepl.LSN, m membership) error {
	h.mu.Lock()
	prev, prevAt := h.member, h.memberAt
	if prev.pubOID == nil && h.carried != nil {
		// The first check of this stream: compare with the last check of the process's previous
		// term on the slot (carry).
		prev, prevAt = h.carried.member, h.carried.at
	}
	h.carried = nil
	h.mu.Unlock()
	if err := h.compare(prev, prevAt, m); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.member, h.memberAt = m, started
	if h.first.pubOID == nil {
		h.first = m
	}
	if c := h.cluster.Load(); c != nil {
		h.mem.notePublication(h.slot, *c, m, started)
	}
	if h.epoch != epoch {
		return nil // a reset landed during this check: its position and the pending one predate it
	}
	switch {
	case h.pending > 0 && started.Sub(h.pendingAt) < h.interval():
		// Too soon after the check that read pending to trust it (a late round): keep it for the
		// next check.
		return nil
	case h.pending > h.Verified():
		h.verified.Store(uint64(h.pending))
		select {
		case h.changed <- struct{}{}:
		default:
		}
	}
	h.pending, h.pendingAt = lsn, time.Now()
	return nil
}

// compare refuses m, a check's membership, when the publication changed since prev, read by the
// check that started at prevAt (nothing to compare when prev is zero).
func (h *horizon) compare(prev membership, prevAt time.Time, m membership) error {
	if prev.pubOID == nil {
		return nil
	}
	if !m.continuous(prev) {
		pub := pgx.Identifier{h.publication}.Sanitize()
		return fatalf("outbox table %s left publication %q and was added again since the previous check (publication OID %d, now %d; membership %v, now %v): rows written in between are not in the replication stream. Republish them (backfill_since), and restart; to change the publication while the relay runs, use ALTER PUBLICATION %s ADD (not DROP and ADD)",
			h.table, h.publication, *prev.pubOID, *m.pubOID, prev.tokens, m.tokens, pub)
	}
	if m.altered(prev) {
		return h.alteredError(prev, prevAt, m)
	}
	return nil
}

// carry hands the horizon what the last check of this process's previous term on the slot read
// (prev, by a check that started at at), when nobody else can have streamed the slot since: a
// publication altered between that check and this term's first one is then seen as between two
// checks of one term. A new term's stream may have checked already: its first read is compared
// with prev at once.
func (h *horizon) carry(prev membership, at time.Time) error {
	h.mu.Lock()
	if h.first.pubOID == nil {
		h.carried = &carriedMembership{member: prev, at: at}
		h.mu.Unlock()
		return nil
	}
	first := h.first
	h.mu.Unlock()
	if err := h.compare(prev, at, first); err != nil {
		h.fail(err)
		return err
	}
	return nil
}

// carriedMembership is a previous term's last membership, for a new term's first check.
type carriedMembership struct {
	member membership
	at     time.Time
}

// alteredError is the publication's row changed between two checks (membership.altered), prev
// being the older read (by the check that started at prevAt) and m the newer. The slot stays at or before the previous check's verified position; rows that
// PostgreSQL left out meanwhile are not in the WAL stream at all, so only the table has them. The
// ALTER committed after the previous check's snapshot, or at most an interval before it (a commit
// becomes visible a moment after its WAL record: see horizon), so rows created from an interval
// before that check on cover it, but for transactions that ran longer (created_at is a row's
// transaction start).
func (h *horizon) alteredError(prev membership, prevAt time.Time, m membership) error {
	since := prevAt.Add(-h.interval()).UTC().Truncate(time.Second).Format(time.RFC3339)
	return fatalf("publication %q was altered since the previous check (its pg_publication row changed: xmin %s, now %s; an ALTER PUBLICATION ... SET, OWNER TO or RENAME): if its publish option left out INSERTs for a while, PostgreSQL left the rows inserted into %s meanwhile out of the replication stream, and streaming the slot again skips them again, since it decodes every row with the publication as it was then. The relay stopped without confirming the slot past the previous check. Republish the rows written since: outbox-relay replay --since %s (earlier by your longest transaction; events already published arrive again with the same id), then restart. Change a publication's options only while the relay is stopped and no outbox rows are written, and keep 'insert' in publish",
		h.publication, prev.pubXmin, m.pubXmin, h.table, since)
}

func (h *horizon) goneError() error {
	return fatalf("outbox table %s no longer exists (dropped or renamed, or its schema was, while the relay was streaming): rows written to a new table of that name are not in publication %q, so the relay stopped before confirming past the change. Recreate or rename the table back, ALTER PUBLICATION %s ADD TABLE %s, republish the rows written meanwhile (backfill_since), and restart",
		h.table, h.publication, pgx.Identifier{h.publication}.Sanitize(), h.table)
}

func (h *horizon) recreatedError(known, now uint32) error {
	return fatalf("outbox table %s was dropped and recreated while the relay was streaming (OID %d, now %d): the new table is not in publication %q unless added again, and rows written to it before that are not in the replication stream; the relay stopped before confirming past the change. Run ALTER PUBLICATION %s ADD TABLE %s if needed, republish the rows written to the new table so far (backfill_since), and restart",
		h.table, known, now, h.publication, pgx.Identifier{h.publication}.Sanitize(), h.table)
}

// waitFor waits until the horizon reaches lsn, a check fails, or ctx ends.
func (h *horizon) waitFor(ctx context.Context, lsn pglogrepl.LSN) {
	for h.Verified() < lsn && h.Err() == nil {
		select {
		case <-h.changed:
		case <-ctx.Done():
			return
		}
	}
}

// isLockTimeout reports whether err is PostgreSQL's lock_not_available (lock_timeout expired).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
