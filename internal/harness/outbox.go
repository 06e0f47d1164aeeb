// Package harness drives the relay from outside for integration, fault and benchmark tests: it
// writes outbox events with a per-aggregate sequence number in the payload, reads every topic back
// with a Kafka consumer, and reports what is missing, duplicated, reordered or altered.
package harness

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Spec describes one event to write; Outbox fills in the id, the sequence and the payload.
type Spec struct {
	AggregateType string
	AggregateID   string
	EventType     string
	PadBytes      int               // extra payload bytes, to make large events
	Headers       map[string]string // the headers column; nil for NULL
}

// Written is an event whose transaction committed, as the relay should publish it.
type Written struct {
	ID            string
	AggregateType string
	AggregateID   string
	EventType     string
	Seq           int
	Payload       string // the jsonb as PostgreSQL stores and outputs it
	Headers       map[string]string
}

// Outbox writes events into an outbox table, or as transactional logical decoding messages
// (UseMessages), and remembers the committed ones.
type Outbox struct {
	pool  *pgxpool.Pool
	table string
	// emitter writes messages; every says which events are messages: every one (1), every n-th
	// (the others rows, in the same transactions), or none (0). written counts events prepared.
	emitter  *outbox.Emitter
	every    int
	prepared int

	mu      sync.Mutex
	seq     map[string]int // next sequence number per aggregate type/id
	written []Written
	byID    map[string]int
	// uncertain holds transactions whose commit outcome could not be checked yet (the server was
	// down); ResolveUncertain settles them.
	uncertain [][]pending
}

// NewOutbox connects to dsn; table is the schema-qualified outbox table.
func NewOutbox(ctx context.Context, dsn, table string) (*Outbox, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return &Outbox{pool: pool, table: table, seq: make(map[string]int), byID: make(map[string]int)}, nil
}

// UseMessages makes o write events as transactional logical decoding messages with prefix (with
// outbox.Emit, the default member names) instead of table rows: every event when every is 1, or
// every every-th event, the others staying rows in the same transactions, interleaved in the order
// of the specs (mixed). Call it before writing.
func (o *Outbox) UseMessages(prefix string, every int) {
	em, err := outbox.NewEmitter(outbox.EmitterConfig{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.emitter, o.every = em, every
}

// Close releases the connections.
func (o *Outbox) Close() { o.pool.Close() }

// Pool is the connection pool, for tests that write other tables.
func (o *Outbox) Pool() *pgxpool.Pool { return o.pool }

type pending struct {
	w        Written
	payload  []byte
	headers  []byte
	sequence string
	message  bool   // written as a logical decoding message, not a row
	xid      string // the transaction's id, kept on the first event of a batch without rows
}

// WriteTx writes specs in one transaction. Events count as written only once the commit is known
// to have succeeded; when the outcome is unknown (the connection broke during COMMIT), the ids are
// looked up afterwards, so a test never expects an event that was not committed or misses one that was.
func (o *Outbox) WriteTx(ctx context.Context, specs ...Spec) error {
	batch := o.prepare(specs)
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		return o.insert(ctx, tx, batch)
	})
	if err == nil {
		o.record(batch)
		return nil
	}
	committed, lookErr := o.reconcile(ctx, batch)
	switch {
	case lookErr == nil && committed:
		o.record(batch)
		return nil
	case lookErr != nil:
		o.keepUncertain(batch)
	}
	return err
}

// WriteIn inserts specs inside a transaction the caller controls (for tests that mix other writes or
// roll back); call Committed after the caller's commit succeeds.
func (o *Outbox) WriteIn(ctx context.Context, tx pgx.Tx, specs ...Spec) (commit func(), err error) {
	batch := o.prepare(specs)
	if err := o.insert(ctx, tx, batch); err != nil {
		return nil, err
	}
	return func() { o.record(batch) }, nil
}

func (o *Outbox) prepare(specs []Spec) []pending {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]pending, len(specs))
	for i, s := range specs {
		agg := s.AggregateType + "/" + s.AggregateID
		o.seq[agg]++
		w := Written{
			ID: newUUID(), AggregateType: s.AggregateType, AggregateID: s.AggregateID,
			EventType: s.EventType, Seq: o.seq[agg], Headers: s.Headers,
		}
		if w.EventType == "" {
			w.EventType = "Happened"
		}
		payload, _ := json.Marshal(map[string]any{
			"aggregate": s.AggregateID, "seq": w.Seq, "note": "grüße, 世界 ✓", "pad": strings.Repeat("x", s.PadBytes),
		})
		var hdr []byte
		if s.Headers != nil {
			hdr, _ = json.Marshal(s.Headers)
		}
		out[i] = pending{w: w, payload: payload, headers: hdr}
		if o.every > 0 && o.prepared%o.every == 0 {
			// The relay publishes a message's payload member exactly as written.
			out[i].message, out[i].w.Payload = true, string(payload)
		}
		o.prepared++
	}
	return out
}

