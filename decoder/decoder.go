// Package decoder turns pgoutput (protocol version 1) messages into outbox events.
//
// Columns are found by name in each Relation message, so their order and any extra columns in the
// table do not matter, and a schema change is judged by the columns the stream carries at that
// point (not by today's catalog). Only INSERTs into the outbox become events; other operations
// (UPDATE, DELETE, TRUNCATE) are skipped, which also makes the insert-then-delete pattern work.
// Transactional logical decoding messages with a configured prefix are events too (the table-free
// outbox, message.go), alongside the table's rows or instead of them.
//
// A relation named like the outbox is the outbox. Any other relation in the stream may still be
// part of it (a leaf partition of a partitioned outbox, named by pgoutput for WAL written while the
// publication did not publish via the partition root), so the decoder never decides that alone:
// it returns a Relation change and the caller, who can ask the database, answers with Classify
// before decoding on. Column values are slices of the message buffer: the caller must hand Decode
// a buffer it owns and never reuses.
package decoder

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
)

// Columns names the outbox table's columns. Headers and AggregateVersion are optional: leave them
// empty when the table has no such column. Timestamp and TracingSpanContext are optional too, and
// required once named.
type Columns struct {
	ID            string
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       string
	Headers       string
	// AggregateVersion is the aggregate's version the event leads to (a bigint), which the sink
	// sends as the aggregate_version header so consumers can tell a missed or stale event.
	AggregateVersion string
	// Timestamp is a timestamp or timestamptz column whose value becomes Event.Time (Debezium's
	// table.field.event.timestamp).
	Timestamp string
	// TracingSpanContext is a column holding the producer's trace context (Debezium's
	// tracingspancontext: Java Properties text with traceparent and tracestate): Event.SpanContext.
	TracingSpanContext string
}

// DefaultColumns matches the table `outbox-relay migrate` creates.
func DefaultColumns() Columns {
	return Columns{
		ID:            "id",
		AggregateType: "aggregate_type",
		AggregateID:   "aggregate_id",
		EventType:     "event_type",
		Payload:       "payload",
		Headers:       "headers",
	}
}

// Config says which relation is the outbox and how to read it.
type Config struct {
	Schema  string // default "public"
	Table   string
	Columns Columns
	// Extra lists further columns whose values travel with the event (as Kafka headers), in order.
	Extra []string
	// MessagePrefix, when set, makes every transactional logical decoding message with this prefix
	// an outbox event too (the table-free outbox, message.go); its content's members are named like
	// the columns. Messages need the stream's pgoutput messages option.
	MessagePrefix string
	// NoTable: messages are the only outbox; no relation is the outbox table, so rows of every
	// table are skipped without asking the caller to classify them.
	NoTable bool
	// PayloadBase64: a message's payload member is a base64 string of the payload bytes, not JSON.
	PayloadBase64 bool
}

// TxInfo identifies the transaction an event belongs to.
type TxInfo struct {
	Xid        uint32
	CommitLSN  pglogrepl.LSN // LSN of the commit record ("final LSN" in Begin)
	CommitTime time.Time
	// SystemID and Timeline say which WAL history CommitLSN belongs to (the server's system
	// identifier and timeline, IDENTIFY_SYSTEM): an LSN names another transaction on another
	// timeline. pgoutput does not carry them; the decoder stamps what SetOrigin last gave it
	// ("" and 0 when unknown), so exactly-once positions record their origin.
	SystemID string
	Timeline uint32
}

// Event is one outbox row. Byte slices alias the message buffer given to Decode. A nil slice is a
// NULL column; an empty non-nil slice is an empty value.
type Event struct {
	ID            []byte
	AggregateType []byte
	AggregateID   []byte
	EventType     []byte
	Payload       []byte
	Headers       []byte // the headers column as JSON text, or nil
	// AggregateVersion is the Columns.AggregateVersion value in text form (decimal), or nil when
	// the column is not configured or NULL.
	AggregateVersion []byte
	Extra            [][]byte // values of Config.Extra, in the same order
	LSN              pglogrepl.LSN
	Tx               TxInfo
	// Index is the event's ordinal among the events of its transaction (0 for the first), counting
	// every event the decoder produced, usable or not. pgoutput replays a transaction's changes in
	// the same order, so (Tx.CommitLSN, Index) names one event across restarts: exactly-once
	// delivery records how far it got inside a transaction with it.
	Index int
	// Time is the event's own timestamp, from Columns.Timestamp; zero when none is configured or
	// the value is NULL (the sink then uses the commit time).
	Time time.Time
	// SpanContext is the Columns.TracingSpanContext value as written (Java Properties text, or a
	// JSON object in a message), or nil.
	SpanContext []byte
	// ExtraKinds says, for each Extra value, what JSON value it is when written into a record's
	// envelope (a number, a boolean, JSON, or else a string); nil means strings. Shared by the
	// events of one relation: read only.
	ExtraKinds []ValueKind
	// RawSize is the memory the event keeps alive for as long as it is held: the whole message
	// buffer its fields alias (every column of the row, mapped or not), plus any value the decoder
	// had to copy out of it (a bytea payload decoded from hex). It is what a holder of the event,
	// such as the sink's in-flight window, must count; the record built from it may be far smaller.
	RawSize int64
}

