// Package faults breaks the relay's environment on purpose and checks the guarantees in
// docs/guarantees.md: nothing lost, per-aggregate order kept, duplicates within the window, memory
// bounded, the slot confirmed only behind Kafka's acknowledgements, and loud failures.
//
// The relay runs as a real process (internal/relayproc) so it can be SIGKILLed; PostgreSQL and
// Kafka are real (internal/testenv); scenarios that stop, pause or cut off a service get their own
// instance of it.
package faults

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// db is one test's database: the outbox table, its own slot and publication, and aggregate types
// (topics) no other test uses.
type db struct {
	t      *testing.T
	pg     *devenv.Postgres
	major  int // the server's major version
	dsn    string
	slot   string
	types  []string
	outbox *harness.Outbox
	args   []string // relay flags the database's outbox shape needs
}

// markerSuffix names the slot and publication through which, on PostgreSQL 14 (no
// pg_walinspect), writeMarked finds a transaction's commit record.
const markerSuffix = "_marker"

func newDB(t *testing.T, pg *devenv.Postgres, nTypes int) *db {
	t.Helper()
	return newDBOf(t, pg, nTypes, 0)
}

// newMessagesDB is newDB for the table-free outbox: every event a transactional logical decoding
// message (every 1: outbox_shape messages, and the database has no outbox table), or every
// every-th event one, the others rows in the same transactions (outbox_shape both).
func newMessagesDB(t *testing.T, pg *devenv.Postgres, nTypes, every int) *db {
	t.Helper()
	return newDBOf(t, pg, nTypes, every)
}

