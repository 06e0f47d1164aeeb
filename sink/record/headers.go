package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// Header names set on every record.
const (
	HeaderID            = "id"
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
	// HeaderAggregateVersion carries the aggregate version column (decoder.Columns.AggregateVersion)
	// when one is configured, in decimal.
	HeaderAggregateVersion = "aggregate_version"
)

// DeadLetterHeaderPrefix starts the headers the relay adds to a dead letter (sink's HeaderDLQ*);
// no event may carry one of its own.
const DeadLetterHeaderPrefix = "outbox.dlq."

// The marks the relay's commands put on a record they publish again; no event may carry one of its
// own (a consumer would take it for a replayed or redriven record).
const (
	HeaderReplay  = "outbox.replay"  // replay.Header
	HeaderRedrive = "outbox.redrive" // redrive.Header
)

// BuiltinHeaders are the headers every record carries unless Options.BuiltinHeaders narrows them.
var BuiltinHeaders = []string{HeaderID, HeaderEventType, HeaderAggregateType}

// headers builds a record's headers with every built-in header.
func headers(ev *decoder.Event, extra []string) ([]kafka.Header, error) {
	return buildHeaders(ev, BuiltinHeaders, extra, nil)
}

// buildHeaders builds a record's headers: the chosen built-in ones (event id, type, aggregate type),
// then any configured extra columns, then the entries of the headers column. Values alias the
// event's buffers.
//
// An extra value that is NULL is left out, unless keepNull says otherwise for it: a header with a
// null value then stands for it, as Debezium's router adds one for a NULL column.
func buildHeaders(ev *decoder.Event, builtin, extra []string, keepNull []bool) ([]kafka.Header, error) {
	// Room for every header at once: growing the slice for the headers column's members was a
	// tenth of a table-free event's allocations. Each member's name ends in a quote and a colon
	// (a value can hold the pair only escaped, as \":); past 16 members the slice grows, so that
	// colons in values never make an event hold much more than it uses until Kafka acknowledges it.
	size := len(builtin) + len(extra) + 1
	if ev.Headers != nil {
		size += min(bytes.Count(ev.Headers, []byte(`":`)), 16)
	}
	hs := make([]kafka.Header, 0, size)
	for _, name := range builtin {
		switch name {
		case HeaderID:
			hs = append(hs, kafka.Header{Key: HeaderID, Value: ev.ID})
		case HeaderEventType:
			hs = append(hs, kafka.Header{Key: HeaderEventType, Value: ev.EventType})
		case HeaderAggregateType:
			hs = append(hs, kafka.Header{Key: HeaderAggregateType, Value: ev.AggregateType})
		}
	}
	if v := ev.AggregateVersion; v != nil {
		if !decimal(v) {
			return nil, fmt.Errorf("aggregate version %.30q is not a decimal integer (columns.aggregate_version must be a bigint column)", v)
		}
		hs = append(hs, kafka.Header{Key: HeaderAggregateVersion, Value: v})
	}
	own := len(hs) // the headers the relay sets itself
	for i, name := range extra {
		var v []byte
		if i < len(ev.Extra) {
			v = ev.Extra[i]
		}
		if name != "" && (v != nil || (i < len(keepNull) && keepNull[i])) {
			hs = append(hs, kafka.Header{Key: name, Value: v})
		}
	}
	if ev.Headers == nil {
		return hs, nil
	}
	fromJSON := len(hs)
	hs, err := appendJSONHeaders(hs, ev.Headers)
	if err != nil {
		return nil, err
	}
	// A member named like a header the relay set itself (the event id, its type, ...) would be
	// taken for it by a consumer that reads a header's last value (Java's lastHeader, the inbox):
	// two events with one such member would be deduplicated into one.
	for _, h := range hs[fromJSON:] {
		// The dead-letter headers are the relay's word on where an event was going and why it
		// failed, which redrive acts on: a row may not speak for the relay.
		if strings.HasPrefix(h.Key, DeadLetterHeaderPrefix) {
			return nil, fmt.Errorf("headers member %q uses the prefix %s, which the relay's dead-letter headers own: rename the member", h.Key, DeadLetterHeaderPrefix)
		}
		if h.Key == HeaderReplay || h.Key == HeaderRedrive {
			return nil, fmt.Errorf("headers member %q is the mark of a record the relay's %s command published again: rename the member", h.Key, strings.TrimPrefix(h.Key, "outbox."))
		}
		for _, mine := range hs[:own] {
			if h.Key == mine.Key {
				return nil, fmt.Errorf("headers member %q repeats a header the relay sets itself: rename the member", h.Key)
			}
		}
	}
	return hs, nil
}

