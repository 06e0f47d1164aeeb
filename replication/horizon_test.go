package replication

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/netproxy"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

const outboxColumns = "(id int, aggregate_type text, aggregate_id text, event_type text, payload jsonb)"

// horizonDB returns a fresh database on the shared cluster and an admin connection to it.
func horizonDB(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	return horizonDBOn(t, testenv.SharedPostgres(t))
}

// horizonDBOn is horizonDB on pg.
func horizonDBOn(t *testing.T, pg *devenv.Postgres) (string, *pgx.Conn) {
	t.Helper()
	dsn := testenv.OutboxDatabase(t, pg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	return dsn, admin
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// startedHorizon returns a horizon for schema.table and publication, started with the table's OID
// as a session would, with a check connection closed at the test's end.
func startedHorizon(t *testing.T, dsn string, admin *pgx.Conn, schema, table, publication string, interval time.Duration) (*horizon, *checkConn) {
	t.Helper()
	cfg := &Config{DSN: dsn, Schema: schema, Table: table, Publication: publication, StatusInterval: 2 * interval}
	h := newHorizon(cfg, zaptest.NewLogger(t))
	var oid uint32
	if err := admin.QueryRow(context.Background(), "SELECT to_regclass($1)::oid", cfg.qualifiedTable()).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	if err := h.start(oid); err != nil {
		t.Fatal(err)
	}
	c := &checkConn{}
	t.Cleanup(func() {
		if c.conn != nil {
			c.conn.Close(context.Background())
		}
	})
	return h, c
}

// anIntervalPasses makes the position h's last check read as old as the safety margin, as if the
// next check started an interval later: the margin is what a test of it is about, and moving the
// read time back says so without waiting for the clock.
func anIntervalPasses(h *horizon) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pendingAt = h.pendingAt.Add(-h.interval())
}

// checkConn is the connection a horizon's checks reuse.
type checkConn struct{ conn *pgconn.PgConn }

func (c *checkConn) check(ctx context.Context, h *horizon) error { return h.check(ctx, &c.conn) }

// A relay or network that freezes in the middle of a check must not leave the outbox table locked:
// a DDL statement queued behind the lock would block every writer until TCP gave up (hours).
func TestHorizonFrozenCheckDoesNotBlockWriters(t *testing.T) {
	dsn, admin := horizonDB(t)
	mustExec(t, admin, `CREATE TABLE frozen_outbox `+outboxColumns+`;
		CREATE PUBLICATION frozen_pub FOR TABLE frozen_outbox WITH (publish = 'insert')`)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	px := netproxy.New(t, u.Host)
	u.Host = px.Addr
	q := u.Query()
	q.Set("application_name", "frozen_check")
	u.RawQuery = q.Encode()
	h, c := startedHorizon(t, u.String(), admin, "public", "frozen_outbox", "frozen_pub", 500*time.Millisecond)
	t.Cleanup(func() {
		admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'frozen_check'")
	})
	ctx := context.Background()
	if err := c.check(ctx, h); err != nil { // connect, and see that a check passes
		t.Fatal(err)
	}
	var oid uint32
	if err := admin.QueryRow(ctx, "SELECT 'frozen_outbox'::regclass::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}

	// Slow answers make a check that waits on the relay while it holds the lock hold it long
	// enough to be seen; freeze the connection once it is (or after a while).
	px.DelayResponses(300 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- c.check(ctx, h) }()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE a.application_name = 'frozen_check' AND l.relation = $1 AND l.granted`, oid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
	}
	px.Freeze()
	select {
	case err := <-done:
		t.Logf("check on a frozen connection: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("a check on a frozen connection did not give up within a minute")
	}

	// A DDL statement that needs ACCESS EXCLUSIVE, then a writer behind it.
	ddl, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer ddl.Close(context.Background())
	ddlDone := make(chan error, 1)
	go func() {
		_, err := ddl.Exec(ctx, "ALTER TABLE frozen_outbox ADD COLUMN extra int")
		ddlDone <- err
	}()
	w, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := w.Exec(wctx, "INSERT INTO frozen_outbox VALUES (1, 'a', 'b', 'c', '{}')"); err != nil {
		var state string
		admin.QueryRow(ctx, "SELECT coalesce(string_agg(state, ','), '') FROM pg_stat_activity WHERE application_name = 'frozen_check'").Scan(&state)
		t.Fatalf("a writer was blocked for %s behind DDL queued behind the frozen check (its session: %q): %v", time.Since(start).Round(time.Millisecond), state, err)
	}
	if err := <-ddlDone; err != nil {
		t.Fatal(err)
	}
}

// Preflight and the check apply the same rules to a publication: one the relay starts with is one
// the check accepts, and one that would lose rows (a row filter, a column list, only the
// partitions listed) is refused by both, with the fix.
func TestPublicationShapes(t *testing.T) { publicationShapes(t, testenv.SharedPostgres(t)) }

// PostgreSQL 14 has no schema publications, row filters or column lists: the membership query
// has a branch without them (membershipSQL), and it must judge the shapes 14 has as 15+ does.
func TestPublicationMembershipOnPostgres14(t *testing.T) {
	pg := testenv.SharedPostgresVersion(t, "14")
	t.Run("shapes", func(t *testing.T) { publicationShapes(t, pg) })
	t.Run("interruptions", func(t *testing.T) { membershipInterrupted(t, pg) })
}

// serverMajorOf returns the major version of the server admin is connected to.
func serverMajorOf(t *testing.T, admin *pgx.Conn) int {
	t.Helper()
	var major int
	if err := admin.QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int / 10000").Scan(&major); err != nil {
		t.Fatal(err)
	}
	return major
}

// publicationShapes runs the shapes that pg's version can create (schema publications, row
// filters and column lists from 15 on).
func publicationShapes(t *testing.T, pg *devenv.Postgres) {
	dsn, admin := horizonDBOn(t, pg)
	major := serverMajorOf(t, admin)
	tests := []struct {
		name   string
		setup  string // in schema %[1]s, outbox table %[1]s.outbox, publication %[1]s_pub
		refuse string // "" when accepted
		since  int    // the major version that has the shape; 0: all
	}{
		{"listed", `CREATE PUBLICATION %[1]s_pub FOR TABLE %[1]s.outbox WITH (publish = 'insert')`, "", 0},
		{"schema", `CREATE PUBLICATION %[1]s_pub FOR TABLES IN SCHEMA %[1]s WITH (publish = 'insert', publish_via_partition_root = true)`, "", 15},
		{"all tables", `CREATE PUBLICATION %[1]s_pub FOR ALL TABLES WITH (publish = 'insert')`, "", 0},
		{"partitioned and listed", `DROP TABLE %[1]s.outbox; CREATE TABLE %[1]s.outbox ` + outboxColumns + ` PARTITION BY HASH (id);
			CREATE TABLE %[1]s.outbox_0 PARTITION OF %[1]s.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0);
			CREATE PUBLICATION %[1]s_pub FOR TABLE %[1]s.outbox WITH (publish = 'insert', publish_via_partition_root = true)`, "", 0},
		{"partitioned, schema published", `DROP TABLE %[1]s.outbox; CREATE TABLE %[1]s.outbox ` + outboxColumns + ` PARTITION BY HASH (id);
			CREATE TABLE %[1]s.outbox_0 PARTITION OF %[1]s.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0);
			CREATE PUBLICATION %[1]s_pub FOR TABLES IN SCHEMA %[1]s WITH (publish = 'insert', publish_via_partition_root = true)`, "", 15},
		{"row filter", `CREATE PUBLICATION %[1]s_pub FOR TABLE %[1]s.outbox WHERE (aggregate_type <> 'order') WITH (publish = 'insert')`, "row filter", 15},
		{"column list", `CREATE PUBLICATION %[1]s_pub FOR TABLE %[1]s.outbox (id, aggregate_type, aggregate_id, event_type) WITH (publish = 'insert')`, "column list", 15},
		{"row filter on a partition", `DROP TABLE %[1]s.outbox; CREATE TABLE %[1]s.outbox ` + outboxColumns + ` PARTITION BY HASH (id);
			CREATE TABLE %[1]s.outbox_0 PARTITION OF %[1]s.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0);
			CREATE PUBLICATION %[1]s_pub FOR TABLE %[1]s.outbox, %[1]s.outbox_0 WHERE (id > 5) WITH (publish = 'insert', publish_via_partition_root = false)`, "row filter", 15},
		{"only partitions listed", `DROP TABLE %[1]s.outbox; CREATE TABLE %[1]s.outbox ` + outboxColumns + ` PARTITION BY HASH (id);
			CREATE TABLE %[1]s.outbox_0 PARTITION OF %[1]s.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0);
			CREATE TABLE %[1]s.outbox_1 PARTITION OF %[1]s.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1);
			CREATE PUBLICATION %[1]s_pub FOR TABLE %[1]s.outbox_0, %[1]s.outbox_1 WITH (publish = 'insert', publish_via_partition_root = true)`, `ADD TABLE "%[1]s"."outbox"`, 0},
		{"another table", `CREATE TABLE %[1]s.other (id int); CREATE PUBLICATION %[1]s_pub FOR TABLE %[1]s.other WITH (publish = 'insert')`, `ADD TABLE "%[1]s"."outbox"`, 0},
		{"no inserts", `CREATE PUBLICATION %[1]s_pub FOR TABLE %[1]s.outbox WITH (publish = 'update')`, "publish = 'insert'", 0},
	}
	for i, tt := range tests {
		if major < tt.since {
			continue // the shape cannot be made on this version
		}
		t.Run(tt.name, func(t *testing.T) {
			schema := fmt.Sprintf("shape%d", i)
			dsn, admin := dsn, admin
			if tt.name == "all tables" {
				// FOR ALL TABLES includes every other case's tables too; it has its own database.
				dsn, admin = horizonDBOn(t, pg)
			}
			mustExec(t, admin, fmt.Sprintf(`CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.outbox `+outboxColumns, schema))
			mustExec(t, admin, fmt.Sprintf(tt.setup, schema))
			want := strings.ReplaceAll(tt.refuse, "%[1]s", schema)
			judge := func(what string, err error) {
				t.Helper()
				switch {
				case want == "" && err != nil:
					t.Errorf("%s refuses a publication that streams every outbox row: %v", what, err)
				case want != "" && err == nil:
					t.Errorf("%s accepts a publication that loses rows (want an error naming %q)", what, want)
				case want != "" && !IsFatal(err):
					t.Errorf("%s: want a fatal error, got %v", what, err)
				case want != "" && !strings.Contains(err.Error(), want):
					t.Errorf("%s: error does not name %q: %v", what, want, err)
				}
			}
			judge("preflight", EnsurePublication(context.Background(), admin, schema+"_pub", schema, "outbox", false))
			h, c := startedHorizon(t, dsn, admin, schema, "outbox", schema+"_pub", 50*time.Millisecond)
			for range 2 {
				err := c.check(context.Background(), h)
				judge("the publication check", err)
				if err != nil {
					break
				}
				anIntervalPasses(h)
			}
		})
	}
}

// A table removed from the publication and added again (or a publication dropped and created
// again) between two checks is a member at both, but the rows written in between were never
// streamed: the check must notice.
func TestHorizonMembershipInterrupted(t *testing.T) {
	membershipInterrupted(t, testenv.SharedPostgres(t))
}

// membershipInterrupted runs the interruptions pg's version can make (schema publications from
// 15 on).
func membershipInterrupted(t *testing.T, pg *devenv.Postgres) {
	_, probe := horizonDBOn(t, pg)
	major := serverMajorOf(t, probe)
	tests := []struct {
		name, change string
		since        int
	}{
		{"drop and add the table", `ALTER PUBLICATION gap_pub DROP TABLE gap_outbox;
			INSERT INTO gap_outbox VALUES (2, 'a', 'a', 'x', '{}');
			ALTER PUBLICATION gap_pub ADD TABLE gap_outbox`, 0},
		{"drop and create the publication", `DROP PUBLICATION gap_pub;
			INSERT INTO gap_outbox VALUES (2, 'a', 'a', 'x', '{}');
			CREATE PUBLICATION gap_pub FOR TABLE gap_outbox WITH (publish = 'insert')`, 0},
		{"from the table to its schema", `ALTER PUBLICATION gap_pub DROP TABLE gap_outbox;
			INSERT INTO gap_outbox VALUES (2, 'a', 'a', 'x', '{}');
			ALTER PUBLICATION gap_pub ADD TABLES IN SCHEMA public`, 15},
	}
	for _, tt := range tests {
		if major < tt.since {
			continue // cannot happen on this version
		}
		t.Run(tt.name, func(t *testing.T) {
			dsn, admin := horizonDBOn(t, pg)
			mustExec(t, admin, `CREATE TABLE gap_outbox `+outboxColumns+`;
				CREATE PUBLICATION gap_pub FOR TABLE gap_outbox WITH (publish = 'insert')`)
			h, c := startedHorizon(t, dsn, admin, "public", "gap_outbox", "gap_pub", 50*time.Millisecond)
			if err := c.check(context.Background(), h); err != nil {
				t.Fatal(err)
			}
			mustExec(t, admin, tt.change)
			err := c.check(context.Background(), h)
			if !IsFatal(err) || !strings.Contains(err.Error(), "added again") {
				t.Fatalf("after the table left the publication and came back between two checks, want a fatal error, got %v (verified %s)", err, h.Verified())
			}
		})
	}
	if major < 15 {
		return
	}
	t.Run("adding a schema while listed is no interruption", func(t *testing.T) {
		dsn, admin := horizonDBOn(t, pg)
		mustExec(t, admin, `CREATE TABLE gap_outbox `+outboxColumns+`;
			CREATE PUBLICATION gap_pub FOR TABLE gap_outbox WITH (publish = 'insert')`)
		h, c := startedHorizon(t, dsn, admin, "public", "gap_outbox", "gap_pub", 50*time.Millisecond)
		for _, change := range []string{"ALTER PUBLICATION gap_pub ADD TABLES IN SCHEMA public", "ALTER PUBLICATION gap_pub DROP TABLE gap_outbox", ""} {
			if err := c.check(context.Background(), h); err != nil {
				t.Fatal(err)
			}
			if change != "" {
				mustExec(t, admin, change)
			}
		}
	})
}

// A table that is gone (its schema renamed, or dropped while the check cannot lock it) is a fatal
// error with the fix, not a transient one retried forever.
func TestHorizonTableGone(t *testing.T) {
	tests := []struct {
		name   string
		noLock bool
		change string
	}{
		{"schema renamed", false, "ALTER SCHEMA gone RENAME TO gone_elsewhere"},
		{"schema dropped", false, "DROP SCHEMA gone CASCADE"},
		{"table dropped, no lock", true, "DROP TABLE gone.outbox"},
		{"schema renamed, no lock", true, "ALTER SCHEMA gone RENAME TO gone_elsewhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dsn, admin := horizonDB(t)
			mustExec(t, admin, `CREATE SCHEMA gone; CREATE TABLE gone.outbox `+outboxColumns+`;
				CREATE PUBLICATION gone_pub FOR TABLE gone.outbox WITH (publish = 'insert')`)
			h, c := startedHorizon(t, dsn, admin, "gone", "outbox", "gone_pub", 50*time.Millisecond)
			h.noLock = tt.noLock
			if err := c.check(context.Background(), h); err != nil {
				t.Fatal(err)
			}
			mustExec(t, admin, tt.change)
			err := c.check(context.Background(), h)
			if !IsFatal(err) || !strings.Contains(err.Error(), "no longer exists") {
				t.Fatalf("want a fatal error saying the table no longer exists, got %v", err)
			}
		})
	}
}

// A position is trusted only once a check that started at least an interval after it was read
// still finds the table in the publication: a late round (a ticker delivers a missed tick at once)
// must not promote it microseconds later.
func TestHorizonMargin(t *testing.T) {
	dsn, admin := horizonDB(t)
	mustExec(t, admin, `CREATE TABLE margin_outbox `+outboxColumns+`;
		CREATE PUBLICATION margin_pub FOR TABLE margin_outbox WITH (publish = 'insert')`)
	h, c := startedHorizon(t, dsn, admin, "public", "margin_outbox", "margin_pub", time.Minute)
	ctx := context.Background()
	if err := c.check(ctx, h); err != nil {
		t.Fatal(err)
	}
	first := h.pending
	if err := c.check(ctx, h); err != nil {
		t.Fatal(err)
	}
	if v := h.Verified(); v != 0 {
		t.Fatalf("a check right after another promoted %s without the margin of %s", v, h.interval())
	}
	anIntervalPasses(h)
	if err := c.check(ctx, h); err != nil {
		t.Fatal(err)
	}
	if v := h.Verified(); v != first {
		t.Fatalf("a check an interval later: verified %s, want the first check's position %s", v, first)
	}

	// On a new timeline the positions checked so far are forgotten: the next check promotes none.
	h.reset()
	anIntervalPasses(h)
	if err := c.check(ctx, h); err != nil {
		t.Fatal(err)
	}
	if v := h.Verified(); v != 0 {
		t.Fatalf("after a reset, a check promoted %s, a position read before it", v)
	}
}

// Checks that keep failing without a verdict (here: DDL holds the table all along) stop the relay
// after the stale limit, and the age of the last good check is a metric.
func TestHorizonStopsWhenChecksKeepFailing(t *testing.T) {
	dsn, admin := horizonDB(t)
	mustExec(t, admin, `CREATE TABLE stale_outbox `+outboxColumns+`;
		CREATE PUBLICATION stale_pub FOR TABLE stale_outbox WITH (publish = 'insert')`)
	h, _ := startedHorizon(t, dsn, admin, "public", "stale_outbox", "stale_pub", 50*time.Millisecond)
	h.staleLimit = time.Second
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "LOCK TABLE stale_outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { h.run(runCtx); close(done) }()
	select {
	case <-done:
	case <-runCtx.Done():
		t.Fatal("the checks failed for 30s and the horizon did not stop")
	}
	if err := h.Err(); !IsFatal(err) || !strings.Contains(err.Error(), "no publication check") {
		t.Fatalf("want a fatal error about the failing checks, got %v", err)
	}
}

// A check connection that reaches another database cluster than the stream's (a multi-host pg_dsn,
// a DNS name that moved) is refused as such, not judged as a recreated table.
func TestHorizonRefusesACheckOnAnotherCluster(t *testing.T) {
	dsn, admin := horizonDB(t)
	mustExec(t, admin, `CREATE TABLE cluster_outbox `+outboxColumns+`;
		CREATE PUBLICATION cluster_pub FOR TABLE cluster_outbox WITH (publish = 'insert')`)
	var systemID string
	if err := admin.QueryRow(context.Background(), "SELECT system_identifier::text FROM pg_control_system()").Scan(&systemID); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		stream  string // the cluster the stream identified; "" before any session
		wantErr string
	}{
		{"before the stream identified its server", "", ""},
		{"the stream's cluster", systemID, ""},
		{"another cluster", "7000000000000000001", "pg_dsn leads to different database clusters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, c := startedHorizon(t, dsn, admin, "public", "cluster_outbox", "cluster_pub", time.Second)
			if tt.stream != "" {
				h.expectCluster(tt.stream)
			}
			err := c.check(context.Background(), h)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("check: %v", err)
			case tt.wantErr != "" && (err == nil || !IsFatal(err) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("check: %v, want a fatal error saying %q", err, tt.wantErr)
			}
		})
	}
}

// A reset (a new timeline) that lands while a check is in flight must not let that check promote a
// position read before the reset; and the next check runs on a new connection, since the old one
// may still reach the superseded server.
func TestHorizonResetDuringACheck(t *testing.T) {
	dsn, admin := horizonDB(t)
	mustExec(t, admin, `CREATE TABLE race_outbox `+outboxColumns+`;
		CREATE PUBLICATION race_pub FOR TABLE race_outbox WITH (publish = 'insert')`)
	h, c := startedHorizon(t, dsn, admin, "public", "race_outbox", "race_pub", 100*time.Millisecond)
	ctx := context.Background()
	if err := c.check(ctx, h); err != nil {
		t.Fatal(err)
	}
	first := h.pending
	oldConn := c.conn
	time.Sleep(h.interval())
	// Hold the table a moment so the next check is in flight when the reset lands.
	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE race_outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.check(ctx, h) }()
	time.Sleep(50 * time.Millisecond)
	h.reset() // a new timeline, identified while the check waits for the lock
	tx.Rollback(ctx)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := h.Verified(); v != 0 {
		t.Fatalf("a check in flight at the reset promoted %s (the first check read %s), a position read before the reset", v, first)
	}
	if err := c.check(ctx, h); err != nil {
		t.Fatal(err)
	}
	if c.conn == oldConn {
		t.Fatal("the check after a reset reused the connection opened before it")
	}
}

// A check connection that reaches a standby in recovery (a single-host pg_dsn whose address the
// failover moved before the promotion finished) is no check PostgreSQL refused: the stream waits
// for the promotion as well, and however long it takes, the checks must not stop the relay. Once
// the standby is promoted they verify positions of its WAL.
func TestHorizonWaitsForAStandbyToBePromoted(t *testing.T) {
	t.Parallel()
	primary := testenv.Postgres(t, devenv.PostgresOptions{Version: "17"})
	dsn := testenv.OutboxDatabase(t, primary)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, admin, `CREATE TABLE standby_outbox `+outboxColumns+`;
		CREATE PUBLICATION standby_pub FOR TABLE standby_outbox WITH (publish = 'insert')`)
	admin.Close(ctx)
	standby := testenv.Standby(t, primary)
	admin, err = pgx.Connect(ctx, dsn) // the copy restarted the primary
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := startedHorizon(t, standby.DSN(strings.TrimPrefix(u.Path, "/")), admin, "public", "standby_outbox", "standby_pub", 50*time.Millisecond)
	h.staleLimit = time.Second
	core, logs := observer.New(zap.WarnLevel)
	h.log = zap.New(zapcore.NewTee(h.log.Core(), core))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { h.run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	// The standby refuses check after check; they must go on for longer than the stale limit.
	await.State(t, time.Minute, "checks refused by the standby over twice the stale limit", func() (bool, string) {
		select {
		case <-done:
			t.Fatalf("the checks stopped on a standby in recovery: %v", h.Err())
		default:
		}
		refused := logs.FilterMessageSnippet("cannot check the outbox table's publication").All()
		if len(refused) == 0 {
			return false, "no check refused yet"
		}
		span := refused[len(refused)-1].Time.Sub(refused[0].Time)
		return span > 2*h.staleLimit, fmt.Sprintf("%d refused over %s", len(refused), span)
	})
	if v := h.Verified(); v != 0 {
		t.Fatalf("a check on a standby verified %s", v)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(time.Minute)
	for h.Verified() == 0 {
		select {
		case <-done:
			t.Fatalf("the checks stopped after the promotion: %v", h.Err())
		case <-deadline:
			t.Fatal("no check verified a position of the promoted standby")
		case <-time.After(50 * time.Millisecond):
		}
	}
}