func (o *Outbox) insert(ctx context.Context, tx pgx.Tx, batch []pending) error {
	sql := fmt.Sprintf(`INSERT INTO %s (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb) RETURNING payload::text`, o.table)
	rows := false
	for _, p := range batch {
		rows = rows || !p.message
	}
	if !rows && len(batch) > 0 {
		// Nothing to look up by id afterwards: an uncertain commit is settled by the transaction's
		// status instead (reconcile).
		if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&batch[0].xid); err != nil {
			return fmt.Errorf("read the transaction id: %w", err)
		}
	}
	for i := 0; i < len(batch); i++ {
		p := &batch[i]
		if p.message {
			// A run of messages goes in one statement, in order.
			var events []outbox.Event
			for j := i; j < len(batch) && batch[j].message; j++ {
				q := &batch[j]
				events = append(events, outbox.Event{ID: q.w.ID, AggregateType: q.w.AggregateType, AggregateID: q.w.AggregateID,
					EventType: q.w.EventType, Payload: json.RawMessage(q.payload), Headers: q.w.Headers})
			}
			if _, err := o.emitter.Emit(ctx, tx, events...); err != nil {
				return fmt.Errorf("emit events from %s: %w", p.w.ID, err)
			}
			i += len(events) - 1
			continue
		}
		var hdr any
		if p.headers != nil {
			hdr = string(p.headers)
		}
		if err := tx.QueryRow(ctx, sql, p.w.ID, p.w.AggregateType, p.w.AggregateID, p.w.EventType,
			string(p.payload), hdr).Scan(&p.w.Payload); err != nil {
			return fmt.Errorf("insert event %s: %w", p.w.ID, err)
		}
	}
	return nil
}

func (o *Outbox) reconcile(ctx context.Context, batch []pending) (bool, error) {
	if len(batch) == 0 {
		return false, nil
	}
	// A row of the batch, if it has one, tells whether it committed.
	row := -1
	for i := range batch {
		if !batch[i].message {
			row = i
			break
		}
	}
	if row < 0 {
		return o.committed(ctx, batch[0].xid)
	}
	var n int
	err := o.pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = $1", o.table), batch[row].w.ID).Scan(&n)
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, nil
	}
	// The commit happened; the RETURNING values were lost with the connection, so read them back.
	for i := range batch {
		if batch[i].message {
			continue
		}
		if err := o.pool.QueryRow(ctx, fmt.Sprintf("SELECT payload::text FROM %s WHERE id = $1", o.table),
			batch[i].w.ID).Scan(&batch[i].w.Payload); err != nil {
			return false, err
		}
	}
	return true, nil
}

// committed reports whether the transaction xid committed (pg_xact_status); a transaction whose id
// was never read (the failure came first) never wrote anything.
func (o *Outbox) committed(ctx context.Context, xid string) (bool, error) {
	if xid == "" {
		return false, nil
	}
	var status *string
	if err := o.pool.QueryRow(ctx, "SELECT pg_xact_status($1::xid8)", xid).Scan(&status); err != nil {
		return false, err
	}
	switch {
	case status == nil:
		return false, fmt.Errorf("transaction %s is too old for pg_xact_status", xid)
	case *status == "committed":
		return true, nil
	case *status == "aborted":
		return false, nil
	}
	return false, fmt.Errorf("transaction %s is still %s", xid, *status)
}

func (o *Outbox) record(batch []pending) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range batch {
		o.byID[p.w.ID] = len(o.written)
		o.written = append(o.written, p.w)
	}
}

// Written returns the committed events in commit order.
func (o *Outbox) Written() []Written {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Written(nil), o.written...)
}

// newUUID returns a random (version 4) UUID in PostgreSQL's text form, so ids are known before the
// commit and an uncertain commit can be checked.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ConfirmedFlushLSN reads the slot's confirmed_flush_lsn as a number.
func ConfirmedFlushLSN(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, slot string) (uint64, error) {
	var lsn *uint64
	err := q.QueryRow(ctx, "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && lsn == nil) {
		return 0, fmt.Errorf("slot %q not found", slot)
	}
	if err != nil {
		return 0, err
	}
	return *lsn, nil
}

// CurrentLSN reads pg_current_wal_lsn() as a number.
func CurrentLSN(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (uint64, error) {
	var lsn uint64
	err := q.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::bigint").Scan(&lsn)
	return lsn, err
}
