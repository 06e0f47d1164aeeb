// Package outbox writes transactional-outbox events from Go services: the producer half of the
// pattern the relay completes. Call Write (pgx) or WriteSQL (database/sql) with the transaction that
// makes the business change; the events commit or roll back with it, and the relay publishes the
// committed ones to Kafka. Emit and EmitSQL write the same events as transactional logical decoding
// messages instead of table rows (the table-free outbox, emit.go).
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", id, total); err != nil {
//			return err
//		}
//		_, err := outbox.Write(ctx, tx, outbox.Event{
//			AggregateType: "order", AggregateID: id, EventType: "OrderCreated",
//			Payload: OrderCreated{ID: id, Total: total},
//		})
//		return err
//	})
//
// Many events go in one statement (unnest of arrays), so a batch costs one round trip per
// MaxBatch events whatever its size, and the statement text is the same for every batch size (one
// prepared statement, not one per size). Rows are inserted in slice order, which is the order the
// relay publishes them in (from the WAL, and in a backfill by the table's seq column, which the
// database assigns on insert: Write never names it).
package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Event is one outbox row.
type Event struct {
	// ID is the event id, the `id` header consumers deduplicate by. Leave it empty to get a random
	// (version 4) UUID, generated here so Write can return it.
	ID            string
	AggregateType string // routes to the topic outbox.event.<AggregateType>; required
	AggregateID   string // the record key: events of one aggregate keep their order; required
	EventType     string // required
	// Payload becomes the record value. json.RawMessage and []byte are taken as JSON text as they
	// are (checked, not re-encoded); nil writes SQL NULL (a record with a null value); any other
	// value is encoded with encoding/json.
	Payload any
	// Headers become Kafka headers (the headers column, a JSON object). See the Header* names and
	// SetHeader.
	Headers map[string]string
	// AggregateVersion is the version of the aggregate this event leads to, usually the
	// optimistic-locking version the caller just wrote to its aggregate row; the relay sends it as
	// the aggregate_version header, and the inbox package tells new, duplicate, stale and missed
	// events apart by it. 0 writes NULL, or, with Config.VersionTable, the next version from the
	// counter table. Needs Columns.AggregateVersion.
	AggregateVersion int64
	// SchemaVersion, when not 0, is sent as the schema_version header (HeaderSchemaVersion), which
	// the inbox's Registry routes to a handler or an upcaster.
	SchemaVersion int
}

// SetHeader sets one header, creating the map when needed.
func (e *Event) SetHeader(name, value string) {
	if e.Headers == nil {
		e.Headers = make(map[string]string, 1)
	}
	e.Headers[name] = value
}

// Columns names the outbox table's columns.
type Columns struct {
	ID, AggregateType, AggregateID, EventType, Payload string
	Headers                                            string // empty when the table has no headers column
	// AggregateVersion is the bigint column for Event.AggregateVersion (the relay's
	// columns.aggregate_version); empty when the table has none.
	AggregateVersion string
}

// DefaultColumns is the table `outbox-relay migrate` creates.
var DefaultColumns = Columns{
	ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
	EventType: "event_type", Payload: "payload", Headers: "headers",
}

// DebeziumColumns is the table Debezium's outbox event router expects (profile: debezium). It has
// no headers column, so events written with it must not carry headers.
var DebeziumColumns = Columns{
	ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type", Payload: "payload",
}

// Config says where events go. Zero values get the defaults noted.
type Config struct {
	// Table is the outbox table, "table" or "schema.table"; each part is quoted, so it is taken
	// literally (case and all). Default "public.outbox_events".
	Table   string
	Columns Columns // default DefaultColumns
	// IDType and PayloadType are the SQL types of the id and payload columns. Defaults "uuid" and
	// "jsonb"; "text" works for ids that are not UUIDs, "json" or "text" for other payload columns.
	IDType, PayloadType string
	// VersionTable, "table" or "schema.table", makes Write assign versions: each event gets the
	// next version of its aggregate from this counter table (see CreateVersionTable), in the
	// caller's transaction. The cost is a row lock per aggregate until the transaction ends, so
	// concurrent writers of one aggregate take turns (writers of different aggregates do not), and
	// a rolled-back transaction gives its versions back. One Write locks its aggregates' rows in
	// key order; several Writes in one transaction lock in call order, so two transactions writing
	// the same aggregates in different orders across calls can deadlock (PostgreSQL aborts one
	// with SQLSTATE 40P01): pass a transaction's events in one call. Needs
	// Columns.AggregateVersion; events must leave AggregateVersion 0. Empty: versions are the
	// caller's (Event.AggregateVersion).
	VersionTable string
}

// MaxBatch is how many events go into one INSERT statement; larger batches take several, all in
// the caller's transaction.
const MaxBatch = 1000

// Writer inserts events into one outbox table. It is safe for concurrent use.
type Writer struct {
	insert     string
	hasHeaders bool
	hasVersion bool
	uuidIDs    bool
	versions   *versionTable // nil: versions are the caller's
}

