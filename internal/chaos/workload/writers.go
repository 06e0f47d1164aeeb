package workload

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// Config shapes the writers' load.
type Config struct {
	// Name prefixes the writers' names, and so their keys and transaction ids: writers of one
	// history that share topics or a checker need different names ("" is fine alone).
	Name           string
	DSN            string // multi-host, target_session_attrs=read-write, so a failover is followed
	Table          string // schema-qualified outbox table (Table, PartitionedTable): "public.outbox_events"
	Shape          Shape
	MessagesPrefix string   // the relay's messages_prefix, for Messages
	Types          []string // aggregate types, one topic each; required
	Writers        int      // concurrent writers, each owning its own aggregates; 3
	Aggregates     int      // per writer; 10
	MaxPerTx       int      // events per transaction, uniformly 1..MaxPerTx; 3
	TxPerSecond    float64  // per writer; 0 writes as fast as the server allows
	// RollbackEvery rolls back about one transaction in RollbackEvery on purpose (ROLLBACK after its
	// inserts); 0 for none.
	RollbackEvery int
	// AbortEvery aborts about one transaction in AbortEvery mid-way: a statement after some of its
	// inserts fails (a duplicate marker row), and the COMMIT that follows rolls back; 0 for none.
	AbortEvery int
	Seed       uint64
	Log        func(format string, args ...any) // nil: silent
}

// Timeouts that keep a writer from hanging on a dead server or a cut connection: a frozen or
// unreachable primary must cost a writer seconds, not the rest of the run.
const (
	connectTimeout = 3 * time.Second  // per host of the DSN
	txTimeout      = 10 * time.Second // one whole transaction, COMMIT included
	bigTxTimeout   = 2 * time.Minute  // BigTransaction
	lookupBatch    = 5000             // marker ids per query in Resolve
)

// nonASCIIPrefixes make aggregate ids (record keys) that are not ASCII.
var nonASCIIPrefixes = []string{"order", "kunde-müller", "订单", "παραγγελία", "заказ"}

// Writers write outbox transactions concurrently until stopped and record every transaction they
// attempt.
type Writers struct {
	cfg     Config
	emitter *outbox.Emitter // Messages
	// stop ends the writers' loops between transactions; abort cuts off the transactions
	// themselves, when Stop's context ends first (or StartWriters' does).
	stop, abort context.CancelCauseFunc
	done        chan struct{}
	gate        gate

	mu                             sync.Mutex
	txns                           []history.Txn
	committed, rolledBack, inDoubt int

	bigMu sync.Mutex // BigTransaction's writer is used by one call at a time
	big   *writer
}

// writer is one writer's own state: its aggregates and their next sequence numbers.
type writer struct {
	name string
	rng  *mrand.Rand
	keys []aggregate
	seq  map[string]int // last sequence number attempted, per aggregate id
	n    int            // transactions attempted
	conn *pgx.Conn
	down time.Time // when the connection was lost; zero while up
}

type aggregate struct{ typ, id string }