func newDBOf(t *testing.T, pg *devenv.Postgres, nTypes, every int) *db {
	t.Helper()
	ctx := context.Background()
	var dsn string
	if every == 1 {
		dsn = testenv.MessagesDatabase(t, pg)
	} else {
		dsn = testenv.OutboxDatabase(t, pg)
	}
	ob, err := harness.NewOutbox(ctx, dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ob.Close)
	d := &db{t: t, pg: pg, dsn: dsn, slot: testenv.UniqueName(t, "slot"), outbox: ob}
	if err := ob.Pool().QueryRow(ctx, "SELECT current_setting('server_version_num')::int / 10000").Scan(&d.major); err != nil {
		t.Fatal(err)
	}
	// writeMarked finds the exact LSNs of a transaction's commit record: with pg_walinspect from
	// PostgreSQL 15 on; on 14 from the Commit message of a pgoutput slot of the test's own.
	setup := []string{"CREATE EXTENSION IF NOT EXISTS pg_walinspect"}
	if d.major < 15 {
		setup = []string{"CREATE PUBLICATION " + d.slot + markerSuffix + " FOR TABLE outbox_events",
			"SELECT pg_create_logical_replication_slot('" + d.slot + markerSuffix + "', 'pgoutput')"}
	}
	for _, sql := range setup {
		if _, err := ob.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	for i := range nTypes {
		d.types = append(d.types, testenv.UniqueName(t, fmt.Sprintf("agg%d", i)))
	}
	if every > 0 {
		prefix := "outbox." + d.slot // the database's own: nothing else's messages count
		ob.UseMessages(prefix, every)
		source := "both"
		if every == 1 {
			source = "messages"
		}
		d.args = []string{"--outbox-shape=" + source, "--messages-prefix=" + prefix}
	}
	return d
}

// relay is one outbox-relay process with its metrics endpoint.
type relay struct {
	*relayproc.Proc
	t       *testing.T
	metrics string // host:port
}

// startRelay runs `outbox-relay run` on d's slot against brokers; args add or override flags.
// The relay is built without the race detector: this suite proves delivery under faults, and
// measures memory (which the detector's shadow memory would swell); races are the business of the
// -race tests of the packages, in process, and of cmd/outbox-relay's relays, whose output
// relayproc checks for race reports. A race-built relay costs this suite a fifth of its CPU.
func (d *db) startRelay(brokers string, args ...string) *relay {
	d.t.Helper()
	addr := freeAddr(d.t)
	all := append([]string{"--slot=" + d.slot, "--publication=" + d.slot, "--metrics-addr=" + addr,
		"--slot-busy-wait=60s", "--shutdown-timeout=10s"}, d.args...)
	p := relayproc.Start(d.t, relayproc.Options{
		Args:  append(all, args...),
		Env:   map[string]string{"OUTBOX_PG_DSN": d.dsn, "OUTBOX_KAFKA_BROKERS": brokers},
		Plain: true,
	})
	if os.Getenv("OUTBOX_FAULTS_RELAY_LOG") != "" {
		// For investigating a passing run; relayproc prints the output of failed tests anyway.
		d.t.Cleanup(func() { d.t.Logf("relay (pid %d) output:\n%s", p.PID(), p.Output()) })
	}
	return &relay{Proc: p, t: d.t, metrics: addr}
}

// waitSessions waits until the relay has logged n streaming sessions (one per (re)connection).
func (r *relay) waitSessions(n int, timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if r.sessions() >= n {
			return
		}
		if r.Exited() {
			r.t.Fatalf("relay exited while waiting for streaming session %d", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("relay did not reach streaming session %d within %s", n, timeout)
}

func (r *relay) sessions() int { return strings.Count(r.Output(), `"msg":"streaming"`) }

// waitLog waits until the output after offset contains substr; it returns how long that took.
func (r *relay) waitLog(offset int, substr string, timeout time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < timeout {
		if out := r.Output(); len(out) > offset && strings.Contains(out[offset:], substr) {
			return time.Since(start), true
		}
		if r.Exited() {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	out := r.Output()
	return time.Since(start), len(out) > offset && strings.Contains(out[offset:], substr)
}

// metric returns the sum of every series of an outbox_relay_* metric whose labels contain match
// (e.g. `reason="invalid_topic"`; empty for all).
func (r *relay) metric(name, match string) (float64, error) {
	client := http.Client{Timeout: 5 * time.Second}
	res, err := client.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	full := "outbox_relay_" + name
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, full) {
			continue
		}
		// Label values may hold spaces; the value is the last field (no timestamps here).
		i := strings.LastIndexByte(line, ' ')
		series, value, ok := line[:max(i, 0)], line[i+1:], i > 0
		if !ok || (series != full && !strings.HasPrefix(series, full+"{")) || !strings.Contains(series, match) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, nil // a vector with no series yet
	}
	return sum, sc.Err()
}

// mustMetric is metric for test goroutines.
func (r *relay) mustMetric(name, match string) float64 {
	r.t.Helper()
	v, err := r.metric(name, match)
	if err != nil {
		r.t.Fatalf("scrape %s: %v", name, err)
	}
	return v
}

// deliver reads every topic the written events route to until none is missing (or timeout), then
// for linger more to catch late duplicates, and fails the test on loss, reordering or alteration.
// The relays' counters are logged on failure, to tell a relay that did not publish from a consumer
// that could not read.
func deliver(t *testing.T, brokers string, written []harness.Written, timeout time.Duration, relays ...*relay) harness.Report {
	t.Helper()
	c := harness.NewConsumer(brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := c.ReadUntil(ctx, 2*time.Second, func(recs []harness.Record) bool {
		return len(recs) >= len(written) && harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() {
		again, why := harness.Recheck(written, brokers, rep)
		if again.OK() {
			t.Log(why)
			return again
		}
		t.Log(why)
		for _, r := range relays {
			published, perr := r.metric("events_published_total", "")
			inFlight, ierr := r.metric("in_flight_events", "")
			t.Logf("relay pid %d: events_published_total %v (%v), in_flight_events %v (%v), exited %v",
				r.PID(), published, perr, inFlight, ierr, r.Exited())
		}
		t.Fatalf("delivery check failed (read error: %v): %s", err, rep)
	}
	return rep
}

func confirmedLSN(t *testing.T, q pgxQuerier, slot string) uint64 {
	t.Helper()
	lsn, err := harness.ConfirmedFlushLSN(context.Background(), q, slot)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

func currentLSN(t *testing.T, q pgxQuerier) uint64 {
	t.Helper()
	lsn, err := harness.CurrentLSN(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

type pgxQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// marked is a transaction whose commit record the test located exactly.
type marked struct {
	IDs         []string
	CommitStart uint64 // LSN where the commit record starts: the furthest a confirmation may go while it is unacknowledged
	CommitEnd   uint64 // its end: confirming this or beyond means the transaction is done
}

// writeMarked writes specs in one transaction and finds its commit record in the WAL, so a test
// can say exactly whether the slot was confirmed past it.
func (d *db) writeMarked(specs ...harness.Spec) marked {
	d.t.Helper()
	return d.writeMarkedWith(func(ctx context.Context, tx pgx.Tx) (func(), error) {
		return d.outbox.WriteIn(ctx, tx, specs...)
	})
}

// writeMarkedWith is writeMarked for a transaction that write makes (record, when not nil, runs
// after the commit). IDs are the outbox rows' ids (none for messages).
func (d *db) writeMarkedWith(write func(ctx context.Context, tx pgx.Tx) (record func(), err error)) marked {
	d.t.Helper()
	ctx := context.Background()
	pool := d.outbox.Pool()
	tx, err := pool.Begin(ctx)
	if err != nil {
		d.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	record, err := write(ctx, tx)
	if err != nil {
		d.t.Fatal(err)
	}
	var xid, from uint64
	var m marked
	err = tx.QueryRow(ctx, `SELECT (pg_current_xact_id()::text::bigint % 4294967296), (pg_current_wal_insert_lsn() - '0/0')::bigint`).
		Scan(&xid, &from)
	if err != nil {
		d.t.Fatal(err)
	}
	var table bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass('outbox_events') IS NOT NULL").Scan(&table); err != nil {
		d.t.Fatal(err)
	}
	if table {
		err = tx.QueryRow(ctx, `SELECT array_agg(id::text) FROM outbox_events WHERE xmin::text = $1`, strconv.FormatUint(xid, 10)).Scan(&m.IDs)
		if err != nil {
			d.t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		d.t.Fatal(err)
	}
	if record != nil {
		record()
	}
	if d.major < 15 {
		m.CommitStart, m.CommitEnd = d.commitFromSlot(xid)
		return m
	}
	err = pool.QueryRow(ctx, `SELECT (start_lsn - '0/0')::bigint, (end_lsn - '0/0')::bigint
		FROM pg_get_wal_records_info('0/0'::pg_lsn + $1::numeric, pg_current_wal_flush_lsn())
		WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' AND xid::text = $2`,
		from, strconv.FormatUint(xid, 10)).Scan(&m.CommitStart, &m.CommitEnd)
	if err != nil {
		d.t.Fatalf("locate the commit record of xid %d: %v", xid, err)
	}
	return m
}

// commitFromSlot returns where the commit record of transaction xid starts and ends, as the
// Begin and Commit messages of the marker slot's pgoutput stream say (PostgreSQL 14, which has no
// pg_walinspect): the same two positions, from PostgreSQL's decoding rather than its WAL reader.
// Reading consumes the marker slot up to the current WAL position.
func (d *db) commitFromSlot(xid uint64) (start, end uint64) {
	d.t.Helper()
	rows, err := d.outbox.Pool().Query(context.Background(), `SELECT data FROM pg_logical_slot_get_binary_changes($1, pg_current_wal_flush_lsn(), NULL,
		'proto_version', '1', 'publication_names', $2)`, d.slot+markerSuffix, d.slot+markerSuffix)
	if err != nil {
		d.t.Fatalf("read the marker slot: %v", err)
	}
	defer rows.Close()
	inTx := false
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			d.t.Fatal(err)
		}
		msg, err := pglogrepl.Parse(data)
		if err != nil {
			d.t.Fatalf("marker slot: %v", err)
		}
		switch msg := msg.(type) {
		case *pglogrepl.BeginMessage:
			inTx = uint64(msg.Xid) == xid
		case *pglogrepl.CommitMessage:
			if inTx {
				return uint64(msg.CommitLSN), uint64(msg.TransactionEndLSN)
			}
		}
	}
	if err := rows.Err(); err != nil {
		d.t.Fatalf("read the marker slot: %v", err)
	}
	d.t.Fatalf("the marker slot has no commit of xid %d", xid)
	return 0, 0
}

// freeAddr returns a 127.0.0.1 address with a port nobody listens on right now.
func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := devenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// sampler calls f every period in the background until stopped.
type sampler struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func sample(period time.Duration, f func(time.Time)) *sampler {
	s := &sampler{stop: make(chan struct{})}
	s.wg.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			f(time.Now())
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	})
	return s
}

// Stop stops the sampling and waits for the last call of f; it may be called more than once.
func (s *sampler) Stop() {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// ackLog samples a relay's events_published_total, to tell how many acknowledgements came in a
// window before a fault.
type ackLog struct {
	r      *relay
	s      *sampler
	mu     sync.Mutex
	points []ackPoint
}

type ackPoint struct {
	at        time.Time
	published float64
}

// logAcks samples r every period until Stop.
func logAcks(r *relay, period time.Duration) *ackLog {
	l := &ackLog{r: r}
	l.s = sample(period, l.take)
	return l
}

func (l *ackLog) take(now time.Time) {
	if v, err := l.r.metric("events_published_total", ""); err == nil {
		l.mu.Lock()
		l.points = append(l.points, ackPoint{now, v})
		l.mu.Unlock()
	}
}

// Stop ends the sampling with one more sample; it may be called more than once.
func (l *ackLog) Stop() {
	l.s.Stop()
	l.take(time.Now())
}

// Since returns the acknowledgements between the last sample taken before from and the last
// sample (all of them when no sample is that old).
func (l *ackLog) Since(from time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.points) == 0 {
		return 0
	}
	before := 0.0
	for _, p := range l.points {
		if p.at.Before(from) {
			before = p.published
		}
	}
	return int(l.points[len(l.points)-1].published - before)
}

func lsnString(v uint64) string { return fmt.Sprintf("%X/%X", v>>32, uint32(v)) }