var typeName = regexp.MustCompile(`^[a-z][a-z0-9_ ]*$`)

// New checks cfg and prepares the INSERT statement.
func New(cfg Config) (*Writer, error) {
	if cfg.Table == "" {
		cfg.Table = "public.outbox_events"
	}
	if cfg.Columns == (Columns{}) {
		cfg.Columns = DefaultColumns
	}
	if cfg.IDType == "" {
		cfg.IDType = "uuid"
	}
	if cfg.PayloadType == "" {
		cfg.PayloadType = "jsonb"
	}
	table, err := parseTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	for _, t := range []string{cfg.IDType, cfg.PayloadType} {
		if !typeName.MatchString(t) {
			return nil, fmt.Errorf("outbox: SQL type %q is not a plain type name such as uuid, text or jsonb", t)
		}
	}
	c := cfg.Columns
	names := []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}
	types := []string{cfg.IDType, "text", "text", "text", cfg.PayloadType}
	if c.Headers != "" {
		names = append(names, c.Headers)
		types = append(types, "jsonb")
	}
	if c.AggregateVersion != "" {
		names = append(names, c.AggregateVersion)
		types = append(types, "bigint")
	}
	var versions *versionTable
	if cfg.VersionTable != "" {
		if c.AggregateVersion == "" {
			return nil, errors.New("outbox: Config.VersionTable assigns versions, so Columns.AggregateVersion must name the column they go to")
		}
		if versions, err = newVersionTable(cfg.VersionTable); err != nil {
			return nil, err
		}
	}
	cols := make([]string, len(names))
	params := make([]string, len(names))
	fields := make([]string, len(names))
	for i, n := range names {
		if n == "" {
			return nil, errors.New("outbox: Columns must name the id, aggregate type, aggregate id, event type and payload columns")
		}
		cols[i] = pgx.Identifier{n}.Sanitize()
		params[i] = fmt.Sprintf("$%d::%s[]", i+1, types[i])
		fields[i] = fmt.Sprintf("c%d", i)
	}
	// ORDER BY the ordinality: rows are inserted, and so published, in the order of the slice.
	insert := fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM unnest(%s) WITH ORDINALITY AS t(%s, n) ORDER BY n",
		table, strings.Join(cols, ", "), strings.Join(fields, ", "), strings.Join(params, ", "), strings.Join(fields, ", "))
	return &Writer{insert: insert, hasHeaders: c.Headers != "", hasVersion: c.AggregateVersion != "",
		uuidIDs: cfg.IDType == "uuid", versions: versions}, nil
}

