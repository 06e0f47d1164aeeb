package outbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The table-free outbox: Emit writes each event as a transactional logical decoding message
// (pg_logical_emit_message(true, prefix, content)) in the caller's transaction. It costs one WAL
// record per event and nothing else: no heap tuple, no index entry, no vacuum, no pruning. The
// message is decoded at commit, in commit order with the transaction's other changes, and rolled
// back with it. The relay publishes it with outbox_shape: messages (or both) and the same
// messages_prefix; the content is a JSON object whose member names are the column names, so the
// relay's columns.* settings describe both shapes:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", id, total); err != nil {
//			return err
//		}
//		_, err := outbox.Emit(ctx, tx, outbox.Event{
//			AggregateType: "order", AggregateID: id, EventType: "OrderCreated",
//			Payload: OrderCreated{ID: id, Total: total},
//		})
//		return err
//	})
//
// Nothing is stored, so nothing can be read back either: there is no backfill of messages, and an
// event the relay never saw (written before its slot existed) is gone.

// DefaultPrefix is the relay's default messages_prefix.
const DefaultPrefix = "outbox"

// EmitterConfig says how events become messages. Zero values get the defaults noted.
type EmitterConfig struct {
	Prefix  string  // the relay's messages_prefix; default DefaultPrefix
	Columns Columns // member names (the relay's columns.*); default DefaultColumns
	// PayloadBase64 writes the payload as a base64 string (the relay's payload_encoding: base64),
	// for binary payloads: Payload must then be []byte or string (or nil), taken as raw bytes.
	PayloadBase64 bool
}

// Emitter writes events as transactional logical decoding messages. It is safe for concurrent use.
type Emitter struct {
	prefix string
	cols   Columns
	base64 bool
	names  [7][]byte // the member names as JSON strings with their colon: id, aggregate type, aggregate id, event type, payload, headers, aggregate version
}

// emitStatement emits one message per array element, in array order: volatile functions in the
// select list are evaluated after the ORDER BY sort, so in ordinality order.
const emitStatement = "SELECT pg_logical_emit_message(true, $1, c) FROM unnest($2::text[]) WITH ORDINALITY AS t(c, n) ORDER BY n"

// NewEmitter checks cfg.
func NewEmitter(cfg EmitterConfig) (*Emitter, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Columns == (Columns{}) {
		cfg.Columns = DefaultColumns
	}
	c := cfg.Columns
	e := &Emitter{prefix: cfg.Prefix, cols: c, base64: cfg.PayloadBase64}
	for i, n := range []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload, c.Headers, c.AggregateVersion} {
		if n == "" && i < 5 {
			return nil, errors.New("outbox: Columns must name the id, aggregate type, aggregate id, event type and payload members")
		}
		name, _ := json.Marshal(n)
		e.names[i] = append(name, ':')
	}
	return e, nil
}

// Emit writes events through tx (normally the caller's pgx.Tx) and returns their ids in order. On
// error some events may already be emitted: roll the transaction back.
func (e *Emitter) Emit(ctx context.Context, tx Execer, events ...Event) ([]string, error) {
	return e.emit(ctx, events, func(contents []string) error {
		_, err := tx.Exec(ctx, emitStatement, e.prefix, contents)
		return err
	})
}

// EmitSQL is Emit for database/sql (*sql.Tx on the pgx stdlib driver).
func (e *Emitter) EmitSQL(ctx context.Context, tx SQLExecer, events ...Event) ([]string, error) {
	return e.emit(ctx, events, func(contents []string) error {
		_, err := tx.ExecContext(ctx, emitStatement, e.prefix, contents)
		return err
	})
}

func (e *Emitter) emit(ctx context.Context, events []Event, exec func(contents []string) error) ([]string, error) {
	trace, _ := TraceparentFrom(ctx)
	ids := make([]string, 0, len(events))
	for start := 0; start < len(events); start += MaxBatch {
		chunk := events[start:min(start+MaxBatch, len(events))]
		contents := make([]string, len(chunk))
		for i := range chunk {
			id, content, err := e.content(&chunk[i], trace, len(ids))
			if err != nil {
				return nil, err
			}
			contents[i] = content
			ids = append(ids, id)
		}
		if err := exec(contents); err != nil {
			return nil, fmt.Errorf("outbox: emit %d events: %w", len(chunk), err)
		}
	}
	return ids, nil
}

