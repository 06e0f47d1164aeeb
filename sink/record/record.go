// Package record turns an outbox event into the Kafka record that carries it: the topic it is
// routed to, its key, its value in the chosen encoding, its headers, its timestamp and, when a
// column says so, its partition; byte for byte what Debezium's outbox event router writes for the
// same row where the two share an option (docs/migrating-from-debezium.md). It does no I/O: what
// happens to a record that cannot be built, or that Kafka refuses, is the sink's policy.
package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// Options says how events become records. Zero values get the defaults noted.
type Options struct {
	TopicTemplate  string   // default "outbox.event.{aggregate_type}"
	BuiltinHeaders []string // subset of BuiltinHeaders to send; default all
	ExtraHeaders   []string // names of decoder.Event.Extra values, in order
	ValueEncoding  Encoding // default Raw
	KeyEncoding    Encoding // default Raw; JSONString matches Connect's JsonConverter keys

	// Debezium's outbox event router options (debezium.go).
	// ExtraPlacement says where each Extra value goes, parallel to ExtraHeaders (which names it);
	// nil puts every one in a header.
	ExtraPlacement []Placement
	// TopicRegex, when set, routes by regular expression (route.topic.regex) instead of
	// TopicTemplate: TopicReplacement (default DefaultTopicReplacement) expanded with the groups of
	// TopicRegex matched against the aggregate type. See NewTopicRegex.
	TopicRegex       string
	TopicReplacement string
	// TombstoneOnEmptyPayload sends a null value (a tombstone) for a payload that is NULL, empty or
	// blank (route.tombstone.on.empty.payload); without it only a NULL payload has a null value,
	// and with an envelope not even that.
	TombstoneOnEmptyPayload bool
	// PayloadField names the payload column, for JSONWithSchema (Debezium names the expanded
	// document's schema after it); default "payload".
	PayloadField string

	// The topics a row may reach (topics.go). TopicAllow lists names, or patterns where * stands
	// for any run of characters; nil derives it from the routing (DefaultTopicAllow). TopicDeny
	// names topics no event may reach whatever TopicAllow says; a name starting with '_' (Kafka's
	// and the platforms' internal topics) is always refused. TopicRegexPassthrough makes an
	// aggregate type the regex does not match the topic itself, as Debezium's router does;
	// without it such an event is refused.
	TopicAllow            []string
	TopicDeny             []string
	TopicRegexPassthrough bool
}

// WithDefaults returns o with its zero values replaced by the defaults.
func (o Options) WithDefaults() Options {
	if o.TopicTemplate == "" {
		o.TopicTemplate = "outbox.event." + placeholderAggregateType
	}
	if o.BuiltinHeaders == nil {
		o.BuiltinHeaders = BuiltinHeaders
	}
	if o.ValueEncoding == "" {
		o.ValueEncoding = Raw
	}
	if o.KeyEncoding == "" {
		o.KeyEncoding = Raw
	}
	if o.TopicRegex != "" && o.TopicReplacement == "" {
		o.TopicReplacement = DefaultTopicReplacement
	}
	if o.PayloadField == "" {
		o.PayloadField = "payload"
	}
	return o
}

// Builder builds records. Build is called from one goroutine: its caches are not locked.
type Builder struct {
	o           Options
	router      *router
	headers     []string // the extra values that go into headers by name; the others' names are empty
	nullHeaders []bool   // which of them stand as a null header when NULL
}

