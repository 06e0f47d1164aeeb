package main

// Binary-level tests of the single-leader deployment: two relays on one slot, one streams, the
// other stands by and takes over when the leader is killed or loses its lock connection. The
// helpers here are shared by metrics_test.go, status_test.go, privilege_test.go and security_test.go.
// TestMain (testenv.Main) is in e2e_test.go.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// Bounds of the waits in these tests: generous for a loaded two-core machine running the race
// detector; a healthy run stays far below them.
const (
	haStartTimeout   = 60 * time.Second // a relay streams after its start
	haDeliverTimeout = 90 * time.Second // every written event is in Kafka
	haStopTimeout    = 20 * time.Second // a relay exits after SIGTERM
	takeoverBound    = 10 * time.Second // the standby streams after the leader is killed
	fenceBound       = 5 * time.Second  // a leader stops streaming after its lock connection dies
)

// devenvPGPassword is devenv's default password of superuser postgres; no output may show it.
const devenvPGPassword = "outbox-test-secret"

// haFixture is one test's database with the outbox table and publication, its slot, and
// aggregate types of its own (so its topics are its own on a shared broker).
type haFixture struct {
	t       *testing.T
	pg      *devenv.Postgres
	dbName  string
	dsn     string // superuser
	brokers string
	slot    string
	pool    *pgxpool.Pool
	outbox  *harness.Outbox
	types   []string
}

func newHAFixture(t *testing.T, pg *devenv.Postgres, brokers string, nTypes int) *haFixture {
	t.Helper()
	ctx := context.Background()
	name := testenv.UniqueName(t, "db")
	dsn, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := harness.NewOutbox(ctx, dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ob.Close)
	f := &haFixture{t: t, pg: pg, dbName: name, dsn: dsn, brokers: brokers, slot: testenv.UniqueName(t, "slot"), pool: pool, outbox: ob}
	for i := range nTypes {
		f.types = append(f.types, testenv.UniqueName(t, fmt.Sprintf("agg%d", i)))
	}
	return f
}

