package main_test

// Binary-level end-to-end tests: the outbox-relay command is built once per test binary and run as
// a subprocess against real PostgreSQL clusters and Kafka brokers (internal/testenv), configured
// the way an operator would, through OUTBOX_* variables, flags and YAML files. Every test checks
// at its end that nothing it captured from a subprocess reveals a password.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// pgPassword is devenv's default password of superuser postgres.
const pgPassword = "outbox-test-secret"

// TestMain serves every test of this directory, package main's too.
func TestMain(m *testing.M) { testenv.Main(m) }

// Bounds of the waits below. They are generous for a loaded two-core machine; a healthy run stays
// far below them.
const (
	startTimeout    = 60 * time.Second // a relay streams (slot active) after its start
	deliverTimeout  = 90 * time.Second // every written event is in Kafka
	shutdownTimeout = 10 * time.Second // --shutdown-timeout given to every relay
	// stopGrace is what a relay may take beyond --shutdown-timeout to exit after SIGTERM: the final
	// status update, closing connections, flushing logs.
	stopGrace     = 5 * time.Second
	badInputLimit = 30 * time.Second // a misconfigured relay has said so and exited
)

// ---------------------------------------------------------------------------------------------
// Subprocesses and their output

// syncBuffer is an io.Writer that can be read while a process writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// child is one subprocess with its output captured.
type child struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	started        time.Time
	done           chan struct{}
	waitErr        error
}

// running reports whether the process has not exited yet.
func (p *child) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// wait waits at most timeout for the process to exit and returns its exit status (-1 when a
// signal killed it); ok is false if it still runs.
func (p *child) wait(timeout time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return 0, false
	}
	var exitErr *exec.ExitError
	switch {
	case p.waitErr == nil:
		return 0, true
	case errors.As(p.waitErr, &exitErr):
		return exitErr.ExitCode(), true
	}
	return -1, true
}

// signal sends sig to the process.
func (p *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: send %v: %v", p.name, sig, err)
	}
}

// logLines returns the JSON log lines written to stderr so far (other lines are left out).
func (p *child) logLines() []map[string]any { return relayproc.Logs(p.stderr.String()) }

// findLog returns the first JSON log line at level (any level if empty) whose message contains msg.
func (p *child) findLog(level, msg string) map[string]any {
	return relayproc.FindLog(p.stderr.String(), level, msg)
}