// Kind says what a decoded message means for the relay.
type Kind uint8

const (
	Skip  Kind = iota // nothing to do: another table, another operation, metadata
	Begin             // a transaction starts; Tx is set
	// Insert is an outbox event, Event is set: a row inserted into the outbox table, or a
	// transactional logical decoding message with the outbox prefix (Config.MessagePrefix). Both
	// are events of their transaction in stream order, numbered by one Event.Index counter.
	Insert
	Commit  // the transaction ends; Tx and EndLSN are set
	Message // a non-transactional logical decoding message at LSN (e.g. a heartbeat)
	// Relation is a Relation message; Relation is set. When Relation.Named is false, the caller
	// must call Classify for its OID before the next Decode.
	Relation
	// Update is an UPDATE of an outbox relation (never an event: the outbox is append-only); Tx
	// and LSN are set, Prefix names the relation. Only a publication that publishes UPDATEs sends it.
	Update
)

// ValueKind is the JSON kind of a column's text value (Event.ExtraKinds).
type ValueKind uint8

const (
	KindString ValueKind = iota // a JSON string of the text
	KindNumber                  // the text is a JSON number (integer and floating-point types)
	KindBool                    // "t" or "f" (boolean); in a message, true or false
	KindJSON                    // the text is JSON already (a message member that is not a string)
)

