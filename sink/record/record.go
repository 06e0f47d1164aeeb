// Package record turns an outbox event into the Kafka record that carries it: the topic it is
// routed to, its key, its value in the chosen encoding, its headers, its timestamp and, when a
// column says so, its partition; byte for byte what Debezium's outbox event router writes for the
// same row where the two share an option (docs/migrating-from-debezium.md). It does no I/O: what
// happens to a record that cannot be built, or that Kafka refuses, is the sink's policy.
//
// Files by job: the Builder (record.go), the topic (route.go, allow.go), the key (key.go), the
// value (value.go, connectjson.go, debezium.go's envelope), the headers (headers.go) and the
// CloudEvents envelope around them all (cloudevents.go).
package record

import (
	"fmt"
	"strings"
	"time"

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

	// CloudEvents, when set, makes every record a CloudEvent (cloudevents.go).
	CloudEvents *CloudEvents
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
	ce          *cloudEvents
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
	if o.CloudEvents != nil {
		if b.ce, err = newCloudEvents(*o.CloudEvents, o); err != nil {
			return nil, err
		}
	}
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
	// EnvelopeErr says why the event cannot be a CloudEvent (Options.CloudEvents); the record then
	// has no envelope and must not go to its topic.
	EnvelopeErr error
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
	if b.ce != nil && r.HeadersErr == nil {
		r.EnvelopeErr = b.ce.wrap(&r, ev)
	}
	return r
}
