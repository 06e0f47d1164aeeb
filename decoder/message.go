package decoder

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/jackc/pglogrepl"
)

// ErrInvalidMessage marks a transactional logical decoding message with the outbox prefix whose
// content is not an outbox event: not a JSON object, a required member missing, or a member of the
// wrong type. Such a message is still an event of its transaction (Change.Unusable wraps this
// error), so it goes to the failure policy, never silently away.
var ErrInvalidMessage = errors.New("invalid outbox message")

// The table-free outbox: a producer calls pg_logical_emit_message(true, prefix, content) in the
// transaction that makes the change, and pgoutput (with its messages option on) sends the message
// at commit, in the transaction's stream order, between its Begin and Commit. Nothing is stored
// in a table. The content is a JSON object whose member names are the configured column names, so
// a deployment's columns.* settings (and the Debezium profile's names) describe both shapes:
//
//	{"id": "…", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "OrderPlaced",
//	 "payload": {…}, "headers": {"tenant": "acme"}}
//
// id, aggregate_type and aggregate_id are required JSON strings (null counts as missing);
// event_type is an optional string; payload is any JSON value, sent as its JSON text exactly as
// written (null or absent: a null record value), or with PayloadBase64 a base64 string decoded to
// bytes; headers is an optional JSON object; the aggregate version (columns.aggregate_version) an
// optional integer (or a string holding one); each Extra member is a string (sent as its text),
// another JSON value (its JSON text) or absent.

// message decodes a logical decoding message ('M').
func (d *Decoder) message(r *reader, walStart pglogrepl.LSN, size int) (Change, error) {
	transactional := r.u8()&1 == 1
	lsn := r.lsn()
	prefix := r.cbytes()
	content := r.take(int(r.u32()))
	if r.err != nil {
		return Change{}, nil
	}
	if !transactional {
		return Change{Kind: Message, LSN: lsn, Prefix: string(prefix)}, nil
	}
	if d.cfg.MessagePrefix == "" || string(prefix) != d.cfg.MessagePrefix {
		return Change{}, nil // another application's message, or messages are not an outbox source
	}
	if !d.inTx {
		return Change{}, fmt.Errorf("transactional message with prefix %q outside a transaction", prefix)
	}
	ev := &Event{LSN: lsn, Tx: d.tx, RawSize: int64(size), Index: d.events}
	d.events++
	if lsn == 0 {
		ev.LSN = walStart
	}
	var unusable error
	if err := d.readContent(ev, content); err != nil {
		// What could be read stays (the dead-letter record keeps the id and key it found); the
		// value is the content as written, so the record shows what the producer sent.
		ev.Payload = content
		unusable = fmt.Errorf("%w: message with prefix %q at %s: %w", ErrInvalidMessage, prefix, lsn, err)
	}
	return Change{Kind: Insert, Tx: d.tx, Event: ev, Unusable: unusable}, nil
}

// readContent fills ev from a message's content. Values alias content where they can; copies (a
// string with escapes, a base64 payload) are added to ev.RawSize.
func (d *Decoder) readContent(ev *Event, content []byte) error {
	start := skipSpace(content, 0)
	if start == len(content) || content[start] != '{' {
		if !validJSON(content) {
			return fmt.Errorf("content is not valid JSON: %.60q", content)
		}
		return fmt.Errorf("content must be a JSON object, got %.60s", content)
	}
	// The mapped members' values by slot: id, aggregate type, aggregate id, event type, payload,
	// headers, timestamp, tracing span context, aggregate version, then the extra members.
	names := d.memberNames()
	var fixed [12][]byte
	values := fixed[:0]
	if len(names) > len(fixed) {
		values = make([][]byte, 0, len(names))
	}
	values = values[:len(names)]
	if end := memberValues(content, start, names, values); end < 0 || skipSpace(content, end) != len(content) {
		// Nothing of content that is not JSON reaches ev: the members before the fault were only scanned.
		return fmt.Errorf("content is not valid JSON: %.60q", content)
	}
	c := d.cfg.Columns
	m := members{ev: ev}
	m.str(c.ID, &ev.ID, values[0], true)
	if ev.ID != nil && len(ev.ID) == 0 {
		m.problem("member %q is empty", c.ID)
	}
	m.str(c.AggregateType, &ev.AggregateType, values[1], true)
	m.str(c.AggregateID, &ev.AggregateID, values[2], true)
	m.str(c.EventType, &ev.EventType, values[3], false)
	m.payload(c.Payload, values[4], d.cfg.PayloadBase64)
	m.headers(c.Headers, values[5])
	m.timestamp(c.Timestamp, values[6])
	m.spanContext(c.TracingSpanContext, values[7])
	m.aggregateVersion(c.AggregateVersion, values[8])
	m.extra(d.cfg.Extra, values[9:])
	if len(m.problems) > 0 {
		return errors.New(strings.Join(m.problems, "; "))
	}
	return nil
}