// StartWriters starts cfg.Writers writers, each writing its own aggregates, until Stop or ctx ends.
func StartWriters(ctx context.Context, cfg Config) *Writers {
	if len(cfg.Types) == 0 {
		panic("workload: Config.Types is empty")
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 3
	}
	if cfg.Aggregates <= 0 {
		cfg.Aggregates = 10
	}
	if cfg.MaxPerTx <= 0 {
		cfg.MaxPerTx = 3
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	w := &Writers{cfg: cfg, done: make(chan struct{})}
	w.gate.init()
	if cfg.Shape == Messages {
		em, err := outbox.NewEmitter(outbox.EmitterConfig{Prefix: cfg.MessagesPrefix})
		if err != nil {
			panic(fmt.Sprintf("workload: %v", err)) // only for an empty member name, which the defaults do not have
		}
		w.emitter = em
	}
	w.big = w.newWriter(cfg.Name+"big", cfg.Writers, cfg.Aggregates)
	hard, abort := context.WithCancelCause(ctx)
	soft, stop := context.WithCancelCause(hard)
	w.stop, w.abort = stop, abort
	var wg sync.WaitGroup
	for i := range cfg.Writers {
		wr := w.newWriter(fmt.Sprintf("%sw%d", cfg.Name, i), i, cfg.Aggregates)
		wg.Go(func() { w.run(soft, hard, wr) })
	}
	go func() { wg.Wait(); close(w.done) }()
	return w
}

func (w *Writers) newWriter(name string, index, aggregates int) *writer {
	wr := &writer{name: name, rng: mrand.New(mrand.NewPCG(w.cfg.Seed, uint64(index)+1)), seq: make(map[string]int)}
	for a := range aggregates {
		wr.keys = append(wr.keys, aggregate{
			typ: w.cfg.Types[(index+a)%len(w.cfg.Types)],
			id:  fmt.Sprintf("%s-%s-%d", nonASCIIPrefixes[a%len(nonASCIIPrefixes)], name, a),
		})
	}
	return wr
}

// Pause stops the writers after their current transaction and returns once none is writing.
func (w *Writers) Pause() { w.gate.pause() }

// Resume lets paused writers go on.
func (w *Writers) Resume() { w.gate.resume() }

// Stop stops the writers after their current transaction and waits for them. When ctx ends first,
// it cuts those transactions off (one cut off during its COMMIT is recorded in doubt, for Resolve)
// and returns an error. Stopping between transactions keeps the end of a run clean: a COMMIT cut
// off by the client may still complete on the server after Resolve has looked.
func (w *Writers) Stop(ctx context.Context) error {
	w.stop(errStopped)
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
	}
	w.abort(errStopped)
	<-w.done // every wait of a writer honours the hard context
	return fmt.Errorf("workload: writers did not stop between transactions: %w", ctx.Err())
}

// Counts returns how many transactions ended how, so far (as the writers saw it).
func (w *Writers) Counts() (committed, rolledBack, inDoubt int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.committed, w.rolledBack, w.inDoubt
}

func (w *Writers) record(t history.Txn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.txns = append(w.txns, t)
	switch t.Outcome {
	case history.Committed:
		w.committed++
	case history.RolledBack:
		w.rolledBack++
	case history.InDoubt:
		w.inDoubt++
	}
}

// run is one writer's loop: it never gives up on its own, only when ctx (soft: between
// transactions) or hard (a transaction too) ends.
func (w *Writers) run(ctx, hard context.Context, wr *writer) {
	defer wr.close()
	for ctx.Err() == nil {
		if err := w.connect(ctx, wr); err != nil {
			sleep(ctx, backoff(wr.rng))
			continue
		}
		if w.gate.enter(ctx) != nil {
			return
		}
		err := w.attempt(hard, wr, w.plan(wr, 1+wr.rng.IntN(w.cfg.MaxPerTx)), txTimeout)
		w.gate.leave()
		if err != nil {
			wr.lost(w.cfg.Log, err)
			sleep(ctx, backoff(wr.rng))
			continue
		}
		if w.cfg.TxPerSecond > 0 {
			sleep(ctx, time.Duration((0.5+wr.rng.Float64())*float64(time.Second)/w.cfg.TxPerSecond))
		}
	}
}

// connect (re)opens wr's connection to the primary the DSN leads to.
func (w *Writers) connect(ctx context.Context, wr *writer) error {
	if wr.conn != nil && !wr.conn.IsClosed() {
		return nil
	}
	conn, err := dial(ctx, w.cfg.DSN, writerApp+wr.name)
	if err != nil {
		wr.lost(w.cfg.Log, err)
		return err
	}
	wr.conn = conn
	if !wr.down.IsZero() {
		w.cfg.Log("writer %s: connected again after %s", wr.name, time.Since(wr.down).Round(time.Millisecond))
		wr.down = time.Time{}
	}
	return nil
}

// writerApp prefixes the application_name of the writers' connections, so that Resolve can wait
// for their backends to end.
const writerApp = "chaos-writer-"

func dial(ctx context.Context, dsn, app string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("workload: parse DSN: %w", err)
	}
	cc.ConnectTimeout = connectTimeout
	cc.RuntimeParams["application_name"] = app
	return pgx.ConnectConfig(ctx, cc)
}

// lost closes wr's connection after an error, so the next attempt starts on a fresh one, and logs
// the first failure of an outage.
func (wr *writer) lost(log func(string, ...any), err error) {
	if wr.down.IsZero() {
		wr.down = time.Now()
		log("writer %s: %v (retrying)", wr.name, err)
	}
	wr.close()
}

