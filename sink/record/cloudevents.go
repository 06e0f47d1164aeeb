package record

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// CloudEvents (https://cloudevents.io, specification 1.0, and its Kafka protocol binding) around
// the record the other options build: the key, the routing and the value encoding stay as they
// are, and the event becomes a CloudEvent in one of the binding's two content modes.
//
//   - Structured: the value is a JSON CloudEvent (content-type application/cloudevents+json), the
//     attributes named and ordered as Debezium's CloudEventsConverter writes them (id, source,
//     specversion, type, time, datacontenttype, then the optional ones, then data). The data is
//     the value the value encoding built: a JSON value as it is when datacontenttype is JSON (a
//     JSON string with json-string, the document with json-expanded, the schema and payload
//     object with json-with-schema), else base64 in data_base64, as the JSON event format says.
//   - Binary: the value is the encoded value itself; the attributes are headers prefixed ce_
//     (ce_specversion, ce_id, ce_source, ce_type, ce_time, ce_subject) and content-type carries
//     datacontenttype.
//
// The relay's own headers (id, event_type, aggregate_type, the extra columns, the headers column)
// stay in both modes, so consumers that read them keep working. A record with a null value (a
// tombstone: tombstone_on_empty_payload, or a NULL payload with raw) stays a tombstone in both
// modes, its attributes in ce_ headers: a structured envelope would end what the tombstone is for.
//
// An event the envelope cannot carry (an empty or non-UTF-8 id, type or source, a payload that is
// not the JSON its datacontenttype says, a headers member that would be read as an attribute) has
// Record.EnvelopeErr set; the sink sends it to the failure policy (reason invalid_cloudevent), and
// never publishes it without its envelope.

// CloudEvents modes.
const (
	CloudEventsStructured = "structured"
	CloudEventsBinary     = "binary"
)

// Defaults of CloudEvents' options.
const (
	DefaultCloudEventsSource      = "/outbox-relay/" + placeholderAggregateType
	DefaultCloudEventsType        = placeholderEventType
	DefaultCloudEventsContentType = "application/json"
)

// placeholderAggregateID is the aggregate id, in CloudEvents' templates only (a topic named by it
// would be a topic per aggregate).
const placeholderAggregateID = "{aggregate_id}"

// The CloudEvents spec version, and the media type of a structured event in the JSON format.
const (
	CloudEventsSpecVersion     = "1.0"
	CloudEventsJSONContentType = "application/cloudevents+json; charset=UTF-8"
	HeaderContentType          = "content-type"
	CloudEventsHeaderPrefix    = "ce_"
)

// CloudEvents says how events become CloudEvents. Source, Type and Subject are templates where
// {aggregate_type}, {aggregate_id} and {event_type} stand for the event's values.
type CloudEvents struct {
	Mode            string // CloudEventsStructured (default) or CloudEventsBinary
	Source          string // the source attribute; default DefaultCloudEventsSource
	Type            string // the type attribute; default DefaultCloudEventsType (the event type)
	Subject         string // the subject attribute; "" sends none
	DataContentType string // the datacontenttype attribute; default DefaultCloudEventsContentType
}

// withDefaults returns c with its zero values replaced by the defaults.
func (c CloudEvents) withDefaults() CloudEvents {
	if c.Mode == "" {
		c.Mode = CloudEventsStructured
	}
	if c.Source == "" {
		c.Source = DefaultCloudEventsSource
	}
	if c.Type == "" {
		c.Type = DefaultCloudEventsType
	}
	if c.DataContentType == "" {
		c.DataContentType = DefaultCloudEventsContentType
	}
	return c
}

// CheckCloudEvents checks CloudEvents options as NewBuilder does, for the configuration's errors.
// The value encoding must be one the Builder applies itself: an encoding framed later for a
// schema registry would replace the envelope's value, or leave its content-type wrong.
func CheckCloudEvents(c CloudEvents, valueEncoding Encoding) error {
	switch valueEncoding {
	case "", Raw, JSONString, JSONExpanded, JSONWithSchema:
	default:
		return fmt.Errorf("value encoding %s with envelope cloudevents is not supported: the envelope composes with raw, json-string, json-expanded and json-with-schema", valueEncoding)
	}
	_, err := newCloudEvents(c, Options{ValueEncoding: valueEncoding}.WithDefaults())
	return err
}