// memberValues scans the JSON object at content[start] and puts the value of each member named
// names[i] in values[i]; a later duplicate member wins, as in jsonb. It returns the index just past
// the object, or -1 when content holds no valid JSON object there.
func memberValues(content []byte, start int, names []string, values [][]byte) int {
	return eachMember(content, start, func(name []byte, escaped bool, value []byte) {
		key := unsafeString(name)
		if escaped {
			var s string
			if json.Unmarshal(append(append([]byte{'"'}, name...), '"'), &s) != nil {
				return
			}
			key = s
		}
		for i, n := range names {
			if n == key && n != "" {
				values[i] = value
			}
		}
	})
}

// members fills an event from a message's member values, and collects what is wrong with them:
// every problem is reported, not only the first.
type members struct {
	ev       *Event
	problems []string
}

func (m *members) problem(format string, args ...any) {
	m.problems = append(m.problems, fmt.Sprintf(format, args...))
}

// isSet says whether a member is present and not null.
func isSet(raw []byte) bool { return raw != nil && string(raw) != "null" }

// str sets *dst to the text of a JSON string member (nil when it is missing or null).
func (m *members) str(member string, dst *[]byte, raw []byte, required bool) {
	v, copied, err := jsonText(raw)
	switch {
	case err != nil:
		m.problem("member %q %v", member, err)
	case v == nil && required:
		m.problem("member %q is missing or null", member)
	default:
		*dst = v
		if copied {
			m.ev.RawSize += int64(len(v))
		}
	}
}

// payload is any JSON value, sent as its JSON text, or with payload_encoding base64 a string
// decoded to bytes.
func (m *members) payload(member string, raw []byte, isBase64 bool) {
	switch {
	case !isSet(raw):
	case !isBase64:
		m.ev.Payload = raw
	default:
		if err := decodeBase64(m.ev, raw); err != nil {
			m.problem("member %q (payload_encoding base64) %v", member, err)
		}
	}
}

func (m *members) headers(member string, raw []byte) {
	switch {
	case !isSet(raw):
	case raw[0] != '{':
		m.problem("member %q must be a JSON object, got %.40s", member, raw)
	default:
		m.ev.Headers = raw
	}
}

func (m *members) timestamp(member string, raw []byte) {
	if !isSet(raw) {
		return
	}
	var err error
	if m.ev.Time, err = parseMessageTimestamp(raw); err != nil {
		m.problem("member %q (columns.timestamp) %v", member, err)
	}
}

func (m *members) spanContext(member string, raw []byte) {
	switch {
	case !isSet(raw):
	case raw[0] == '{':
		m.ev.SpanContext = raw // the trace context as a JSON object
	default:
		m.str(member, &m.ev.SpanContext, raw, false)
	}
}

// aggregateVersion is a JSON integer, or a string holding one: the sink sends its decimal text.
func (m *members) aggregateVersion(member string, raw []byte) {
	if !isSet(raw) {
		return
	}
	text := raw
	if raw[0] == '"' {
		text, _, _ = jsonText(raw)
	}
	var buf [20]byte
	if n, err := strconv.ParseInt(string(text), 10, 64); err != nil {
		m.problem("member %q (columns.aggregate_version) must be an integer, got %.40s", member, raw)
	} else if canonical := strconv.AppendInt(buf[:0], n, 10); string(canonical) != string(text) {
		// "+7" or "007" in a string: the decimal a bigint column prints, which is all the sink
		// sends (it refuses anything else as invalid headers, dropping the event's headers).
		m.ev.AggregateVersion = bytes.Clone(canonical)
		m.ev.RawSize += int64(len(canonical))
	} else {
		m.ev.AggregateVersion = text
	}
}