func (k Kind) String() string {
	switch k {
	case Skip:
		return "skip"
	case Begin:
		return "begin"
	case Insert:
		return "insert"
	case Commit:
		return "commit"
	case Message:
		return "message"
	case Relation:
		return "relation"
	case Update:
		return "update"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Change is the result of decoding one message.
type Change struct {
	Kind   Kind
	Tx     TxInfo
	EndLSN pglogrepl.LSN // Commit: the transaction end LSN, the position to confirm
	Event  *Event        // Insert
	// Unusable is set on an Insert into an outbox relation that lacks a mapped column (at that
	// point of the stream), or on an outbox message whose content is not an event (it wraps
	// ErrInvalidMessage): Event holds what could be read, and the event belongs to the failure
	// policy, not to its topic.
	Unusable error
	LSN      pglogrepl.LSN // Message
	Prefix   string        // Message
	Relation *RelationInfo // Relation
}

// RelationInfo describes a Relation message.
type RelationInfo struct {
	OID           uint32
	Schema, Table string
	Columns       []string
	// Named is true when schema and table are the outbox's: the relation is the outbox, and
	// Unusable says whether its rows can be read. Otherwise the caller must Classify it.
	Named    bool
	Unusable error
}

// Decoder keeps the state a pgoutput stream needs: the relation cache and the open transaction.
// It is not safe for concurrent use.
type Decoder struct {
	cfg       Config
	relations map[uint32]*relation
	tx        TxInfo
	inTx      bool
	origin    TxInfo   // SystemID and Timeline only: SetOrigin
	events    int      // events of the open transaction so far: the next Event.Index
	cols      []column // scratch for TupleData
	names     []string // message member names by slot (memberNames)
}

// relation is what the decoder remembers of a Relation message.
type relation struct {
	name   string // schema.table, for messages
	outbox bool
	// unclassified: not named like the outbox, and Classify has not been called yet.
	unclassified bool
	names        []string
	types        []uint32
	// unusable says why rows of this outbox relation cannot be read (a mapped column is missing).
	unusable error
	// index of each mapped column in the tuple; -1 when not configured (the optional ones)
	id, aggType, aggID, evType, payload, headers, aggVersion int
	timestamp, spanContext                                   int
	extra                                                    []int
	extraKinds                                               []ValueKind
	payloadBytea                                             bool
	timestampTZ                                              bool // the timestamp column is timestamptz, not timestamp
}

// New returns a decoder for cfg.
func New(cfg Config) *Decoder {
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	return &Decoder{cfg: cfg, relations: make(map[uint32]*relation)}
}

// Reset forgets the open transaction, for a new replication session: the server replays any
// transaction that was cut off from its Begin. The relation cache is dropped too because the
// server resends Relation messages in every session.
func (d *Decoder) Reset() {
	d.inTx = false
	d.tx = TxInfo{}
	clear(d.relations)
}

// SetOrigin sets the server (system identifier, timeline) that the transactions begun from now on
// come from: a replication session's, given at its start.
func (d *Decoder) SetOrigin(systemID string, timeline uint32) {
	d.origin = TxInfo{SystemID: systemID, Timeline: timeline}
}

// InTransaction reports whether a Begin has been seen without its Commit.
func (d *Decoder) InTransaction() bool { return d.inTx }

// pgoutput message types (first byte).
const (
	msgBegin    = 'B'
	msgCommit   = 'C'
	msgOrigin   = 'O'
	msgRelation = 'R'
	msgType     = 'Y'
	msgInsert   = 'I'
	msgUpdate   = 'U'
	msgDelete   = 'D'
	msgTruncate = 'T'
	msgMessage  = 'M'
)

// Decode decodes one pgoutput message that started at walStart in the WAL.
func (d *Decoder) Decode(walStart pglogrepl.LSN, data []byte) (Change, error) {
	if len(data) == 0 {
		return Change{}, fmt.Errorf("decode at %s: empty message", walStart)
	}
	r := reader{buf: data[1:]}
	var ch Change
	var err error
	switch data[0] {
	case msgBegin:
		ch, err = d.begin(&r)
	case msgCommit:
		ch, err = d.commit(&r)
	case msgRelation:
		ch, err = d.relation(&r)
	case msgInsert:
		ch, err = d.insert(&r, walStart, len(data))
	case msgMessage:
		ch, err = d.message(&r, walStart, len(data))
	case msgUpdate:
		ch, err = d.update(&r)
	case msgOrigin, msgType, msgDelete, msgTruncate:
		// Nothing to publish. Deletes are skipped on purpose: the outbox is append-only, and
		// deleting the row in the same transaction is a common way to keep the table empty.
	default:
		err = fmt.Errorf("unknown message type %q (is the slot using pgoutput protocol version 1?)", data[0])
	}
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Change{}, fmt.Errorf("decode %q message at %s: %w", data[0], walStart, err)
	}
	return ch, nil
}

func (d *Decoder) begin(r *reader) (Change, error) {
	if d.inTx {
		return Change{}, fmt.Errorf("begin of a transaction while %d (commit %s) is still open", d.tx.Xid, d.tx.CommitLSN)
	}
	d.tx = TxInfo{CommitLSN: r.lsn(), CommitTime: r.time(), Xid: r.u32(), SystemID: d.origin.SystemID, Timeline: d.origin.Timeline}
	d.inTx = r.err == nil
	d.events = 0
	return Change{Kind: Begin, Tx: d.tx}, nil
}

func (d *Decoder) commit(r *reader) (Change, error) {
	if !d.inTx {
		return Change{}, fmt.Errorf("commit without a transaction")
	}
	r.u8() // flags, unused
	commitLSN := r.lsn()
	end := r.lsn()
	r.time()
	if r.err != nil {
		return Change{}, nil
	}
	if commitLSN != d.tx.CommitLSN {
		return Change{}, fmt.Errorf("out of order commit: commit LSN %s does not match the begin's %s", commitLSN, d.tx.CommitLSN)
	}
	d.inTx = false
	return Change{Kind: Commit, Tx: d.tx, EndLSN: end}, nil
}

func (d *Decoder) relation(r *reader) (Change, error) {
	oid := r.u32()
	schema := r.cstring()
	table := r.cstring()
	r.u8() // replica identity
	n := int(r.u16())
	names := make([]string, 0, n)
	types := make([]uint32, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		r.u8() // flags: part of the key
		names = append(names, r.cstring())
		types = append(types, r.u32())
		r.u32() // type modifier
	}
	if r.err != nil {
		return Change{}, nil
	}
	// A new definition replaces any earlier one: its column indexes may no longer match.
	rel := &relation{name: schema + "." + table, names: names, types: types}
	if d.cfg.NoTable {
		// No table is the outbox: its rows are provably not events, whatever their relation.
		d.relations[oid] = rel
		return Change{}, nil
	}
	info := &RelationInfo{OID: oid, Schema: schema, Table: table, Columns: names}
	if schema == d.cfg.Schema && table == d.cfg.Table {
		d.mapColumns(rel)
		info.Named, info.Unusable = true, rel.unusable
	} else {
		rel.unclassified = true
	}
	d.relations[oid] = rel
	return Change{Kind: Relation, Relation: info}, nil
}

// Classify says whether the relation oid, announced by a Relation change that was not Named, is
// part of the outbox (a partition of it). It returns why its rows cannot be read, if they cannot.
func (d *Decoder) Classify(oid uint32, outbox bool) (unusable error) {
	rel, ok := d.relations[oid]
	if !ok {
		return nil
	}
	rel.unclassified = false
	if outbox {
		d.mapColumns(rel)
	}
	return rel.unusable
}

// byteaOID is the type OID of bytea, whose text form is hex and must be decoded.
const byteaOID = 17

// mapColumns marks rel as the outbox and finds the configured columns in it. A missing column
// does not fail the stream: the relation is remembered as unusable, and each of its rows goes to
// the failure policy with what could be read.
func (d *Decoder) mapColumns(rel *relation) {
	names, types := rel.names, rel.types
	rel.outbox = true
	index := func(name string) int {
		for i, n := range names {
			if n == name {
				return i
			}
		}
		return -1
	}
	c := d.cfg.Columns
	var missing []string
	need := func(key, name string) int {
		i := index(name)
		if i < 0 {
			missing = append(missing, fmt.Sprintf("%q (%s)", name, key))
		}
		return i
	}
	rel.id = need("columns.id", c.ID)
	rel.aggType = need("columns.aggregate_type", c.AggregateType)
	rel.aggID = need("columns.aggregate_id", c.AggregateID)
	rel.evType = need("columns.event_type", c.EventType)
	rel.payload = need("columns.payload", c.Payload)
	rel.headers, rel.aggVersion, rel.timestamp, rel.spanContext = -1, -1, -1, -1
	if c.Headers != "" {
		rel.headers = need("columns.headers", c.Headers)
	}
	if c.AggregateVersion != "" {
		rel.aggVersion = need("columns.aggregate_version", c.AggregateVersion)
	}
	if c.Timestamp != "" {
		rel.timestamp = need("columns.timestamp", c.Timestamp)
	}
	if c.TracingSpanContext != "" {
		rel.spanContext = need("columns.tracing_span_context", c.TracingSpanContext)
	}
	rel.extra = make([]int, len(d.cfg.Extra))
	rel.extraKinds = make([]ValueKind, len(d.cfg.Extra))
	for i, name := range d.cfg.Extra {
		rel.extra[i] = need("extra column", name)
		if rel.extra[i] >= 0 {
			rel.extraKinds[i] = KindOf(types[rel.extra[i]])
		}
	}
	rel.unusable = nil
	if len(missing) > 0 {
		rel.unusable = fmt.Errorf("outbox table %s had no column %s when this row was written (it had %s): the table's schema changed; restore the column or fix the columns.* settings",
			rel.name, strings.Join(missing, ", "), strings.Join(names, ", "))
	} else if rel.timestamp >= 0 {
		switch types[rel.timestamp] {
		case timestamptzOID:
			rel.timestampTZ = true
		case timestampOID:
		default:
			rel.unusable = fmt.Errorf("outbox table %s: the timestamp column %q (columns.timestamp) is of type OID %d; it must be timestamp or timestamptz",
				rel.name, c.Timestamp, types[rel.timestamp])
		}
	}
	rel.payloadBytea = rel.payload >= 0 && types[rel.payload] == byteaOID
}

func (d *Decoder) insert(r *reader, walStart pglogrepl.LSN, size int) (Change, error) {
	oid := r.u32()
	if tag := r.u8(); r.err == nil && tag != 'N' {
		return Change{}, fmt.Errorf("insert with tuple tag %q, want 'N'", tag)
	}
	rel, ok := d.relations[oid]
	if r.err != nil {
		return Change{}, nil
	}
	if !ok {
		return Change{}, fmt.Errorf("insert into relation %d before its Relation message", oid)
	}
	if rel.unclassified {
		return Change{}, fmt.Errorf("insert into %s before the relation was classified (call Classify after its Relation change)", rel.name)
	}
	if !rel.outbox {
		return Change{}, nil
	}
	if !d.inTx {
		return Change{}, fmt.Errorf("insert into %s outside a transaction", rel.name)
	}
	d.cols = r.tuple(d.cols)
	if r.err != nil {
		return Change{}, nil
	}
	ev := &Event{LSN: walStart, Tx: d.tx, RawSize: int64(size)}
	unusable, err := d.fillFromRow(rel, ev)
	if err != nil {
		return Change{}, err
	}
	ev.Index = d.events
	d.events++
	return Change{Kind: Insert, Tx: d.tx, Event: ev, Unusable: unusable}, nil
}

// fillFromRow fills ev from the mapped columns of the insert's row (d.cols). An error is a row
// that breaks the protocol's promises; unusable is an event that cannot be published as it is (a
// bad timestamp, the relation's own fault), and still goes to the failure policy.
func (d *Decoder) fillFromRow(rel *relation, ev *Event) (unusable, err error) {
	for _, f := range []struct {
		dst *[]byte
		idx int
	}{
		{&ev.ID, rel.id}, {&ev.AggregateType, rel.aggType}, {&ev.AggregateID, rel.aggID},
		{&ev.EventType, rel.evType}, {&ev.Payload, rel.payload}, {&ev.Headers, rel.headers},
		{&ev.AggregateVersion, rel.aggVersion},
	} {
		if *f.dst, err = d.column(rel, f.idx); err != nil {
			return nil, err
		}
	}
	if len(rel.extra) > 0 {
		ev.Extra = make([][]byte, len(rel.extra))
		for i, idx := range rel.extra {
			if ev.Extra[i], err = d.column(rel, idx); err != nil {
				return nil, err
			}
		}
		ev.ExtraKinds = rel.extraKinds
	}
	if ev.SpanContext, err = d.column(rel, rel.spanContext); err != nil {
		return nil, err
	}
	unusable = rel.unusable
	if ts, err := d.column(rel, rel.timestamp); err != nil {
		return nil, err
	} else if ts != nil && unusable == nil {
		if ev.Time, err = ParseTimestamp(ts, rel.timestampTZ); err != nil {
			unusable = fmt.Errorf("outbox table %s, timestamp column %q: %w", rel.name, d.cfg.Columns.Timestamp, err)
		}
	}
	if rel.payloadBytea && ev.Payload != nil {
		if ev.Payload, err = unhexBytea(ev.Payload); err != nil {
			return nil, fmt.Errorf("payload of event %s: %w", ev.ID, err)
		}
		ev.RawSize += int64(len(ev.Payload))
	}
	return unusable, nil
}

// column is the value of the insert's column i (d.cols), nil for an unmapped column (i < 0).
func (d *Decoder) column(rel *relation, i int) ([]byte, error) {
	if i < 0 {
		return nil, nil
	}
	if i >= len(d.cols) {
		return nil, fmt.Errorf("insert into %s has %d columns, the relation promised at least %d", rel.name, len(d.cols), i+1)
	}
	if d.cols[i].kind == colUnchanged {
		return nil, fmt.Errorf("insert into %s carries an unchanged TOAST value in column %d", rel.name, i)
	}
	return d.cols[i].data, nil
}

// update reports an UPDATE of an outbox relation; updates of other relations are skipped.
func (d *Decoder) update(r *reader) (Change, error) {
	oid := r.u32()
	if r.err != nil {
		return Change{}, nil
	}
	rel, ok := d.relations[oid]
	if !ok || !rel.outbox || rel.unclassified || !d.inTx {
		return Change{}, nil // other tables' updates are not read further
	}
	// The old key or row, when the replica identity sends one, then the new row.
	tag := r.u8()
	if tag == 'K' || tag == 'O' {
		d.cols = r.tuple(d.cols)
		tag = r.u8()
	}
	if r.err == nil && tag != 'N' {
		return Change{}, fmt.Errorf("update of %s with tuple tag %q, want 'N'", rel.name, tag)
	}
	d.cols = r.tuple(d.cols)
	if r.err != nil {
		return Change{}, nil
	}
	return Change{Kind: Update, Tx: d.tx, Prefix: rel.name}, nil
}

// Type OIDs the decoder reads differently.
const (
	boolOID        = 16
	int8OID        = 20
	int2OID        = 21
	int4OID        = 23
	oidOID         = 26
	float4OID      = 700
	float8OID      = 701
	timestampOID   = 1114
	timestamptzOID = 1184
)

// KindOf is the JSON kind of a column type's text form (Event.ExtraKinds). numeric stays a
// string: its text may be NaN or Infinity, which JSON has no number for.
func KindOf(oid uint32) ValueKind {
	switch oid {
	case int2OID, int4OID, int8OID, oidOID:
		return KindNumber
	case float4OID, float8OID:
		return KindNumber
	case boolOID:
		return KindBool
	}
	return KindString
}

// unhexBytea decodes bytea's text output in hex format ("\x0a0b..."), the only one the replication
// connection asks for: anything else means the stream is not what the relay set up.
func unhexBytea(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return nil, fmt.Errorf("bytea value is not in hex format (set bytea_output = 'hex')")
	}
	return Bytea(b)
}