// NewBuilder checks o and returns a Builder for it.
func NewBuilder(o Options) (*Builder, error) {
	o = o.WithDefaults()
	for _, enc := range []Encoding{o.ValueEncoding, o.KeyEncoding} {
		if enc != Raw && enc != JSONString && enc != JSONWithSchema && enc != JSONExpanded {
			return nil, fmt.Errorf("unknown encoding %q (want %q, %q, %q or %q)", enc, Raw, JSONString, JSONExpanded, JSONWithSchema)
		}
	}
	if o.ValueEncoding == JSONWithSchema && o.HasEnvelope() {
		return nil, fmt.Errorf("value encoding %q with envelope fields is not supported", JSONWithSchema)
	}
	for _, h := range o.BuiltinHeaders {
		if h != HeaderID && h != HeaderEventType && h != HeaderAggregateType {
			return nil, fmt.Errorf("unknown built-in header %q (want some of %v)", h, BuiltinHeaders)
		}
	}
	if len(o.ExtraPlacement) > 0 && len(o.ExtraPlacement) != len(o.ExtraHeaders) {
		return nil, fmt.Errorf("%d extra placements for %d extra columns", len(o.ExtraPlacement), len(o.ExtraHeaders))
	}
	rt, err := newRouter(o.TopicTemplate)
	if err != nil {
		return nil, fmt.Errorf("topic template: %w", err)
	}
	if o.TopicRegex != "" {
		re, err := NewTopicRegex(o.TopicRegex, o.TopicReplacement)
		if err != nil {
			return nil, err
		}
		rt.regex = &regexRouter{re: re, replacement: o.TopicReplacement, passthrough: o.TopicRegexPassthrough}
	}
	if rt.allow, err = newTopicAllow(o); err != nil {
		return nil, err
	}
	b := &Builder{o: o, router: rt, headers: o.ExtraHeaders}
	if o.ExtraPlacement != nil {
		b.headers = make([]string, len(o.ExtraHeaders))
		b.nullHeaders = make([]bool, len(o.ExtraHeaders))
		for i, p := range o.ExtraPlacement {
			if p == PlaceHeader || p == PlaceHeaderOrNull {
				b.headers[i] = o.ExtraHeaders[i]
			}
			b.nullHeaders[i] = p == PlaceHeaderOrNull
		}
	}
	// A column placed as a header with such a name would let its rows speak for the relay in a
	// dead letter, as a headers member may not (buildHeaders).
	for _, h := range b.headers {
		if strings.HasPrefix(h, DeadLetterHeaderPrefix) {
			return nil, fmt.Errorf("extra header %q uses the prefix %s, which the relay's dead-letter headers own: give the column another alias", h, DeadLetterHeaderPrefix)
		}
	}
	return b, nil
}

// Record is an event as a Kafka record, with what keeps it from going to its topic as it is. The
// message's values alias the event's buffers.
type Record struct {
	Msg       kafka.Message // Topic is the routed name, also when TopicErr says it is not valid
	Partition int           // chosen by the event (PlacePartition), or -1 for the key's

	TopicErr     error // no topic, or one Kafka does not allow
	HeadersErr   error // the headers column, or the aggregate version, is not what a header can be
	PartitionErr error // the partition column is not a partition number
}

// Build builds ev's record; now is its timestamp when the event has neither its own nor a commit
// time.
func (b *Builder) Build(ev *decoder.Event, now time.Time) Record {
	var r Record
	// The key is encoded before partitioning, so murmur2 hashes the same bytes a Java producer
	// with the same converter would.
	r.Msg = kafka.Message{
		Key:   b.key(ev),
		Value: b.value(ev),
		// Set for every path: a dead-lettered record keeps it too (a zero time would be written as
		// 1970, which time-based retention deletes at once).
		Time: recordTime(ev, now),
	}
	r.Msg.Topic, r.TopicErr = b.router.topic(ev)
	var hs []kafka.Header
	hs, r.HeadersErr = buildHeaders(ev, b.o.BuiltinHeaders, b.headers, b.nullHeaders)
	r.Msg.Headers = traceHeaders(hs, ev.SpanContext)
	r.Partition, r.PartitionErr = b.partitionOf(ev)
	return r
}

// value is the record value: the payload in the value encoding, in an envelope with the envelope
// columns, or a tombstone (debezium.go). A NULL payload is a null value (a tombstone) with raw, and
// the JSON null with the JSON encodings, as Kafka Connect's JsonConverter writes a null value that
// has a schema.
func (b *Builder) value(ev *decoder.Event) []byte {
	switch {
	case b.o.TombstoneOnEmptyPayload && blank(ev.Payload):
		return nil
	case ev.Payload == nil && (b.o.ValueEncoding == JSONString || b.o.ValueEncoding == JSONExpanded) && !b.o.HasEnvelope():
		return []byte("null")
	case b.o.HasEnvelope():
		return b.envelope(ev)
	case b.o.ValueEncoding == JSONWithSchema:
		return connectJSONValue(ev.Payload, b.o.PayloadField)
	case b.o.ValueEncoding == JSONExpanded:
		return expandedValue(ev.Payload, b.o.PayloadField)
	}
	return encodeValue(ev.Payload, b.o.ValueEncoding)
}