func (wr *writer) close() {
	if wr.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		wr.conn.Close(ctx)
		wr.conn = nil
	}
}

// fate is what a transaction is meant to do at its end.
type fate int

const (
	commit fate = iota
	rollback
	abort
)

type plan struct {
	txn    history.Txn
	fate   fate
	events []outbox.Event // Events' payloads, in the order written
	bulk   bool           // rows by COPY (BigTransaction)
}

// plan draws wr's next transaction of n events: ids, sequence numbers (consumed now, so a failed
// transaction leaves holes) and how it ends.
func (w *Writers) plan(wr *writer, n int) plan {
	wr.n++
	p := plan{txn: history.Txn{ID: fmt.Sprintf("%s-%d-%04x", wr.name, wr.n, wr.rng.Uint32()&0xffff), Writer: wr.name}}
	switch {
	case w.cfg.RollbackEvery > 0 && wr.rng.IntN(w.cfg.RollbackEvery) == 0:
		p.fate = rollback
	case w.cfg.AbortEvery > 0 && wr.rng.IntN(w.cfg.AbortEvery) == 0:
		p.fate = abort
	}
	for range n {
		a := wr.keys[wr.rng.IntN(len(wr.keys))]
		wr.seq[a.id]++
		id := newUUID()
		payload, _ := json.Marshal(struct {
			Aggregate string `json:"aggregate"`
			Seq       int    `json:"seq"`
			Txn       string `json:"txn"`
			Note      string `json:"note"`
		}{a.id, wr.seq[a.id], p.txn.ID, "grüße, 世界 ✓"})
		// Headers of the row (or message) the relay must carry, one of them not ASCII.
		headers := map[string]string{"chaos_txn": p.txn.ID, "chaos_note": "grüße ✓"}
		p.txn.Events = append(p.txn.Events, history.Event{ID: id, Topic: topicFor(a.typ), Key: a.id, Seq: wr.seq[a.id],
			Hash: ContentHash(payload, recordHeaders(id, "Happened", a.typ, headers))})
		p.events = append(p.events, outbox.Event{ID: id, AggregateType: a.typ, AggregateID: a.id,
			EventType: "Happened", Payload: json.RawMessage(payload), Headers: headers})
	}
	return p
}

// recordHeaders are the headers the relay gives an event's record: its id, type and aggregate
// type, then the members of its headers object (docs/operations.md, "The outbox table and its records").
func recordHeaders(id, eventType, aggregateType string, members map[string]string) []kafka.Header {
	hs := []kafka.Header{{Key: "id", Value: []byte(id)}, {Key: "event_type", Value: []byte(eventType)}, {Key: "aggregate_type", Value: []byte(aggregateType)}}
	for k, v := range members {
		hs = append(hs, kafka.Header{Key: k, Value: []byte(v)})
	}
	return hs
}

// headersJSON is an event's headers object as the headers column holds it.
func headersJSON(e outbox.Event) string {
	b, _ := json.Marshal(e.Headers) // a map of strings always encodes
	return string(b)
}

// topicFor is where the relay publishes an aggregate type's events.
func topicFor(aggregateType string) string { return "outbox.event." + aggregateType }

// attempt runs p on wr's connection and records it. The error is for the connection: non-nil
// when it must be replaced (the outcome is recorded either way).
func (w *Writers) attempt(ctx context.Context, wr *writer, p plan, timeout time.Duration) error {
	p.txn.Start = time.Now()
	tctx, cancel := context.WithTimeout(ctx, timeout)
	outcome, err := w.exec(tctx, wr.conn, p)
	if outcome == history.Committed {
		p.txn.CommitLSN = insertLSN(tctx, wr.conn)
	}
	cancel()
	p.txn.End, p.txn.Outcome = time.Now(), outcome
	w.record(p.txn)
	if err != nil {
		return fmt.Errorf("transaction %s: %w", p.txn.ID, err)
	}
	return nil
}