// decimal reports whether b is an integer in decimal, as PostgreSQL prints a bigint.
func decimal(b []byte) bool {
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// appendJSONHeaders adds the members of a JSON object as headers, in document order. String values
// become their text; other values keep their JSON form; null members are left out.
func appendJSONHeaders(hs []kafka.Header, obj []byte) ([]kafka.Header, error) {
	if out, ok := appendFlatJSONHeaders(hs, obj); ok {
		return out, nil
	}
	return decodeJSONHeaders(hs, obj)
}

// appendFlatJSONHeaders is the fast path for the usual headers object: flat, with strings free of
// escapes, numbers, booleans and nulls, as jsonb prints it. Values alias obj. It gives up (ok is
// false) on anything else, which decodeJSONHeaders then handles, errors included.
func appendFlatJSONHeaders(hs []kafka.Header, obj []byte) (out []kafka.Header, ok bool) {
	if !utf8.Valid(obj) {
		return hs, false // encoding/json replaces invalid bytes; so does the careful path
	}
	start := len(hs)
	sc := flatScan{obj: obj}
	sc.space()
	if !sc.take('{') {
		return hs, false
	}
	sc.space()
	if !sc.take('}') {
		for {
			if hs, ok = sc.member(hs); !ok {
				return hs[:start], false
			}
			sc.space()
			if sc.take(',') {
				sc.space()
				continue
			}
			if sc.take('}') {
				break
			}
			return hs[:start], false
		}
	}
	sc.space()
	if sc.i != len(obj) {
		return hs[:start], false
	}
	return hs, true
}

// flatScan reads a flat JSON object in place for appendFlatJSONHeaders: i is the next byte.
type flatScan struct {
	obj []byte
	i   int
}

// space skips JSON whitespace.
func (sc *flatScan) space() {
	for sc.i < len(sc.obj) && (sc.obj[sc.i] == ' ' || sc.obj[sc.i] == '\t' || sc.obj[sc.i] == '\n' || sc.obj[sc.i] == '\r') {
		sc.i++
	}
}

// take skips c if it is the next byte, and reports whether it was.
func (sc *flatScan) take(c byte) bool {
	if sc.i < len(sc.obj) && sc.obj[sc.i] == c {
		sc.i++
		return true
	}
	return false
}

// str reads a string without escapes; i is at its opening quote. ok is false for anything else.
func (sc *flatScan) str() ([]byte, bool) {
	obj := sc.obj
	if sc.i >= len(obj) || obj[sc.i] != '"' {
		return nil, false
	}
	for j := sc.i + 1; j < len(obj); j++ {
		switch c := obj[j]; {
		case c == '"':
			v := obj[sc.i+1 : j : j]
			sc.i = j + 1
			return v, true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

// member reads one member, "key": scalar, and appends its header to hs (none for a null). ok is
// false for anything but a flat member: nested values and anything odd take the careful path.
// The header's name aliases obj like its value: the event's buffers are never written after the
// decoder fills them, and the name lives no longer than the record (a copy per member was a fifth
// of a table-free event's allocations).
func (sc *flatScan) member(hs []kafka.Header) (out []kafka.Header, ok bool) {
	name, ok := sc.str()
	if !ok {
		return hs, false
	}
	key := unsafe.String(unsafe.SliceData(name), len(name))
	sc.space()
	if !sc.take(':') {
		return hs, false
	}
	sc.space()
	obj, i := sc.obj, sc.i
	if i >= len(obj) {
		return hs, false
	}
	switch c := obj[i]; {
	case c == '"':
		v, ok := sc.str()
		if !ok {
			return hs, false
		}
		return append(hs, kafka.Header{Key: key, Value: v}), true
	case c == 'n' && bytes.HasPrefix(obj[i:], []byte("null")):
		sc.i += 4
		return hs, true
	case c == 't' && bytes.HasPrefix(obj[i:], []byte("true")):
		sc.i += 4
		return append(hs, kafka.Header{Key: key, Value: obj[i : i+4 : i+4]}), true
	case c == 'f' && bytes.HasPrefix(obj[i:], []byte("false")):
		sc.i += 5
		return append(hs, kafka.Header{Key: key, Value: obj[i : i+5 : i+5]}), true
	case c == '-' || c >= '0' && c <= '9':
		j := i
		for j < len(obj) && (obj[j] == '-' || obj[j] == '+' || obj[j] == '.' || obj[j] == 'e' || obj[j] == 'E' || obj[j] >= '0' && obj[j] <= '9') {
			j++
		}
		if !json.Valid(obj[i:j]) {
			return hs, false
		}
		sc.i = j
		return append(hs, kafka.Header{Key: key, Value: obj[i:j:j]}), true
	}
	return hs, false
}

// decodeJSONHeaders handles any headers value with encoding/json.
func decodeJSONHeaders(hs []kafka.Header, obj []byte) ([]kafka.Header, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		if tok == nil && err == nil { // JSON null: no headers
			return hs, nil
		}
		return nil, fmt.Errorf("headers column must hold a JSON object, got %.60s", obj)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("headers column: %w", err)
		}
		name := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("headers column, member %q: %w", name, err)
		}
		switch {
		case bytes.Equal(raw, []byte("null")):
			continue
		case len(raw) > 0 && raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, fmt.Errorf("headers column, member %q: %w", name, err)
			}
			hs = append(hs, kafka.Header{Key: name, Value: []byte(s)})
		default:
			hs = append(hs, kafka.Header{Key: name, Value: raw})
		}
	}
	// A text column is not checked by PostgreSQL: refuse a truncated object or anything after it.
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("headers column: %w", err)
	}
	if rest := bytes.TrimSpace(obj[dec.InputOffset():]); len(rest) > 0 {
		return nil, fmt.Errorf("headers column must hold one JSON object, got %.60s after it", rest)
	}
	return hs, nil
}