// key is the record key in the key encoding.
func (b *Builder) key(ev *decoder.Event) []byte { return EncodeKey(ev.AggregateID, b.o.KeyEncoding) }

// EncodeKey encodes a raw aggregate id as record keys are encoded with enc, for tools that
// publish records the relay would have published (redrive).
func EncodeKey(aggregateID []byte, enc Encoding) []byte {
	if enc == JSONWithSchema {
		return connectJSONKey(aggregateID)
	}
	return encodeValue(aggregateID, enc)
}

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

// Placeholders a topic template may use.
const (
	placeholderAggregateType = "{aggregate_type}"
	placeholderEventType     = "{event_type}"
)

// router turns events into topic names. Aggregate and event types are few, so names are cached and
// the hot path does not allocate.
type router struct {
	template string
	byEvent  bool         // the template uses {event_type}, so the cache key must include it
	regex    *regexRouter // routes instead of the template when set (route.topic.regex)
	allow    *topicAllow  // the topics a row may reach
	cache    map[string]string
}

func newRouter(template string) (*router, error) {
	if !strings.Contains(template, placeholderAggregateType) && !strings.Contains(template, placeholderEventType) {
		if err := ValidTopic(template); err != nil {
			return nil, err
		}
	}
	return &router{
		template: template,
		byEvent:  strings.Contains(template, placeholderEventType),
		cache:    make(map[string]string),
	}, nil
}

func (r *router) topic(ev *decoder.Event) (string, error) {
	// Before the cache: a NULL and an empty aggregate type share the cache key "".
	if ev.AggregateType == nil && (r.regex != nil || strings.Contains(r.template, placeholderAggregateType)) {
		return "", fmt.Errorf("event %s has a NULL aggregate type, so topic template %q has no value for %s",
			ev.ID, r.template, placeholderAggregateType)
	}
	if !r.byEvent {
		if t, ok := r.cache[string(ev.AggregateType)]; ok {
			return t, nil
		}
	}
	var t string
	if r.regex != nil {
		var ok bool
		if t, ok = r.regex.route(string(ev.AggregateType)); !ok {
			return t, fmt.Errorf("event %s: aggregate type %q does not match topic_regex, and topic_regex_passthrough is off: %w",
				ev.ID, ev.AggregateType, ErrTopicNotAllowed)
		}
	} else {
		// One pass, so a type that spells a placeholder ("{event_type}") is not expanded again.
		t = strings.NewReplacer(placeholderAggregateType, string(ev.AggregateType),
			placeholderEventType, string(ev.EventType)).Replace(r.template)
	}
	if err := ValidTopic(t); err != nil {
		// The name still goes back with the error: the dead-letter record and the halt log report
		// it as the event's original topic.
		return t, err
	}
	if err := r.allow.check(t); err != nil {
		return t, fmt.Errorf("event %s routes to %w", ev.ID, err)
	}
	// Cache only by aggregate type, and only so many: a bad producer could invent a type per event.
	if !r.byEvent && len(r.cache) < 10000 {
		r.cache[string(ev.AggregateType)] = t
	}
	return t, nil
}