// withAppName returns dsn with application_name set, so a relay's backends can be told apart.
func withAppName(t *testing.T, dsn, app string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

// env is the configuration every relay of the fixture gets; name becomes its application_name.
func (f *haFixture) env(name string, extra map[string]string) map[string]string {
	env := map[string]string{
		"OUTBOX_PG_DSN":             withAppName(f.t, f.dsn, name),
		"OUTBOX_KAFKA_BROKERS":      f.brokers,
		"OUTBOX_SLOT":               f.slot,
		"OUTBOX_PUBLICATION":        f.slot,
		"OUTBOX_METRICS_ADDR":       "127.0.0.1:0",
		"OUTBOX_SLOT_POLL_INTERVAL": "500ms",
		"OUTBOX_SHUTDOWN_TIMEOUT":   "10s",
		"GORACE":                    "atexit_sleep_ms=0",
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// instance is one started relay process.
type instance struct {
	name string
	*relayproc.Proc
}

func (f *haFixture) start(name string, extra map[string]string, args ...string) *instance {
	f.t.Helper()
	r := &instance{name: name, Proc: relayproc.Start(f.t, relayproc.Options{Env: f.env(name, extra), Args: args})}
	f.t.Cleanup(func() {
		r.Kill()
		out := r.Output()
		if strings.Contains(out, devenvPGPassword) {
			f.t.Errorf("%s: output reveals the PostgreSQL password", name)
		}
	})
	return r
}

// logs returns the JSON log lines so far.
func (r *instance) logs() []map[string]any { return relayproc.Logs(r.Output()) }

// findLog returns the first log line at level (any when empty) whose message contains msg.
func (r *instance) findLog(level, msg string) map[string]any {
	return relayproc.FindLog(r.Output(), level, msg)
}

// waitLog waits for a log line; the relay must not exit meanwhile.
func (r *instance) waitLog(t *testing.T, timeout time.Duration, level, msg string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if l := r.findLog(level, msg); l != nil {
			return l
		}
		if r.Exited() {
			t.Fatalf("%s exited before logging %q:\n%s", r.name, msg, r.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %s", r.name, msg, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricsAddr is where the relay serves /metrics (it listens on a port of its choosing).
func (r *instance) metricsAddr(t *testing.T) string {
	t.Helper()
	l := r.waitLog(t, haStartTimeout, "info", "serving metrics")
	addr, _ := l["addr"].(string)
	if addr == "" {
		t.Fatalf("%s: no addr in %v", r.name, l)
	}
	return addr
}

// stop sends SIGTERM and requires exit status 0.
func (r *instance) stop(t *testing.T) {
	t.Helper()
	r.Terminate()
	code, ok := r.Wait(haStopTimeout)
	if !ok || code != 0 {
		t.Fatalf("%s: exit status %d (exited: %v) after SIGTERM", r.name, code, ok)
	}
}

// get fetches an HTTP path of the relay and returns the status code and body.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s%s: %v", addr, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// scrape reads /metrics into "name{labels}" -> value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	code, body := get(t, addr, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: status %d", code)
	}
	out := make(map[string]float64)
	for _, line := range strings.Split(body, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// sumMetric adds every series of name whose labels contain all of labels.
func sumMetric(ms map[string]float64, name string, labels ...string) float64 {
	var sum float64
	for k, v := range ms {
		base, lbl, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(lbl, l)
		}
		if match {
			sum += v
		}
	}
	return sum
}

// streamer says which application streams the slot: "" when nothing does. A slot being created is
// active too, without a confirmed position yet, and transactions that commit before its consistent
// point are not in its stream: such a slot does not count.
func (f *haFixture) streamer() (app string, pid int32) {
	var a *string
	var p *int32
	err := f.pool.QueryRow(context.Background(), `SELECT a.application_name, s.active_pid FROM pg_replication_slots s
		LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1 AND s.active AND s.confirmed_flush_lsn IS NOT NULL`, f.slot).Scan(&a, &p)
	if err != nil || p == nil {
		return "", 0
	}
	if a != nil {
		app = *a
	}
	return app, *p
}

// waitStreamer waits until the relay named app streams the slot and returns the walsender's PID.
func (f *haFixture) waitStreamer(t *testing.T, r *instance, timeout time.Duration) int32 {
	t.Helper()
	var pid int32
	await.True(t, timeout, r.name+" streams the slot", func() bool {
		if r.Exited() {
			t.Fatalf("%s exited:\n%s", r.name, r.Output())
		}
		var app string
		app, pid = f.streamer()
		return app == r.name
	})
	return pid
}

// lockHolder returns the backend PID holding the slot's leader lock, 0 when none.
func (f *haFixture) lockHolder(t *testing.T) int32 {
	t.Helper()
	h, held, err := leader.LockHolder(context.Background(), f.pool, f.slot)
	if err != nil {
		t.Fatal(err)
	}
	if !held {
		return 0
	}
	return h.PID
}

// writer commits small transactions until stopped.
type writer struct {
	stopOnce sync.Once
	stopCh   chan struct{}
	done     chan error
}

func (f *haFixture) startWriter(ctx context.Context, seed uint64) *writer {
	w := &writer{stopCh: make(chan struct{}), done: make(chan error, 1)}
	rng := rand.New(rand.NewPCG(seed, 42))
	go func() {
		for {
			select {
			case <-w.stopCh:
				w.done <- nil
				return
			case <-time.After(15 * time.Millisecond):
			}
			specs := make([]harness.Spec, 1+rng.IntN(4))
			for i := range specs {
				specs[i] = harness.Spec{AggregateType: f.types[rng.IntN(len(f.types))], AggregateID: fmt.Sprintf("agg-%d", rng.IntN(20))}
			}
			if err := f.outbox.WriteTx(ctx, specs...); err != nil {
				w.done <- err
				return
			}
		}
	}()
	return w
}

func (w *writer) stop(t *testing.T) {
	t.Helper()
	w.stopOnce.Do(func() { close(w.stopCh) })
	if err := <-w.done; err != nil {
		t.Fatalf("writer: %v", err)
	}
}

// verify reads every topic until all written events arrived and requires no loss, no reordering
// and no alteration; it returns the report (duplicates are allowed: at-least-once).
func (f *haFixture) verify(t *testing.T, brokers string) harness.Report {
	t.Helper()
	written := f.outbox.Written()
	if len(written) == 0 {
		t.Fatal("nothing was written")
	}
	c := harness.NewConsumer(brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), haDeliverTimeout)
	defer cancel()
	err := c.ReadUntil(ctx, time.Second, func(recs []harness.Record) bool {
		return harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() {
		// A consumer glitch on a loaded machine is told apart from a lost event.
		again, why := harness.Recheck(written, brokers, rep)
		if !again.OK() {
			t.Fatalf("delivery check failed (read error: %v): %s; %s", err, rep, why)
		}
		t.Log(why)
		rep = again
	}
	return rep
}

func TestTwoInstancesOneStreamsAndTheStandbyTakesOverWithinTheBoundAfterKill9(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 3)
	ctx := context.Background()

	a := f.start("relay-a", nil)
	f.waitStreamer(t, a, haStartTimeout)
	a.waitLog(t, haStartTimeout, "info", "leader: holding the leader lock")
	b := f.start("relay-b", nil)
	b.waitLog(t, haStartTimeout, "info", "standby: another instance holds the leader lock")

	w := f.startWriter(ctx, 1)
	// Both run for a while: the slot stays with a, and b never tries to stream it.
	f.outbox.AwaitMore(t, 300, "while both run")
	if app, _ := f.streamer(); app != "relay-a" {
		t.Fatalf("slot streamed by %q while relay-a leads", app)
	}
	if l := b.findLog("", "streaming"); l != nil {
		t.Fatalf("the standby logged %v", l)
	}
	if l := b.findLog("", "replication interrupted"); l != nil {
		t.Fatalf("the standby touched the slot: %v", l)
	}

	killed := time.Now()
	a.Kill()
	f.waitStreamer(t, b, takeoverBound)
	took := time.Since(killed)
	t.Logf("relay-b streams %s after relay-a was killed (bound %s)", took.Round(time.Millisecond), takeoverBound)
	b.waitLog(t, haStartTimeout, "info", "leader: holding the leader lock")

	f.outbox.AwaitMore(t, 150, "across the takeover")
	w.stop(t)
	rep := f.verify(t, f.brokers)
	t.Logf("across the takeover: %s", rep)
	b.stop(t)
}

// TestTheSlotNeverShowsAWalsenderItsLeaderHasNotPublished: at any moment the slot shows a leader's
// walsender active, the leader's lock session already names it, in the first session and in every
// reconnection's. A leader that stalls at any moment (a pause, a frozen VM) so leaves the next leader
// the walsender to end; one that published it only once streaming began left a window in which the
// next leader waited for wal_sender_timeout (60 s). The slot and the holder are read every few
// milliseconds, the slot first: a walsender the slot shows must be published when the holder is
// read after.
func TestTheSlotNeverShowsAWalsenderItsLeaderHasNotPublished(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	a := f.start("relay-a", nil)
	const sessions = 5
	var last int32
	for i := 0; i < sessions; {
		if a.Exited() {
			t.Fatalf("relay-a exited:\n%s", a.Output())
		}
		var active *int32
		err := f.pool.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&active)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if active == nil || *active == last {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		h, held, err := leader.LockHolder(ctx, f.pool, f.slot)
		if err != nil {
			t.Fatal(err)
		}
		if !held || h.WalsenderPID != *active {
			t.Fatalf("session %d: the slot shows walsender %d active, and the leader lock holder publishes %d (held %v, %+v)", i+1, *active, h.WalsenderPID, held, h)
		}
		i, last = i+1, *active
		if i < sessions {
			// A reconnection: its walsender is new.
			if _, err := f.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", last); err != nil {
				t.Fatal(err)
			}
		}
	}
	a.stop(t)
}

func TestALeaderWhoseLockConnectionIsKilledStopsStreamingAndLeadsAgain(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()

	a := f.start("relay-a", nil)
	walsender := f.waitStreamer(t, a, haStartTimeout)
	lockPID := f.lockHolder(t)
	if lockPID == 0 || lockPID == walsender {
		t.Fatalf("lock holder %d, walsender %d: want a separate lock connection", lockPID, walsender)
	}
	w := f.startWriter(ctx, 2)
	f.outbox.AwaitMore(t, 80, "before the lock connection is terminated")

	if _, err := f.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", lockPID); err != nil {
		t.Fatal(err)
	}
	terminated := time.Now()
	// Fencing: the walsender of the old term goes away within the bound (the relay may already
	// stream again through a new one).
	took := await.True(t, fenceBound, "the old walsender ends after the lock connection was killed", func() bool {
		_, pid := f.streamer()
		return pid != walsender
	})
	t.Logf("old walsender gone %s after pg_terminate_backend (bound %s)", took.Round(time.Millisecond), fenceBound)
	a.waitLog(t, haStartTimeout, "error", "lost the leader lock connection; fencing")
	if time.Since(terminated) > haStartTimeout {
		t.Fatal("unreachable")
	}

	// The only instance campaigns again and leads with a new lock connection and walsender.
	newWalsender := f.waitStreamer(t, a, haStartTimeout)
	if newWalsender == walsender {
		t.Fatalf("the slot is still streamed by the fenced walsender %d", walsender)
	}
	if h := f.lockHolder(t); h == 0 || h == lockPID {
		t.Fatalf("leader lock holder %d after re-election, want a new backend (old %d)", h, lockPID)
	}
	f.outbox.AwaitMore(t, 80, "after the re-election")
	w.stop(t)
	rep := f.verify(t, f.brokers)
	t.Logf("across the fence: %s", rep)
	a.stop(t)
}

func TestWithElectionOffARelayStreamsAloneAndAnElectedRelayWaitsForItInsteadOfExiting(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	began := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), what) }

	solo := f.start("relay-solo", map[string]string{"OUTBOX_LEADER_ELECTION": "false"})
	f.waitStreamer(t, solo, haStartTimeout)
	step("relay-solo streams")
	addr := solo.metricsAddr(t)
	if h := f.lockHolder(t); h != 0 {
		t.Fatalf("a relay without election holds the leader lock (backend %d)", h)
	}
	await.True(t, 10*time.Second, "the relay without election reports leader and ready", func() bool {
		ms := scrape(t, addr)
		return ms["outbox_relay_leader"] == 1 && ms["outbox_relay_ready"] == 1
	})

	// An elected relay takes the lock but finds the slot busy: it stands by, it does not exit.
	elected := f.start("relay-elected", map[string]string{"OUTBOX_SLOT_BUSY_WAIT": "1s"})
	elected.waitLog(t, haStartTimeout, "info", "another process streams the slot; standing by and retrying")
	step("relay-elected stands by")
	if elected.Exited() {
		t.Fatalf("the elected relay exited:\n%s", elected.Output())
	}

	// A second relay without election keeps today's behaviour: it gives up after slot_busy_wait.
	code, out := relayproc.Run(t, relayproc.Options{Env: f.env("relay-solo2", map[string]string{
		"OUTBOX_LEADER_ELECTION": "false", "OUTBOX_SLOT_BUSY_WAIT": "1s",
	})}, 60*time.Second)
	if code != 1 || !strings.Contains(out, "replication slot is active for another process") {
		t.Fatalf("second relay without election: exit %d, want 1 with the slot-active error:\n%s", code, out)
	}

	step("relay-solo2 gave up")
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "a"}); err != nil {
		t.Fatal(err)
	}
	solo.stop(t)
	step("relay-solo stopped")
	f.waitStreamer(t, elected, 30*time.Second)
	step("relay-elected streams")
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "a"}); err != nil {
		t.Fatal(err)
	}
	f.verify(t, f.brokers)
	step("both events delivered")
	elected.stop(t)
	step("relay-elected stopped")
}