// exec runs one transaction and says how it ended. err is non-nil when something other than the
// planned ending went wrong.
func (w *Writers) exec(ctx context.Context, conn *pgx.Conn, p plan) (history.Outcome, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return history.RolledBack, err
	}
	// Whatever fails before COMMIT is sent leaves the transaction uncommitted; a rollback that
	// fails too is moot, the connection is replaced.
	fail := func(err error) (history.Outcome, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
		return history.RolledBack, err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+markerTable+" (id) VALUES ($1)", p.txn.ID); err != nil {
		return fail(fmt.Errorf("insert marker: %w", err))
	}
	events := p.events
	if p.fate == abort {
		events = events[:len(events)/2]
	}
	write := w.write
	if p.bulk && w.cfg.Shape == Table {
		// Not into a partitioned table: PostgreSQL buffers COPY's rows per partition and writes
		// each buffer in turn, so an aggregate spread over partitions reaches the WAL out of order.
		write = w.copyEvents
	}
	if err := write(ctx, tx, events); err != nil {
		return fail(err)
	}
	switch p.fate {
	case rollback:
		if err := tx.Rollback(ctx); err != nil {
			return history.RolledBack, fmt.Errorf("rollback: %w", err)
		}
		return history.RolledBack, nil
	case abort:
		// A duplicate marker row: the server aborts the transaction, and the COMMIT that follows
		// answers ROLLBACK, as an application that ignores a failed statement would see it.
		_, err := tx.Exec(ctx, "INSERT INTO "+markerTable+" (id) VALUES ($1)", p.txn.ID)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			return fail(fmt.Errorf("abort: want a unique violation, got %v", err))
		}
		if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
			return history.RolledBack, fmt.Errorf("commit after a failed statement: %v", err)
		}
		return history.RolledBack, nil
	}
	return commitOutcome(tx.Commit(ctx))
}

// insertLSN reads the server's WAL insert position on conn right after a COMMIT returned: at or
// after the end of that transaction's commit record, which was inserted (and flushed) before the
// COMMIT was answered, so the slot-ahead rule may compare a slot's confirmed LSN with it without a
// false alarm. 0 when the read fails (the server went away): the rule then skips the transaction.
// The connection is the one that committed, so a failover in between cannot answer from a
// timeline that lacks the transaction.
func insertLSN(ctx context.Context, conn *pgx.Conn) uint64 {
	var lsn int64
	if err := conn.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint").Scan(&lsn); err != nil || lsn <= 0 {
		return 0
	}
	return uint64(lsn)
}

// commitOutcome says what a COMMIT's error means for the transaction.
func commitOutcome(err error) (history.Outcome, error) {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return history.Committed, nil
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return history.RolledBack, err
	case errors.As(err, &pgErr) && pgErr.Severity == "ERROR":
		return history.RolledBack, err // the server refused it and the session lives on
	}
	// Sent, and the answer lost (or FATAL, which may follow a commit that happened: a terminated
	// wait for a synchronous standby, for one): only the marker row can tell. Also when the driver
	// says nothing was sent ("conn closed", safe to retry): the nemesis saw a transaction so
	// classified whose messages the relay had published (the primary killed at that moment), and
	// the marker row is the truth either way.
	return history.InDoubt, err
}

// write writes events in tx, in order.
func (w *Writers) write(ctx context.Context, tx pgx.Tx, events []outbox.Event) error {
	if len(events) == 0 {
		return nil
	}
	if w.cfg.Shape == Messages {
		if _, err := w.emitter.Emit(ctx, tx, events...); err != nil {
			return fmt.Errorf("emit %d events: %w", len(events), err)
		}
		return nil
	}
	cols := make([][]string, 6)
	for _, e := range events {
		cols[0] = append(cols[0], e.ID)
		cols[1] = append(cols[1], e.AggregateType)
		cols[2] = append(cols[2], e.AggregateID)
		cols[3] = append(cols[3], e.EventType)
		cols[4] = append(cols[4], string(e.Payload.(json.RawMessage)))
		cols[5] = append(cols[5], headersJSON(e))
	}
	// One statement; unnest keeps the arrays' order, so the rows reach the WAL in sequence order.
	_, err := tx.Exec(ctx, "INSERT INTO "+w.cfg.Table+` (id, aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT i::uuid, t, a, e, p::jsonb, h::jsonb FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS u(i, t, a, e, p, h)`,
		cols[0], cols[1], cols[2], cols[3], cols[4], cols[5])
	if err != nil {
		return fmt.Errorf("insert %d events: %w", len(events), err)
	}
	return nil
}