// cloudEvents wraps built records in their envelope. Build's goroutine alone uses it.
type cloudEvents struct {
	binary                bool
	source, typ, subject  template
	contentType           []byte
	jsonData              bool   // datacontenttype is JSON: data is the value itself
	contentTypeJSONString []byte // datacontenttype as a JSON string, for the structured envelope
	// Header values every record shares (a header value is never written to).
	specVersion, structuredContentType []byte
}

func newCloudEvents(c CloudEvents, o Options) (*cloudEvents, error) {
	c = c.withDefaults()
	if c.Mode != CloudEventsStructured && c.Mode != CloudEventsBinary {
		return nil, fmt.Errorf("cloudevents mode %q: want %s or %s", c.Mode, CloudEventsStructured, CloudEventsBinary)
	}
	mediaType, _, err := mime.ParseMediaType(c.DataContentType)
	if err != nil || !strings.Contains(mediaType, "/") {
		return nil, fmt.Errorf("cloudevents data content type %q is not a media type such as application/json", c.DataContentType)
	}
	ce := &cloudEvents{binary: c.Mode == CloudEventsBinary, contentType: []byte(c.DataContentType), jsonData: jsonMediaType(mediaType),
		specVersion: []byte(CloudEventsSpecVersion), structuredContentType: []byte(CloudEventsJSONContentType)}
	ce.contentTypeJSONString = appendJSONString(nil, ce.contentType)
	if o.ValueEncoding != Raw && !ce.jsonData {
		return nil, fmt.Errorf("cloudevents data content type %q says the data is not JSON, and value encoding %s makes it JSON: use application/json, or value encoding raw", c.DataContentType, o.ValueEncoding)
	}
	for _, t := range []struct {
		name, text string
		dst        *template
	}{{"source", c.Source, &ce.source}, {"type", c.Type, &ce.typ}, {"subject", c.Subject, &ce.subject}} {
		if *t.dst, err = parseTemplate(t.text); err != nil {
			return nil, fmt.Errorf("cloudevents %s %q: %w", t.name, t.text, err)
		}
	}
	if !ce.source.dynamic() {
		if err := checkSource(c.Source); err != nil {
			return nil, fmt.Errorf("cloudevents source %q: %w", c.Source, err)
		}
	}
	for _, h := range o.ExtraHeaders {
		if err := cloudEventsHeader(h); err != nil {
			return nil, fmt.Errorf("extra header %q: %w: give the column another alias", h, err)
		}
	}
	return ce, nil
}

// jsonMediaType reports whether a media type (without parameters) is JSON, as the CloudEvents JSON
// format tells: application/json, text/json or a +json suffix.
func jsonMediaType(t string) bool {
	t = strings.ToLower(t)
	return t == "application/json" || t == "text/json" || strings.HasSuffix(t, "+json")
}

// cloudEventsHeader refuses a header name that a CloudEvents consumer would read as one of the
// envelope's attributes.
func cloudEventsHeader(name string) error {
	switch {
	case strings.EqualFold(name, HeaderContentType):
		return errors.New("the content-type header is the CloudEvents envelope's")
	case len(name) >= len(CloudEventsHeaderPrefix) && strings.EqualFold(name[:len(CloudEventsHeaderPrefix)], CloudEventsHeaderPrefix):
		return fmt.Errorf("a header starting with %s is a CloudEvents attribute", CloudEventsHeaderPrefix)
	}
	return nil
}