// Each leadership term builds a new relay and stream, and without the slot ledger (not migrated,
// or not readable by the relay's role) the new term used to know nothing of the slot the process
// had streamed: after a promotion of a standby without the slot (PostgreSQL 16 or older) it
// created a new one and skipped what was committed in the gap without a word. What the process
// streamed outlives its terms: a new term finding the slot gone refuses to create it and the relay
// stops with the recovery.
func TestANewTermWithoutALedgerRefusesToRecreateTheSlotTheProcessStreamed(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, "DROP TABLE outbox_relay_slots"); err != nil {
		t.Fatal(err)
	}
	a := f.start("relay-a", nil)
	walsender := f.waitStreamer(t, a, haStartTimeout)
	lockPID := f.lockHolder(t)

	// End the term, and keep the next one from starting until the slot is gone: this session
	// queues for the leader lock before the leader's lock session ends, so it gets the lock first.
	hold, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close(ctx)
	locked := make(chan error, 1)
	go func() {
		_, err := hold.Exec(ctx, "SELECT pg_advisory_lock($1)", leader.Key(f.slot))
		locked <- err
	}()
	await.True(t, 10*time.Second, "the test session waits for the leader lock", func() bool {
		var waiting bool
		f.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
		return waiting
	})
	if _, err := f.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", lockPID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the test session did not get the leader lock")
	}
	a.waitLog(t, haStartTimeout, "error", "lost the leader lock connection; fencing")
	// The promotion of a standby without the slot, as the next term sees it: the slot is gone.
	await.True(t, 30*time.Second, "the fenced walsender ends and the slot is dropped", func() bool {
		_, err := f.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.slot)
		return err == nil
	})
	t.Logf("walsender %d fenced; slot dropped", walsender)
	if _, err := hold.Exec(ctx, "SELECT pg_advisory_unlock($1)", leader.Key(f.slot)); err != nil {
		t.Fatal(err)
	}

	code, exited := a.Wait(haStartTimeout)
	var slots int
	if err := f.pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Fatalf("the next term created slot %s anew (exited: %v): events committed after its last confirmed position would be skipped\n%s", f.slot, exited, a.Output())
	}
	if !exited || code == 0 {
		t.Fatalf("the relay did not stop with an error (exited: %v, status %d)\n%s", exited, code, a.Output())
	}
	out := a.Output()
	if !strings.Contains(out, "replication slot lost: slot \""+f.slot+"\" no longer exists") || !strings.Contains(out, "forget-slot") {
		t.Fatalf("the relay did not say the slot is gone and how to recover:\n%s", out)
	}
}