// BigTransaction writes one transaction of events events (COPY for rows; for Messages, the
// emitter's batches of messages in the one transaction), recorded like the others, under writer
// "big". It does not retry: the error says why it failed, the history how it ended.
func (w *Writers) BigTransaction(ctx context.Context, events int) error {
	w.bigMu.Lock()
	defer w.bigMu.Unlock()
	wr := w.big
	conn, err := dial(ctx, w.cfg.DSN, writerApp+wr.name)
	if err != nil {
		return fmt.Errorf("workload: big transaction: connect: %w", err)
	}
	wr.conn = conn
	defer wr.close()
	p := w.plan(wr, events)
	p.fate, p.bulk = commit, true
	w.cfg.Log("big transaction %s: %d events", p.txn.ID, events)
	if err := w.attempt(ctx, wr, p, bigTxTimeout); err != nil {
		return fmt.Errorf("workload: big transaction: %w", err)
	}
	return nil
}

// copyEvents is write by COPY, for BigTransaction's rows.
func (w *Writers) copyEvents(ctx context.Context, tx pgx.Tx, events []outbox.Event) error {
	rows := make([][]any, len(events))
	for i, e := range events {
		rows[i] = []any{e.ID, e.AggregateType, e.AggregateID, e.EventType, []byte(e.Payload.(json.RawMessage)), []byte(headersJSON(e))}
	}
	ident := pgx.Identifier{tableName(w.cfg.Table)}
	if s := schemaName(w.cfg.Table); s != "" {
		ident = pgx.Identifier{s, tableName(w.cfg.Table)}
	}
	if _, err := tx.CopyFrom(ctx, ident, []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"},
		pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("copy %d events: %w", len(events), err)
	}
	return nil
}

// OtherLoad writes transactions on the other table only (no events) at about txPerSecond for d,
// or until ctx ends, retrying through failures. They are not recorded.
func (w *Writers) OtherLoad(ctx context.Context, d time.Duration, txPerSecond float64) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	rng := mrand.New(mrand.NewPCG(w.cfg.Seed, uint64(time.Now().UnixNano())))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for ctx.Err() == nil {
		if conn == nil || conn.IsClosed() {
			c, err := dial(ctx, w.cfg.DSN, "chaos-other")
			if err != nil {
				sleep(ctx, backoff(rng))
				continue
			}
			conn = c
		}
		tctx, tcancel := context.WithTimeout(ctx, txTimeout)
		_, err := conn.Exec(tctx, "INSERT INTO "+otherTable+" (pad) SELECT repeat('x', 200) FROM generate_series(1, $1)", 1+rng.IntN(20))
		tcancel()
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
			sleep(ctx, backoff(rng))
			continue
		}
		if txPerSecond > 0 {
			sleep(ctx, time.Duration((0.5+rng.Float64())*float64(time.Second)/txPerSecond))
		}
	}
	if err := context.Cause(ctx); !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("workload: other load: %w", err)
	}
	return nil
}

// Resolve settles, against the final primary, every transaction recorded Committed or InDoubt by
// its marker row: present, it committed (Resolved when it was in doubt); absent, a committed one
// Vanished and one in doubt RolledBack (Resolved). It retries until ctx ends (a failover may be
// settling) and returns every transaction, ordered by Start. Call it after Stop.
func (w *Writers) Resolve(ctx context.Context) ([]history.Txn, error) {
	w.mu.Lock()
	txns := slices.Clone(w.txns)
	w.mu.Unlock()
	var ids []string
	for _, t := range txns {
		if t.Outcome == history.Committed || t.Outcome == history.InDoubt {
			ids = append(ids, t.ID)
		}
	}
	present, err := lookupMarkers(ctx, w.cfg.DSN, ids)
	if err != nil {
		return nil, err
	}
	for i := range txns {
		t := &txns[i]
		switch {
		case t.Outcome == history.InDoubt && present[t.ID]:
			t.Outcome, t.Resolved = history.Committed, true
		case t.Outcome == history.InDoubt:
			t.Outcome, t.Resolved = history.RolledBack, true
		case t.Outcome == history.Committed && !present[t.ID]:
			t.Outcome = history.Vanished
		}
	}
	slices.SortStableFunc(txns, func(a, b history.Txn) int { return a.Start.Compare(b.Start) })
	w.mu.Lock()
	w.txns = slices.Clone(txns)
	w.committed, w.rolledBack, w.inDoubt = 0, 0, 0
	for _, t := range txns {
		switch t.Outcome {
		case history.Committed:
			w.committed++
		case history.RolledBack:
			w.rolledBack++
		}
	}
	w.mu.Unlock()
	return txns, nil
}