// wrap puts r, built from ev, in its envelope: the value in structured mode, headers in binary
// mode and for a tombstone.
func (ce *cloudEvents) wrap(r *Record, ev *decoder.Event) error {
	for _, h := range r.Msg.Headers {
		if err := cloudEventsHeader(h.Key); err != nil {
			return fmt.Errorf("headers member %q: %w: rename the member", h.Key, err)
		}
	}
	a, err := ce.attributes(ev, r.Msg.Time)
	if err != nil {
		return err
	}
	if ce.binary || r.Msg.Value == nil {
		hs := r.Msg.Headers
		hs = append(hs,
			kafka.Header{Key: "ce_specversion", Value: ce.specVersion},
			kafka.Header{Key: "ce_id", Value: ev.ID},
			kafka.Header{Key: "ce_source", Value: a.source},
			kafka.Header{Key: "ce_type", Value: a.typ},
			kafka.Header{Key: "ce_time", Value: a.time.AppendFormat(make([]byte, 0, len(timeFormat)), timeFormat)})
		if a.subject != nil {
			hs = append(hs, kafka.Header{Key: "ce_subject", Value: a.subject})
		}
		if tp := headerValue(r.Msg.Headers, "traceparent"); tp != nil {
			hs = append(hs, kafka.Header{Key: "ce_traceparent", Value: tp})
			if ts := headerValue(r.Msg.Headers, "tracestate"); ts != nil {
				hs = append(hs, kafka.Header{Key: "ce_tracestate", Value: ts})
			}
		}
		if r.Msg.Value != nil {
			hs = append(hs, kafka.Header{Key: HeaderContentType, Value: ce.contentType})
		}
		r.Msg.Headers = hs
		return nil
	}
	data := r.Msg.Value
	if ce.jsonData && !json.Valid(data) {
		return fmt.Errorf("event %s: the payload is not JSON, and cloudevents.data_content_type %s says the data is: set it to the payload's media type (the data then goes base64 in data_base64), or fix the row", ev.ID, ce.contentType)
	}
	out := make([]byte, 0, len(data)+len(ev.ID)+len(a.source)+len(a.typ)+len(a.subject)+160)
	out = append(out, `{"id":`...)
	out = appendJSONString(out, ev.ID)
	out = append(out, `,"source":`...)
	out = appendJSONString(out, a.source)
	out = append(out, `,"specversion":"`+CloudEventsSpecVersion+`","type":`...)
	out = appendJSONString(out, a.typ)
	out = append(out, `,"time":"`...)
	out = a.time.AppendFormat(out, timeFormat)
	out = append(out, `","datacontenttype":`...)
	out = append(out, ce.contentTypeJSONString...)
	if a.subject != nil {
		out = append(out, `,"subject":`...)
		out = appendJSONString(out, a.subject)
	}
	// The distributed tracing extension, as Debezium's opentelemetry.tracing.attributes.enable adds it.
	if tp := headerValue(r.Msg.Headers, "traceparent"); tp != nil {
		out = append(out, `,"traceparent":`...)
		out = appendJSONString(out, validUTF8(tp)) // an extra_headers column may hold any bytes: the envelope stays JSON
		if ts := headerValue(r.Msg.Headers, "tracestate"); ts != nil {
			out = append(out, `,"tracestate":`...)
			out = appendJSONString(out, validUTF8(ts))
		}
	}
	if ce.jsonData {
		out = append(out, `,"data":`...)
		out = append(out, bytes.TrimSpace(data)...)
	} else {
		out = append(out, `,"data_base64":"`...)
		out = base64.StdEncoding.AppendEncode(out, data)
		out = append(out, '"')
	}
	r.Msg.Value = append(out, '}')
	r.Msg.Headers = append(r.Msg.Headers, kafka.Header{Key: HeaderContentType, Value: ce.structuredContentType})
	return nil
}

// attrs are an event's CloudEvents attributes besides its id; subject is nil when there is none.
type attrs struct {
	source, typ, subject []byte
	time                 time.Time
}

// timeFormat is RFC 3339 in UTC with milliseconds, as Debezium writes time
// (2020-01-13T13:55:39.738Z).
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

func (ce *cloudEvents) attributes(ev *decoder.Event, t time.Time) (attrs, error) {
	var a attrs
	if len(ev.ID) == 0 || !utf8.Valid(ev.ID) {
		return a, fmt.Errorf("event id %.40q is empty or not UTF-8, and a CloudEvent's id must be a non-empty string", ev.ID)
	}
	a.source = ce.source.expand(ev)
	if ce.source.dynamic() {
		if err := checkSource(string(a.source)); err != nil {
			return a, fmt.Errorf("event %s: cloudevents source %.60q: %w", ev.ID, a.source, err)
		}
	}
	a.typ = ce.typ.expand(ev)
	if len(a.typ) == 0 || !utf8.Valid(a.typ) {
		return a, fmt.Errorf("event %s: cloudevents type %.60q is empty or not UTF-8 (event type %.40q), and a CloudEvent's type must be a non-empty string", ev.ID, a.typ, ev.EventType)
	}
	if ce.subject.set() {
		if s := ce.subject.expand(ev); len(s) > 0 {
			if !utf8.Valid(s) {
				return a, fmt.Errorf("event %s: cloudevents subject %.60q is not UTF-8", ev.ID, s)
			}
			a.subject = s
		}
	}
	a.time = t.UTC()
	return a, nil
}