// waitLog waits until the process logged msg at level, failing the test when it exits or the
// timeout passes first.
func (p *child) waitLog(t *testing.T, timeout time.Duration, level, msg string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if l := p.findLog(level, msg); l != nil {
			return l
		}
		if !p.running() {
			t.Fatalf("%s exited before logging %q; stderr:\n%s", p.name, msg, lastLines(p.stderr.String(), 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %s; stderr:\n%s", p.name, msg, timeout, lastLines(p.stderr.String(), 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// e2e is one test's subprocesses, and the secrets none of them may print.
type e2e struct {
	t       *testing.T
	secrets []string

	mu    sync.Mutex
	procs []*child
}

// newE2E registers, as the test's last cleanup, the check that no captured output holds a secret
// (or a race report of the race-enabled binary).
func newE2E(t *testing.T, secrets ...string) *e2e {
	e := &e2e{t: t, secrets: secrets}
	t.Cleanup(e.checkOutputs)
	return e
}

// addSecret adds a value that must not appear in any output of the test.
func (e *e2e) addSecret(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.secrets = append(e.secrets, s)
}

func (e *e2e) checkOutputs() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.procs {
		for stream, out := range map[string]string{"stdout": p.stdout.String(), "stderr": p.stderr.String()} {
			for _, s := range e.secrets {
				if strings.Contains(out, s) {
					e.t.Errorf("%s: %s reveals a password (%d bytes of output)", p.name, stream, len(out))
				}
			}
			if strings.Contains(out, "WARNING: DATA RACE") {
				e.t.Errorf("%s: the race detector reported a data race on %s:\n%s", p.name, stream, out)
			}
		}
		if e.t.Failed() {
			e.t.Logf("%s stdout:\n%s\n%s stderr (tail):\n%s", p.name, lastLines(p.stdout.String(), 10), p.name, lastLines(p.stderr.String(), 40))
		}
	}
}

// relayEnv is the test binary's environment without any OUTBOX_* variable, plus kv.
func relayEnv(kv ...string) []string {
	var env []string
	for _, v := range os.Environ() {
		if !strings.HasPrefix(v, "OUTBOX_") {
			env = append(env, v)
		}
	}
	// Tests publish to topics they do not create; a test of the default overrides it in kv.
	env = append(env, "OUTBOX_KAFKA_AUTO_CREATE_TOPICS=true")
	if _, ok := os.LookupEnv("GORACE"); !ok {
		// A race-enabled binary sleeps 1s before exiting by default; that would hide how long a
		// stop really takes.
		env = append(env, "GORACE=atexit_sleep_ms=0")
	}
	return append(env, kv...)
}

// startCmd starts path as a subprocess killed at the test's end (and when the test binary dies).
func (e *e2e) startCmd(name string, env []string, path string, args ...string) *child {
	e.t.Helper()
	p := &child{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.started = time.Now()
	waited, err := devenv.StartPinned(p.cmd) // the death signal follows the forking thread
	if err != nil {
		e.t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.waitErr = <-waited; close(p.done) }()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	e.t.Cleanup(func() {
		if p.running() {
			_ = p.cmd.Process.Kill()
		}
		<-p.done
	})
	return p
}

// relay starts the outbox-relay binary (built once per test binary, with -race when the tests
// have it).
func (e *e2e) relay(name string, env []string, args ...string) *child {
	e.t.Helper()
	return e.startCmd(name, env, relayproc.Binary(e.t), args...)
}

// mustRun runs the binary to completion and requires exit status 0.
func (e *e2e) mustRun(name string, env []string, args ...string) *child {
	e.t.Helper()
	p := e.relay(name, env, args...)
	code, ok := p.wait(time.Minute)
	if !ok || code != 0 {
		e.t.Fatalf("%s: outbox-relay %s: exit status %d (exited: %v); stderr:\n%s", name, strings.Join(args, " "), code, ok, lastLines(p.stderr.String(), 30))
	}
	return p
}

// stopRelay sends SIGTERM and requires a clean exit within the shutdown timeout, with the final
// position reported.
func stopRelay(t *testing.T, p *child) {
	t.Helper()
	sent := time.Now()
	p.signal(t, syscall.SIGTERM)
	code, ok := p.wait(shutdownTimeout + stopGrace)
	if !ok {
		t.Fatalf("%s still runs %s after SIGTERM (shutdown timeout %s)", p.name, time.Since(sent).Round(time.Millisecond), shutdownTimeout)
	}
	if code != 0 {
		t.Fatalf("%s exited with status %d after SIGTERM, want 0; stderr:\n%s", p.name, code, lastLines(p.stderr.String(), 20))
	}
	if p.findLog("info", "final position confirmed") == nil {
		t.Fatalf("%s did not log \"final position confirmed\"; stderr:\n%s", p.name, lastLines(p.stderr.String(), 20))
	}
	t.Logf("%s stopped %s after SIGTERM", p.name, time.Since(sent).Round(time.Millisecond))
}

// ---------------------------------------------------------------------------------------------
// Databases

type testDB struct {
	name string
	dsn  string
	pool *pgxpool.Pool
}

// newDatabase creates a database of its own for the test on pg.
func newDatabase(t *testing.T, pg *devenv.Postgres) *testDB {
	t.Helper()
	ctx := context.Background()
	name := testenv.UniqueName(t, "db")
	dsn, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &testDB{name: name, dsn: dsn, pool: pool}
}

func (d *testDB) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := d.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// slotState reads a slot's activity; exists is false when there is no such slot.
func slotState(ctx context.Context, pool *pgxpool.Pool, slot string) (exists, active bool, pid int, err error) {
	var p *int32
	err = pool.QueryRow(ctx, "SELECT active AND confirmed_flush_lsn IS NOT NULL, active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active, &p)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, 0, nil
	}
	if err != nil {
		return false, false, 0, err
	}
	if p != nil {
		pid = int(*p)
	}
	return true, active, pid, nil
}

// waitSlotActive waits until a process streams slot and returns its backend PID (a slot being
// created is active too, but without a confirmed position yet: transactions that commit before its
// consistent point are not in its stream, so writes must wait for more than "active"); p, if not nil,
// must not exit meanwhile.
func waitSlotActive(t *testing.T, pool *pgxpool.Pool, slot string, p *child) int {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		_, active, pid, err := slotState(context.Background(), pool, slot)
		if err == nil && active {
			return pid
		}
		if p != nil && !p.running() {
			t.Fatalf("%s exited before streaming slot %s; stderr:\n%s", p.name, slot, lastLines(p.stderr.String(), 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %s not active after %s (last error: %v)", slot, startTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------------------------
// Events

// writeLoad writes n transactions of 1..maxPerTx events over aggregates of the given types; a
// quarter of them carry headers.
func writeLoad(ctx context.Context, ob *harness.Outbox, rng *rand.Rand, types []string, n, maxPerTx, aggregates int) error {
	for range n {
		if err := ob.WriteTx(ctx, randomSpecs(rng, types, maxPerTx, aggregates)...); err != nil {
			return err
		}
	}
	return nil
}

// keepWriting commits transactions of 1 to 4 events of types over aggregates random aggregates
// (rand.NewPCG(seed, seed+1)) until the returned stop is called, which returns the writer's
// error; the test's cleanup stops it too. The pause between transactions paces the writer.
func keepWriting(ctx context.Context, t *testing.T, ob *harness.Outbox, types []string, seed uint64, aggregates int) (stop func() error) {
	quit, done := make(chan struct{}), make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(seed, seed+1))
		for {
			select {
			case <-quit:
				done <- nil
				return
			default:
			}
			if err := ob.WriteTx(ctx, randomSpecs(rng, types, 4, aggregates)...); err != nil {
				done <- err
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { close(quit); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func randomSpecs(rng *rand.Rand, types []string, maxPerTx, aggregates int) []harness.Spec {
	specs := make([]harness.Spec, 1+rng.IntN(maxPerTx))
	for i := range specs {
		specs[i] = harness.Spec{AggregateType: types[rng.IntN(len(types))], AggregateID: fmt.Sprintf("agg-%d", rng.IntN(aggregates))}
		if rng.IntN(4) == 0 {
			specs[i].Headers = map[string]string{"tenant": "t-" + strconv.Itoa(rng.IntN(3)), "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		}
	}
	return specs
}

// verifyDelivery reads every topic of ob's events until all arrived (or the timeout) and requires
// no loss, no reordering and no alteration; duplicates are returned in the report.
func verifyDelivery(t *testing.T, brokers string, ob *harness.Outbox) harness.Report {
	t.Helper()
	start := time.Now()
	written := ob.Written()
	c := harness.NewConsumer(brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), deliverTimeout)
	defer cancel()
	err := c.ReadUntil(ctx, time.Second, func(recs []harness.Record) bool {
		return harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() {
		again, why := harness.Recheck(written, brokers, rep)
		if !again.OK() {
			t.Fatalf("delivery check failed (read error: %v): %s; %s", err, rep, why)
		}
		t.Log(why)
		rep = again
	}
	t.Logf("read back %d records in %s", len(c.Records()), time.Since(start).Round(time.Millisecond))
	return rep
}

// ---------------------------------------------------------------------------------------------
// Tests

func TestMigrateIsIdempotentAndCreatesTheDocumentedTableAndPublication(t *testing.T) {
	t.Parallel()
	pg := testenv.SharedPostgres(t)
	e := newE2E(t, pgPassword)
	db := newDatabase(t, pg)
	// migrate never contacts Kafka, but its configuration check requires kafka_brokers; nothing
	// listens on this port.
	env := relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS=127.0.0.1:9")

	first := e.mustRun("first migrate", env, "migrate")
	if out := first.stdout.String(); !strings.Contains(out, "applied 0001_outbox_events.sql") || !strings.Contains(out, "ready") {
		t.Fatalf("first migrate printed %q, want the applied migration and that the table is ready", out)
	}
	second := e.mustRun("second migrate", env, "migrate")
	for _, line := range strings.Split(second.stdout.String(), "\n") {
		if strings.HasPrefix(line, "applied") {
			t.Fatalf("second migrate applied something again: %q", second.stdout.String())
		}
	}
	if !strings.Contains(second.stdout.String(), "ready") {
		t.Fatalf("second migrate printed %q, want that the table is ready", second.stdout.String())
	}

	type column struct{ typ, nullable, def string }
	rows, err := db.pool.Query(context.Background(), `SELECT column_name, data_type, is_nullable, coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'outbox_events'`)
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[string]column)
	for rows.Next() {
		var name string
		var c column
		if err := rows.Scan(&name, &c.typ, &c.nullable, &c.def); err != nil {
			t.Fatal(err)
		}
		got[name] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]func(column) bool{
		"id":             func(c column) bool { return c.typ == "uuid" && c.def == "gen_random_uuid()" },
		"aggregate_type": func(c column) bool { return c.typ == "text" },
		"aggregate_id":   func(c column) bool { return c.typ == "text" },
		"event_type":     func(c column) bool { return c.typ == "text" },
		"payload":        func(c column) bool { return c.typ == "jsonb" },
		"headers":        func(c column) bool { return c.typ == "jsonb" && c.nullable == "YES" },
		"created_at":     func(c column) bool { return c.typ == "timestamp with time zone" && c.def == "now()" },
		"seq":            func(c column) bool { return c.typ == "bigint" && c.nullable == "NO" }, // identity: no default
	}
	// Further columns are allowed: the relay maps columns by name.
	for name, ok := range want {
		c, found := got[name]
		if !found {
			t.Errorf("outbox_events has no column %s (it has %v)", name, slices.Sorted(maps.Keys(got)))
		} else if !ok(c) {
			t.Errorf("column %s is %+v, not as documented", name, c)
		}
	}

	var insert, update, del bool
	err = db.pool.QueryRow(context.Background(), "SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = 'outbox_relay'").
		Scan(&insert, &update, &del)
	if err != nil {
		t.Fatalf("publication outbox_relay: %v", err)
	}
	if !insert || update || del {
		t.Errorf("publication outbox_relay publishes insert=%v update=%v delete=%v, want INSERTs only", insert, update, del)
	}
	var tables []string
	rows, err = db.pool.Query(context.Background(), "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'outbox_relay'")
	if err == nil {
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || !slices.Equal(tables, []string{"public.outbox_events"}) {
		t.Errorf("publication outbox_relay covers %v (%v), want public.outbox_events", tables, err)
	}
}

func TestRunWithOnlyTheTwoEnvironmentVariablesStreamsCommittedInserts(t *testing.T) {
	t.Parallel()
	runWithOnlyTheTwoVariables(t, testenv.SharedPostgres(t), testenv.SharedKafka(t))
}

// runWithOnlyTheTwoVariables is the end-to-end scenario on a database of its own on pg: migrate,
// run with nothing but OUTBOX_PG_DSN and OUTBOX_KAFKA_BROKERS, events out byte for byte, SIGTERM.
// It uses the default slot name, so no other test may run it on the same cluster.
func runWithOnlyTheTwoVariables(t *testing.T, pg *devenv.Postgres, k *devenv.Kafka) {
	ctx := context.Background()
	e := newE2E(t, pgPassword)
	db := newDatabase(t, pg)
	env := relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS="+k.Brokers())
	e.mustRun("migrate", env, "migrate")

	// No flag and no other variable: the defaults (slot and publication outbox_relay, the table
	// migrate created, Debezium's topic names) must be enough. The slot name is per cluster; no
	// other test of this binary uses the default.
	relay := e.relay("relay", env, "run")
	waitSlotActive(t, db.pool, "outbox_relay", relay)
	t.Logf("relay streams %s after its start", time.Since(relay.started).Round(time.Millisecond))

	ob, err := harness.NewOutbox(ctx, db.dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	types := []string{testenv.UniqueName(t, "order"), testenv.UniqueName(t, "customer")}
	rng := rand.New(rand.NewPCG(7, 8))
	if err := writeLoad(ctx, ob, rng, types, 40, 3, 5); err != nil {
		t.Fatal(err)
	}
	// A rolled-back transaction publishes nothing: Verify counts any record it cannot match.
	tx, err := ob.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.WriteIn(ctx, tx, harness.Spec{AggregateType: types[0], AggregateID: "agg-0"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Rows written by hand, with the table's default id, a payload whose jsonb text differs from
	// what was inserted (key order, spacing, numbers), headers with a non-string member, and NULL
	// headers; an insert into another table in the same transaction is not an event.
	manual := testenv.UniqueName(t, "manual")
	db.exec(t, "CREATE TABLE orders (id text PRIMARY KEY, customer text, total numeric)")
	type row struct {
		id, aggID, eventType, payload string
		headers                       map[string]string
	}
	rowsIn := []struct {
		aggID, eventType, payload string
		headers                   *string
	}{
		{"order-42", "OrderCreated", `{"total":  12.50, "customer": "Zoë 🚀", "items": [1,2,  3], "a": {"z": 1, "b": null}, "big": 1e3}`,
			ptrTo(`{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "attempt": 2, "gone": null}`)},
		{"order-42", "OrderShipped", `{"carrier":"ups","escaped":"line\nbreak \"quoted\""}`, nil},
	}
	var manualRows []row
	err = pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES ('order-42', 'Zoë', 12.50)"); err != nil {
			return err
		}
		for _, in := range rowsIn {
			r := row{aggID: in.aggID, eventType: in.eventType}
			err := tx.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
				VALUES ($1, $2, $3, $4::jsonb, $5::jsonb) RETURNING id::text, payload::text`,
				manual, in.aggID, in.eventType, in.payload, in.headers).Scan(&r.id, &r.payload)
			if err != nil {
				return err
			}
			r.headers = map[string]string{"id": r.id, "event_type": in.eventType, "aggregate_type": manual}
			if in.headers != nil {
				r.headers["tenant"] = "acme"
				r.headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
				r.headers["attempt"] = "2"
			}
			manualRows = append(manualRows, r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if manualRows[0].payload == rowsIn[0].payload {
		t.Fatal("the jsonb text equals the inserted text: the payload no longer shows that values are payload::text")
	}

	rep := verifyDelivery(t, k.Brokers(), ob)
	if rep.Duplicates > 0 {
		t.Errorf("a single uninterrupted relay published duplicates: %s", rep)
	}

	c := harness.NewConsumer(k.Brokers(), "outbox.event."+manual)
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, deliverTimeout)
	defer cancel()
	if err := c.ReadUntil(rctx, 500*time.Millisecond, func(recs []harness.Record) bool { return len(recs) >= len(manualRows) }); err != nil {
		t.Fatal(err)
	}
	recs := c.Records()
	if len(recs) != len(manualRows) {
		t.Fatalf("topic outbox.event.%s holds %d records, want %d", manual, len(recs), len(manualRows))
	}
	// Both rows share an aggregate, so they share a partition, in commit order.
	for i, r := range manualRows {
		got := recs[i]
		if string(got.Key) != r.aggID {
			t.Errorf("record %d: key %q, want the aggregate id %q", i, got.Key, r.aggID)
		}
		if string(got.Value) != r.payload {
			t.Errorf("record %d: value %q, want payload::text exactly: %q", i, got.Value, r.payload)
		}
		if !maps.Equal(got.Headers, r.headers) {
			t.Errorf("record %d: headers %v, want %v", i, got.Headers, r.headers)
		}
	}
	stopRelay(t, relay)
}

func ptrTo[T any](v T) *T { return &v }

func TestSIGTERMMidStreamThenRestartLosesNothing(t *testing.T) {
	t.Parallel()
	sigtermRestarts(t, testenv.SharedPostgres(t), testenv.SharedKafka(t))
}

// sigtermRestarts is the relay restart scenario on a database of its own on pg: three SIGTERMs
// and restarts while a writer keeps committing; nothing lost, the slot confirmed past the end.
func sigtermRestarts(t *testing.T, pg *devenv.Postgres, k *devenv.Kafka) {
	ctx := context.Background()
	e := newE2E(t, pgPassword)
	db := newDatabase(t, pg)
	slot := testenv.UniqueName(t, "slot")
	env := relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS="+k.Brokers())
	args := []string{"run", "--slot=" + slot, "--publication=" + slot, "--status-interval=200ms",
		"--shutdown-timeout=" + shutdownTimeout.String()}
	e.mustRun("migrate", env, "migrate", "--publication="+slot)

	ob, err := harness.NewOutbox(ctx, db.dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	types := []string{testenv.UniqueName(t, "agga"), testenv.UniqueName(t, "aggb")}

	relay := e.relay("relay #1", env, args...)
	waitSlotActive(t, db.pool, slot, relay)

	// The writer keeps committing transactions through every stop and start.
	stopWriting := keepWriting(ctx, t, ob, types, 11, 20)

	// flowed waits until the relay running now has confirmed events written since it streams.
	flowed := func(what string) {
		t.Helper()
		// Events written from now on: otherwise a slot just created may already stand at the end
		// of the WAL, and the relay would be stopped before it streamed anything.
		written := len(ob.Written())
		await.True(t, startTimeout, "the writer to commit while the relay streams", func() bool { return len(ob.Written()) > written })
		from, err := harness.CurrentLSN(ctx, db.pool)
		if err != nil {
			t.Fatal(err)
		}
		await.True(t, startTimeout, what, func() bool {
			lsn, err := harness.ConfirmedFlushLSN(ctx, db.pool, slot)
			return err == nil && lsn >= from
		})
	}
	for i := 1; i <= 3; i++ {
		// Let events flow through this relay, then stop it while they still do.
		flowed(fmt.Sprintf("relay #%d to confirm events written while it streams", i))
		before := len(ob.Written())
		stopRelay(t, relay)
		t.Logf("stop %d: %d events committed so far", i, before)
		time.Sleep(300 * time.Millisecond) // events committed while no relay runs
		relay = e.relay(fmt.Sprintf("relay #%d", i+1), env, args...)
		waitSlotActive(t, db.pool, slot, relay)
	}
	flowed("the last relay to confirm events written while it streams")
	if err := stopWriting(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	end, err := harness.CurrentLSN(ctx, db.pool)
	if err != nil {
		t.Fatal(err)
	}
	rep := verifyDelivery(t, k.Brokers(), ob)
	t.Logf("after 3 SIGTERM restarts under load: %s", rep)
	if rep.Duplicates > 0 {
		t.Logf("duplicates (allowed, at-least-once): %d of %d events", rep.Duplicates, rep.Expected)
	}
	// Everything is in Kafka, so the slot must get confirmed past the last transaction.
	deadline := time.Now().Add(30 * time.Second)
	for {
		lsn, err := harness.ConfirmedFlushLSN(ctx, db.pool, slot)
		if err == nil && lsn >= end {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %s confirmed at %X (%v), not past the last transaction %X, 30s after delivery", slot, lsn, err, end)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopRelay(t, relay)
}

func TestBadInputEndsWithOneClearLine(t *testing.T) {
	t.Parallel()
	pg, k := testenv.SharedPostgres(t), testenv.SharedKafka(t)

	// setup prepares the case and returns the environment and arguments of `outbox-relay run`,
	// plus strings the final line must contain (beyond the case's fixed ones).
	type setup func(t *testing.T, e *e2e, db *testDB, slot string) (env, args, want []string)
	base := func(db *testDB, slot string, extra ...string) ([]string, []string) {
		return relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS="+k.Brokers()),
			append([]string{"run", "--slot=" + slot, "--publication=" + slot, "--status-interval=200ms"}, extra...)
	}
	migrate := func(t *testing.T, e *e2e, db *testDB, slot string) {
		t.Helper()
		e.mustRun("migrate", relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS="+k.Brokers()), "migrate", "--publication="+slot)
	}
	cases := []struct {
		name  string
		setup setup
		want  []string // substrings of the final line, case-insensitive
	}{
		{
			name: "wal_level replica names the setting and the value it needs",
			setup: func(t *testing.T, e *e2e, _ *testDB, slot string) ([]string, []string, []string) {
				replica := testenv.Postgres(t, devenv.PostgresOptions{WALLevel: "replica"})
				db := newDatabase(t, replica)
				env, args := base(db, slot)
				return env, args, nil
			},
			want: []string{"wal_level", "logical", `"replica"`, "restart"},
		},
		{
			name: "a role without REPLICATION is told to get it",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				migrate(t, e, db, slot)
				role, password := testenv.UniqueName(t, "role"), "e2e-Role-Pw-9c41f7"
				e.addSecret(password)
				db.exec(t, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password))
				u, err := url.Parse(db.dsn)
				if err != nil {
					t.Fatal(err)
				}
				u.User = url.UserPassword(role, password)
				_, args := base(db, slot)
				return relayEnv("OUTBOX_PG_DSN="+u.String(), "OUTBOX_KAFKA_BROKERS="+k.Brokers()), args, []string{role}
			},
			want: []string{"REPLICATION", "ALTER ROLE"},
		},
		{
			name: "a missing outbox table points at outbox-relay migrate",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				env, args := base(db, slot)
				return env, args, nil
			},
			want: []string{"outbox_events", "does not exist", "outbox-relay migrate"},
		},
		{
			name: "a missing mapped column is named",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				migrate(t, e, db, slot)
				env, args := base(db, slot, "--columns.payload=body")
				return env, args, nil
			},
			want: []string{`no column "body"`, "columns."},
		},
		{
			name: "a slot with another output plugin asks for pgoutput",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				migrate(t, e, db, slot)
				db.exec(t, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", slot)
				env, args := base(db, slot)
				return env, args, []string{slot}
			},
			want: []string{"test_decoding", "pgoutput"},
		},
		{
			name: "a slot of another database names that database",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				migrate(t, e, db, slot)
				other := newDatabase(t, pg)
				other.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
				env, args := base(db, slot)
				return env, args, []string{slot, other.name, db.name}
			},
			want: []string{"belongs to database"},
		},
		{
			name: "a slot another process streams names the PID holding it",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				migrate(t, e, db, slot)
				db.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
				recv := e.startCmd("pg_recvlogical", relayEnv(), pgRecvLogical(t), "--start", "--slot", slot, "--dbname", db.dsn,
					"-o", "proto_version=1", "-o", "publication_names="+slot, "-f", "/dev/null")
				pid := waitSlotActive(t, db.pool, slot, recv)
				// Without leader election: with it, a busy slot means another instance leads, and
				// this one stands by.
				env, args := base(db, slot, "--slot-busy-wait=2s", "--leader-election=false")
				return env, args, []string{slot, "PID " + strconv.Itoa(pid)}
			},
			want: []string{"stop the other reader"},
		},
		{
			name: "an invalid duration names its key",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				env, args := base(db, slot, "--kafka.linger=5x")
				return env, args, nil
			},
			want: []string{"config key kafka.linger", "--kafka.linger", `"5x"`, "duration"},
		},
		{
			name: "an invalid size names its key",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				env, args := base(db, slot, "--max-in-flight-bytes=abc")
				return env, args, nil
			},
			want: []string{"config key max_in_flight_bytes", `"abc"`, "size"},
		},
		{
			name: "a backfill of the table-free outbox is refused: nothing is stored",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				env, args := base(db, slot, "--outbox-shape=messages", "--backfill=true")
				return env, args, nil
			},
			want: []string{"config key backfill", "--backfill", "outbox_shape messages stores nothing"},
		},
		{
			name: "an unknown key in the YAML file is named",
			setup: func(t *testing.T, e *e2e, db *testDB, slot string) ([]string, []string, []string) {
				file := filepath.Join(t.TempDir(), "relay.yaml")
				yaml := "slot: " + slot + "\nkafka:\n  linger: 5ms\n  lingr: 50ms\n"
				if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
					t.Fatal(err)
				}
				env, args := base(db, slot, "--config="+file)
				return env, args, []string{file}
			},
			want: []string{"unknown key kafka.lingr"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newE2E(t, pgPassword)
			db := newDatabase(t, pg)
			slot := testenv.UniqueName(t, "slot")
			env, args, more := tc.setup(t, e, db, slot)
			p := e.relay("relay", env, args...)
			code, ok := p.wait(badInputLimit)
			if !ok {
				t.Fatalf("relay still runs after %s; stderr:\n%s", badInputLimit, lastLines(p.stderr.String(), 20))
			}
			if code == 0 {
				t.Fatalf("relay exited with status 0, want non-zero; stderr:\n%s", lastLines(p.stderr.String(), 20))
			}
			line := lastLine(p.stderr.String())
			if !strings.HasPrefix(line, "outbox-relay: ") {
				t.Fatalf("the last line of stderr is %q, want the \"outbox-relay: ...\" error line", line)
			}
			for _, w := range append(slices.Clone(tc.want), more...) {
				if !strings.Contains(strings.ToLower(line), strings.ToLower(w)) {
					t.Errorf("the error line does not mention %q:\n%s", w, line)
				}
			}
			t.Logf("exit status %d after %s: %s", code, time.Since(p.started).Round(time.Millisecond), line)
		})
	}
}

// pgRecvLogical finds the pg_recvlogical client.
func pgRecvLogical(t *testing.T) string {
	t.Helper()
	if path, err := exec.LookPath("pg_recvlogical"); err == nil {
		return path
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_recvlogical")
	if len(found) == 0 {
		t.Fatal("pg_recvlogical not found: run scripts/ensure-tools.sh")
	}
	return found[len(found)-1]
}

func TestKafkaUnreachableAtStartIsWaitedFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The shared broker behind a gate that drops every connection until it opens: the relay's
	// bootstrap address is unreachable in the way that matters to it (no metadata), without the
	// minute a dedicated broker's stop and start would cost. Once open, the broker's metadata
	// sends the relay to the broker itself.
	pg, k := testenv.SharedPostgres(t), testenv.SharedKafka(t)
	gate := newKafkaGate(t, k.Brokers())
	e := newE2E(t, pgPassword)
	db := newDatabase(t, pg)
	slot := testenv.UniqueName(t, "slot")
	env := relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS="+gate.addr)
	e.mustRun("migrate", env, "migrate", "--publication="+slot)
	// A first start: there is no slot yet. The relay creates it before it waits for Kafka, so the
	// events committed while it waits are in the slot and must all arrive. (A restart during an
	// outage, with the slot already there, is a fault scenario in faults/.)

	relay := e.relay("relay", env, "run", "--slot="+slot, "--publication="+slot, "--status-interval=200ms",
		"--shutdown-timeout="+shutdownTimeout.String())
	warn := relay.waitLog(t, startTimeout, "warn", "kafka unreachable")
	if _, ok := warn["retry_in"]; !ok && !strings.Contains(fmt.Sprint(warn["msg"]), "retry") {
		t.Errorf("the warning does not say the relay retries: %v", warn)
	}

	ob, err := harness.NewOutbox(ctx, db.dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	types := []string{testenv.UniqueName(t, "agg")}
	if err := writeLoad(ctx, ob, rand.New(rand.NewPCG(21, 22)), types, 30, 3, 5); err != nil {
		t.Fatal(err)
	}
	// The relay is still there, and still trying: it comes back to the gate after the events were
	// committed, and until its retries reach the backoff's cap (the fifth attempt waited 2 s), from
	// which on it waits the same for ever.
	refused := gate.refused.Load()
	await.True(t, time.Minute, "the relay's retries to reach the backoff's cap", func() bool {
		if !relay.running() {
			t.Fatalf("the relay exited while Kafka was unreachable; stderr:\n%s", lastLines(relay.stderr.String(), 20))
		}
		return gate.refused.Load() >= max(refused+1, 5)
	})
	gate.open()
	if err := writeLoad(ctx, ob, rand.New(rand.NewPCG(23, 24)), types, 10, 3, 5); err != nil {
		t.Fatal(err)
	}
	rep := verifyDelivery(t, k.Brokers(), ob)
	t.Logf("after Kafka came up: %s", rep)
	stopRelay(t, relay)
}

// kafkaGate listens on a local port in front of a broker: closed, it accepts and at once closes
// every connection; open, it forwards them.
type kafkaGate struct {
	addr    string
	target  string
	opened  atomic.Bool
	refused atomic.Int64 // connections closed at once while the gate was closed
}

func newKafkaGate(t *testing.T, target string) *kafkaGate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	g := &kafkaGate{addr: ln.Addr().String(), target: strings.Split(target, ",")[0]}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !g.opened.Load() {
				c.Close()
				g.refused.Add(1)
				continue
			}
			go g.forward(c)
		}
	}()
	return g
}

func (g *kafkaGate) open() { g.opened.Store(true) }

func (g *kafkaGate) forward(c net.Conn) {
	defer c.Close()
	b, err := net.DialTimeout("tcp", g.target, 5*time.Second)
	if err != nil {
		return
	}
	defer b.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(b, c); done <- struct{}{} }()
	go func() { io.Copy(c, b); done <- struct{}{} }()
	<-done
}