// ValidTopic applies Kafka's rules for topic names, so a bad aggregate type is caught before it
// reaches the producer.
func ValidTopic(t string) error {
	if t == "" || t == "." || t == ".." {
		return fmt.Errorf("topic name %q is not allowed", t)
	}
	if len(t) > 249 {
		return fmt.Errorf("topic name %.40q... is %d characters, Kafka allows 249", t, len(t))
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q contains %q; Kafka allows only letters, digits, '.', '_' and '-'", t, c)
		}
	}
	return nil
}

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
	i, n := 0, len(obj)
	ws := func() {
		for i < n && (obj[i] == ' ' || obj[i] == '\t' || obj[i] == '\n' || obj[i] == '\r') {
			i++
		}
	}
	str := func() ([]byte, bool) { // a string without escapes; i is at its opening quote
		for j := i + 1; j < n; j++ {
			switch c := obj[j]; {
			case c == '"':
				v := obj[i+1 : j : j]
				i = j + 1
				return v, true
			case c == '\\' || c < 0x20:
				return nil, false
			}
		}
		return nil, false
	}
	start := len(hs)
	if !utf8.Valid(obj) {
		return hs, false // encoding/json replaces invalid bytes; so does the careful path
	}
	ws()
	if i >= n || obj[i] != '{' {
		return hs, false
	}
	i++
	ws()
	if i < n && obj[i] == '}' {
		i++
	} else {
		for {
			if i >= n || obj[i] != '"' {
				return hs[:start], false
			}
			key, ok := str()
			if !ok {
				return hs[:start], false
			}
			ws()
			if i >= n || obj[i] != ':' {
				return hs[:start], false
			}
			i++
			ws()
			if i >= n {
				return hs[:start], false
			}
			switch c := obj[i]; {
			case c == '"':
				v, ok := str()
				if !ok {
					return hs[:start], false
				}
				hs = append(hs, kafka.Header{Key: string(key), Value: v})
			case c == 'n' && bytes.HasPrefix(obj[i:], []byte("null")):
				i += 4
			case c == 't' && bytes.HasPrefix(obj[i:], []byte("true")):
				hs = append(hs, kafka.Header{Key: string(key), Value: obj[i : i+4 : i+4]})
				i += 4
			case c == 'f' && bytes.HasPrefix(obj[i:], []byte("false")):
				hs = append(hs, kafka.Header{Key: string(key), Value: obj[i : i+5 : i+5]})
				i += 5
			case c == '-' || c >= '0' && c <= '9':
				j := i
				for j < n && (obj[j] == '-' || obj[j] == '+' || obj[j] == '.' || obj[j] == 'e' || obj[j] == 'E' || obj[j] >= '0' && obj[j] <= '9') {
					j++
				}
				if !json.Valid(obj[i:j]) {
					return hs[:start], false
				}
				hs = append(hs, kafka.Header{Key: string(key), Value: obj[i:j:j]})
				i = j
			default:
				return hs[:start], false // nested values and anything odd take the careful path
			}
			ws()
			if i < n && obj[i] == ',' {
				i++
				ws()
				continue
			}
			if i < n && obj[i] == '}' {
				i++
				break
			}
			return hs[:start], false
		}
	}
	ws()
	if i != n {
		return hs[:start], false
	}
	return hs, true
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

// Encoding says how the payload column becomes the record value.
type Encoding string

const (
	// Raw sends the payload bytes exactly as PostgreSQL outputs them.
	Raw Encoding = "raw"
	// JSONString sends the payload as a JSON string literal, which is what Debezium's
	// JsonConverter with schemas disabled produces for a jsonb column: consumers of a Debezium
	// deployment that used it see byte-identical values.
	JSONString Encoding = "json-string"
)

// encodeValue applies the raw and JSONString encodings. NULL stays NULL.
func encodeValue(payload []byte, enc Encoding) []byte {
	if enc != JSONString || payload == nil {
		return payload
	}
	return appendJSONString(make([]byte, 0, len(payload)+len(payload)/8+2), payload)
}

// appendJSONString quotes s as a JSON string exactly as Jackson, and so Kafka Connect's
// JsonConverter, does: only '"', '\\' and control characters are escaped (\b \t \n \f \r, the
// others as \u00XX in upper-case hex), everything else is copied. encoding/json would differ: it
// escapes '<', '>', '&', U+2028 and U+2029, which are common in payloads.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789ABCDEF"
	dst = append(dst, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c >= 0x20:
			dst = append(dst, c)
		case c == '\b':
			dst = append(dst, '\\', 'b')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\f':
			dst = append(dst, '\\', 'f')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
	}
	return append(dst, '"')
}