// extra sets the extra members: a string is sent as its text, another JSON value (a number,
// boolean, object or array) as its JSON text.
func (m *members) extra(names []string, raws [][]byte) {
	if len(names) == 0 {
		return
	}
	m.ev.Extra = make([][]byte, len(names))
	m.ev.ExtraKinds = make([]ValueKind, len(names))
	for i, name := range names {
		v := raws[i]
		switch {
		case !isSet(v):
		case v[0] != '"':
			m.ev.Extra[i], m.ev.ExtraKinds[i] = v, KindJSON
		default:
			m.str(name, &m.ev.Extra[i], v, false)
		}
	}
}

// decodeBase64 decodes a payload member written as a base64 string (line breaks, as PostgreSQL's
// encode(..., 'base64') writes them every 76 characters, are ignored).
func decodeBase64(ev *Event, raw []byte) error {
	text, _, err := jsonText(raw)
	if err != nil {
		return err
	}
	out := make([]byte, base64.StdEncoding.DecodedLen(len(text)))
	n, err := base64.StdEncoding.Decode(out, text)
	if err != nil {
		return fmt.Errorf("is not valid base64: %v", err)
	}
	ev.Payload = out[:n:n]
	ev.RawSize += int64(n)
	return nil
}

// jsonText returns the text of a JSON string value: a slice of raw when it has no escapes, else a
// decoded copy (copied is then true). A missing value (nil) or null gives nil; any other type is an
// error.
func jsonText(raw []byte) (text []byte, copied bool, err error) {
	if raw == nil || string(raw) == "null" {
		return nil, false, nil
	}
	if raw[0] != '"' {
		return nil, false, fmt.Errorf("must be a JSON string, got %.40s", raw)
	}
	inner := raw[1 : len(raw)-1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner, false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, false, err
	}
	return []byte(s), true, nil
}

// memberNames are the member names readContent looks for, by slot: the columns' (Headers "" when
// there is no headers column), then the extra ones.
func (d *Decoder) memberNames() []string {
	if d.names == nil {
		c := d.cfg.Columns
		d.names = append([]string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload, c.Headers,
			c.Timestamp, c.TracingSpanContext, c.AggregateVersion}, d.cfg.Extra...)
	}
	return d.names
}

// unsafeString views b as a string without copying, for a comparison that does not keep it.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// eachMember calls fn for every member of the JSON object that starts at obj[i], with the member's
// name as written between its quotes (escaped says whether it holds escapes to decode) and its
// value's bytes, and returns the index just past the object. It checks the object as it goes: -1
// says obj holds no valid JSON object there (fn saw the members before the fault).
func eachMember(obj []byte, i int, fn func(name []byte, escaped bool, value []byte)) int {
	i = skipSpace(obj, i+1) // past '{'
	if i < len(obj) && obj[i] == '}' {
		return i + 1
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return -1
		}
		end := scanJSONString(obj, i)
		if end < 0 {
			return -1
		}
		name := obj[i+1 : end-1]
		if i = skipSpace(obj, end); i >= len(obj) || obj[i] != ':' {
			return -1
		}
		i = skipSpace(obj, i+1)
		vend := scanJSON(obj, i, 1)
		if vend < 0 {
			return -1
		}
		fn(name, bytes.IndexByte(name, '\\') >= 0, obj[i:vend:vend])
		if i = skipSpace(obj, vend); i >= len(obj) {
			return -1
		}
		switch obj[i] {
		case '}':
			return i + 1
		case ',':
			i = skipSpace(obj, i+1)
		default:
			return -1
		}
	}
}

func skipSpace(b []byte, i int) int {
	// b[i] <= ' ' first: most calls find no space at all, and one comparison tells.
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