// Content returns the message content Emit would write for ev in ctx (its id filled in when empty,
// the context's traceparent added), for producers that call pg_logical_emit_message(true, prefix,
// content) themselves, in SQL or through another driver.
func (e *Emitter) Content(ctx context.Context, ev Event) (id, content string, err error) {
	trace, _ := TraceparentFrom(ctx)
	return e.content(&ev, trace, 0)
}

// content builds one event's message: a JSON object with the configured member names. Absent
// payload and headers are left out (the relay reads them as NULL).
func (e *Emitter) content(ev *Event, trace string, n int) (id, content string, err error) {
	if ev.AggregateType == "" || ev.AggregateID == "" || ev.EventType == "" {
		return "", "", fmt.Errorf("outbox: event %d: AggregateType, AggregateID and EventType are required", n)
	}
	if ev.AggregateVersion != 0 && e.cols.AggregateVersion == "" {
		return "", "", fmt.Errorf("outbox: event %d: AggregateVersion is set, but Columns.AggregateVersion names no member for it (the relay's columns.aggregate_version)", n)
	}
	id = ev.ID
	if id == "" {
		id = newUUID()
	}
	var payload []byte
	if e.base64 {
		payload, err = base64Payload(ev.Payload)
	} else {
		payload, err = encodePayload(ev.Payload)
	}
	if err != nil {
		return "", "", fmt.Errorf("outbox: event %s: %w", id, err)
	}
	headers, err := headersJSON(ev.Headers, trace, e.cols.Headers != "")
	if err != nil {
		return "", "", fmt.Errorf("outbox: event %s: %w", id, err)
	}
	var b bytes.Buffer
	b.Grow(96 + len(id) + len(ev.AggregateType) + len(ev.AggregateID) + len(ev.EventType) + len(payload) + len(headers))
	b.WriteByte('{')
	for i, v := range []string{id, ev.AggregateType, ev.AggregateID, ev.EventType} {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e.names[i])
		s, _ := json.Marshal(v)
		b.Write(s)
	}
	if payload != nil {
		b.WriteByte(',')
		b.Write(e.names[4])
		b.Write(payload)
	}
	if headers != nil {
		b.WriteByte(',')
		b.Write(e.names[5])
		b.Write(headers)
	}
	if ev.AggregateVersion != 0 {
		b.WriteByte(',')
		b.Write(e.names[6])
		b.WriteString(strconv.FormatInt(ev.AggregateVersion, 10))
	}
	b.WriteByte('}')
	return id, b.String(), nil
}

// base64Payload encodes a binary payload as a JSON string of its base64.
func base64Payload(p any) ([]byte, error) {
	var raw []byte
	switch v := p.(type) {
	case nil:
		return nil, nil
	case []byte:
		if v == nil {
			return nil, nil
		}
		raw = v
	case string:
		raw = []byte(v)
	default:
		return nil, fmt.Errorf("with PayloadBase64 the payload must be []byte or string, got %T", p)
	}
	out := make([]byte, 0, base64.StdEncoding.EncodedLen(len(raw))+2)
	out = append(out, '"')
	out = base64.StdEncoding.AppendEncode(out, raw)
	return append(out, '"'), nil
}

var defaultEmitter, _ = NewEmitter(EmitterConfig{})

// Emit writes events as transactional logical decoding messages with the prefix "outbox" and the
// default member names (the relay's defaults with outbox_shape: messages) through tx, and returns
// their ids. Use NewEmitter for another prefix, the Debezium names or binary payloads.
func Emit(ctx context.Context, tx Execer, events ...Event) ([]string, error) {
	return defaultEmitter.Emit(ctx, tx, events...)
}

// EmitSQL is Emit for database/sql.
func EmitSQL(ctx context.Context, tx SQLExecer, events ...Event) ([]string, error) {
	return defaultEmitter.EmitSQL(ctx, tx, events...)
}