// Unresolved returns every transaction as the writers recorded it, ordered by Start, unsettled:
// for a run whose Resolve failed, which the checker then reports as not carried out.
func (w *Writers) Unresolved() []history.Txn {
	w.mu.Lock()
	txns := slices.Clone(w.txns)
	w.mu.Unlock()
	slices.SortStableFunc(txns, func(a, b history.Txn) int { return a.Start.Compare(b.Start) })
	return txns
}

// lookupMarkers returns which of ids have a marker row, retrying through failures until ctx ends.
func lookupMarkers(ctx context.Context, dsn string, ids []string) (map[string]bool, error) {
	rng := mrand.New(mrand.NewPCG(uint64(len(ids)), 7))
	var lastErr error
	for {
		present, err := tryLookup(ctx, dsn, ids)
		if err == nil {
			return present, nil
		}
		lastErr = err
		if sleep(ctx, backoff(rng)) != nil {
			return nil, fmt.Errorf("workload: resolve %d transactions: %w (last error: %v)", len(ids), ctx.Err(), lastErr)
		}
	}
}

func tryLookup(ctx context.Context, dsn string, ids []string) (map[string]bool, error) {
	conn, err := dial(ctx, dsn, "chaos-resolve")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := waitForWriterBackends(ctx, conn); err != nil {
		return nil, err
	}
	present := make(map[string]bool, len(ids))
	for batch := range slices.Chunk(ids, lookupBatch) {
		qctx, cancel := context.WithTimeout(ctx, txTimeout)
		rows, err := conn.Query(qctx, "SELECT id FROM "+markerTable+" WHERE id = ANY($1)", batch)
		if err == nil {
			var found []string
			found, err = pgx.CollectRows(rows, pgx.RowTo[string])
			for _, id := range found {
				present[id] = true
			}
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("look up markers: %w", err)
		}
	}
	return present, nil
}

// backendsGrace bounds how long Resolve waits for the writers' last backends to end.
const backendsGrace = 30 * time.Second

// waitForWriterBackends waits until no backend of a writer is left on the server, at most
// backendsGrace: a backend whose client gave up during COMMIT may still be committing, and the
// marker row must be looked up after it is done. One still there after that (waiting for a
// synchronous standby that is gone, say) leaves its transaction as the lookup finds it.
func waitForWriterBackends(ctx context.Context, conn *pgx.Conn) error {
	for deadline := time.Now().Add(backendsGrace); time.Now().Before(deadline); {
		var n int
		qctx, cancel := context.WithTimeout(ctx, txTimeout)
		err := conn.QueryRow(qctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE $1`, writerApp+"%").Scan(&n)
		cancel()
		if err != nil {
			return fmt.Errorf("wait for the writers' backends: %w", err)
		}
		if n == 0 {
			return nil
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// backoff is the pause before a retry: short, so a writer is back soon after a fault heals, and
// jittered, so writers do not retry in step.
func backoff(rng *mrand.Rand) time.Duration {
	return 100*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond)))
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newUUID returns a random (version 4) UUID in PostgreSQL's text form: the event id, known before
// the commit.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// gate lets Pause wait until no writer is inside a transaction, and holds them until Resume.
type gate struct {
	mu      sync.Mutex
	paused  bool
	active  int
	changed chan struct{} // closed and replaced on every change
}

func (g *gate) init() { g.changed = make(chan struct{}) }

func (g *gate) broadcast() {
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *gate) enter(ctx context.Context) error {
	for {
		g.mu.Lock()
		if !g.paused {
			g.active++
			g.mu.Unlock()
			return nil
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active--
	g.broadcast()
}

func (g *gate) pause() {
	g.mu.Lock()
	g.paused = true
	g.broadcast()
	for g.active > 0 {
		ch := g.changed
		g.mu.Unlock()
		<-ch // every transaction ends within txTimeout
		g.mu.Lock()
	}
	g.mu.Unlock()
}

func (g *gate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.paused = false
	g.broadcast()
}