// parseTable quotes "table" or "schema.table".
func parseTable(s string) (string, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("outbox: table %q: want table or schema.table", s)
	}
	for _, p := range parts {
		if p == "" {
			return "", fmt.Errorf("outbox: table %q: want table or schema.table", s)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// Execer runs a statement: pgx.Tx satisfies it (also *pgx.Conn and *pgxpool.Pool, but then the
// events are not part of a business transaction).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLExecer is database/sql's counterpart: *sql.Tx satisfies it.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Write inserts events through tx (normally the caller's pgx.Tx) and returns their ids in order.
// On error some events may already be inserted: roll the transaction back.
func (w *Writer) Write(ctx context.Context, tx Execer, events ...Event) ([]string, error) {
	if w.versions != nil {
		var err error
		if events, err = w.versions.assign(ctx, tx, nil, events); err != nil {
			return nil, err
		}
	}
	return w.write(ctx, events, func(args []any) error {
		_, err := tx.Exec(ctx, w.insert, args...)
		return err
	})
}

// WriteSQL is Write for database/sql (*sql.Tx on the pgx stdlib driver).
func (w *Writer) WriteSQL(ctx context.Context, tx SQLExecer, events ...Event) ([]string, error) {
	if w.versions != nil {
		var err error
		if events, err = w.versions.assign(ctx, nil, tx, events); err != nil {
			return nil, err
		}
	}
	return w.write(ctx, events, func(args []any) error {
		_, err := tx.ExecContext(ctx, w.insert, args...)
		return err
	})
}

func (w *Writer) write(ctx context.Context, events []Event, exec func(args []any) error) ([]string, error) {
	trace, _ := TraceparentFrom(ctx)
	ids := make([]string, 0, len(events))
	for start := 0; start < len(events); start += MaxBatch {
		chunk := events[start:min(start+MaxBatch, len(events))]
		args, err := w.columns(chunk, trace, &ids)
		if err != nil {
			return nil, err
		}
		if err := exec(args); err != nil {
			return nil, fmt.Errorf("outbox: insert %d events: %w", len(chunk), err)
		}
	}
	return ids, nil
}

// columns turns events into one array per column, appending the ids to *ids.
func (w *Writer) columns(events []Event, trace string, ids *[]string) ([]any, error) {
	var (
		id      = make([]string, len(events))
		aggType = make([]string, len(events))
		aggID   = make([]string, len(events))
		evType  = make([]string, len(events))
		payload = make([][]byte, len(events)) // a nil element is SQL NULL
		headers = make([][]byte, len(events))
		version = make([]*int64, len(events)) // a nil element is SQL NULL
	)
	for i := range events {
		e := &events[i]
		if e.AggregateType == "" || e.AggregateID == "" || e.EventType == "" {
			return nil, fmt.Errorf("outbox: event %d: AggregateType, AggregateID and EventType are required", len(*ids))
		}
		id[i] = e.ID
		if id[i] == "" {
			id[i] = newUUID()
		} else if w.uuidIDs && !validUUID(id[i]) {
			return nil, fmt.Errorf("outbox: event %d: ID %q is not a UUID (the id column is uuid)", len(*ids), id[i])
		}
		aggType[i], aggID[i], evType[i] = e.AggregateType, e.AggregateID, e.EventType
		p, err := encodePayload(e.Payload)
		if err != nil {
			return nil, fmt.Errorf("outbox: event %s: %w", id[i], err)
		}
		payload[i] = p
		if e.AggregateVersion != 0 {
			if !w.hasVersion {
				return nil, fmt.Errorf("outbox: event %s has an AggregateVersion but the outbox table has no version column (Columns.AggregateVersion)", id[i])
			}
			if e.AggregateVersion < 0 {
				return nil, fmt.Errorf("outbox: event %s: AggregateVersion %d is negative", id[i], e.AggregateVersion)
			}
			version[i] = &e.AggregateVersion
		}
		hs := e.Headers
		if e.SchemaVersion != 0 {
			sv := strconv.Itoa(e.SchemaVersion)
			if old, ok := hs[HeaderSchemaVersion]; ok && old != sv {
				return nil, fmt.Errorf("outbox: event %s: SchemaVersion %s and header %s %q disagree", id[i], sv, HeaderSchemaVersion, old)
			}
			hs = withHeader(hs, HeaderSchemaVersion, sv)
		}
		h, err := w.encodeHeaders(hs, trace)
		if err != nil {
			return nil, fmt.Errorf("outbox: event %s: %w", id[i], err)
		}
		headers[i] = h
		*ids = append(*ids, id[i])
	}
	args := []any{id, aggType, aggID, evType, payload}
	if w.hasHeaders {
		args = append(args, headers)
	}
	if w.hasVersion {
		args = append(args, version)
	}
	return args, nil
}

func encodePayload(p any) ([]byte, error) {
	var raw []byte
	switch v := p.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode payload: %w", err)
		}
		return b, nil
	}
	if raw == nil {
		return nil, nil
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("payload is not valid JSON: %.60q", raw)
	}
	return raw, nil
}

// encodeHeaders builds the headers column.
func (w *Writer) encodeHeaders(h map[string]string, trace string) ([]byte, error) {
	return headersJSON(h, trace, w.hasHeaders)
}

// headersJSON builds the headers JSON object (a column, or a message's member). A traceparent from
// the context is added unless the event sets its own; without a headers column (has false) it is
// left out (tracing is best effort), but explicit headers are an error, never dropped.
func headersJSON(h map[string]string, trace string, has bool) ([]byte, error) {
	if !has {
		if len(h) > 0 {
			return nil, errors.New("event has headers but the outbox has no headers column or member (Columns.Headers)")
		}
		return nil, nil
	}
	for _, own := range []string{"id", "event_type", "aggregate_type", "aggregate_version"} {
		if _, ok := h[own]; ok {
			// The relay refuses it (invalid_headers): a consumer would take it for the event's own.
			return nil, fmt.Errorf("header %q is one the relay sets itself from the event: name it otherwise", own)
		}
	}
	if trace != "" && h[HeaderTraceparent] == "" {
		h = withHeader(h, HeaderTraceparent, trace)
	}
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode headers: %w", err)
	}
	return b, nil
}

// withHeader returns a copy of h with name set: the caller's map is never changed.
func withHeader(h map[string]string, name, value string) map[string]string {
	out := make(map[string]string, len(h)+1)
	for k, v := range h {
		out[k] = v
	}
	out[name] = value
	return out
}

var defaultWriter, defaultErr = New(Config{})

// Write inserts events into public.outbox_events (the table `outbox-relay migrate` creates)
// through tx and returns their ids. Use New for another table or layout.
func Write(ctx context.Context, tx Execer, events ...Event) ([]string, error) {
	if defaultErr != nil {
		return nil, defaultErr
	}
	return defaultWriter.Write(ctx, tx, events...)
}

// WriteSQL is Write for database/sql.
func WriteSQL(ctx context.Context, tx SQLExecer, events ...Event) ([]string, error) {
	if defaultErr != nil {
		return nil, defaultErr
	}
	return defaultWriter.WriteSQL(ctx, tx, events...)
}

// newUUID returns a random (version 4) UUID in its canonical text form.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics on an unusable entropy source)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// validUUID accepts the forms PostgreSQL's uuid input most often sees: canonical 8-4-4-4-12 hex,
// in either case.
func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}