// checkSource checks a source attribute: a non-empty URI-reference (RFC 3986), UTF-8.
func checkSource(s string) error {
	if s == "" {
		return errors.New("a CloudEvent's source must be a non-empty URI-reference")
	}
	if !utf8.ValidString(s) || strings.ContainsAny(s, " \t\r\n\"<>\\^`{|}") {
		return errors.New("not a URI-reference: spaces, quotes and the characters <>\\^`{|} must be percent-encoded")
	}
	if _, err := url.Parse(s); err != nil {
		return fmt.Errorf("not a URI-reference: %w", err)
	}
	return nil
}

// headerValue returns the last value of the header name in hs, or nil.
func headerValue(hs []kafka.Header, name string) []byte {
	var v []byte
	for _, h := range hs {
		if h.Key == name {
			v = h.Value
		}
	}
	return v
}

// template is a CloudEvents attribute template: literal text and placeholders.
type template struct {
	text   string
	parts  []templatePart
	static []byte // the text, when it has no placeholder
	// by caches expansions by the value of the template's one placeholder when that is the
	// aggregate or event type: there are few of them, and the hot path then does not allocate.
	by    func(*decoder.Event) []byte
	cache map[string][]byte
}

// templateCacheSize bounds a template's cache: rows inventing types cannot grow it for ever.
const templateCacheSize = 1024

type templatePart struct {
	literal string
	field   func(*decoder.Event) []byte // nil for a literal
}

func parseTemplate(text string) (template, error) {
	t := template{text: text}
	fields := map[string]func(*decoder.Event) []byte{
		placeholderAggregateType: func(ev *decoder.Event) []byte { return ev.AggregateType },
		placeholderAggregateID:   func(ev *decoder.Event) []byte { return ev.AggregateID },
		placeholderEventType:     func(ev *decoder.Event) []byte { return ev.EventType },
	}
	rest := text
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			t.parts = append(t.parts, templatePart{literal: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, templatePart{literal: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return t, fmt.Errorf("unclosed { (placeholders: %s, %s, %s)", placeholderAggregateType, placeholderAggregateID, placeholderEventType)
		}
		name := rest[i : i+j+1]
		f, ok := fields[name]
		if !ok {
			return t, fmt.Errorf("unknown placeholder %s (want %s, %s or %s)", name, placeholderAggregateType, placeholderAggregateID, placeholderEventType)
		}
		t.parts = append(t.parts, templatePart{field: f})
		rest = rest[i+j+1:]
	}
	if !t.dynamic() && text != "" {
		t.static = []byte(text)
	}
	if strings.Count(text, "{") == 1 && !strings.Contains(text, placeholderAggregateID) && len(t.parts) > 1 {
		for _, p := range t.parts {
			if p.field != nil {
				t.by, t.cache = p.field, make(map[string][]byte)
			}
		}
	}
	return t, nil
}

func (t template) set() bool { return t.text != "" }

func (t template) dynamic() bool {
	for _, p := range t.parts {
		if p.field != nil {
			return true
		}
	}
	return false
}

// expand returns the template's text for ev: aliasing ev's buffer when the template is a single
// placeholder, a new slice otherwise.
func (t template) expand(ev *decoder.Event) []byte {
	switch {
	case !t.dynamic():
		return t.static
	case len(t.parts) == 1 && t.parts[0].field != nil:
		return t.parts[0].field(ev)
	case t.by != nil:
		if v, ok := t.cache[string(t.by(ev))]; ok {
			return v
		}
	}
	var out []byte
	for _, p := range t.parts {
		if p.field != nil {
			out = append(out, p.field(ev)...)
		} else {
			out = append(out, p.literal...)
		}
	}
	if t.by != nil {
		if len(t.cache) >= templateCacheSize {
			clear(t.cache)
		}
		t.cache[string(t.by(ev))] = out
	}
	return out
}
