package inbox

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/segmentio/kafka-go"
)

// Header names the relay sets (and the outbox package writes) that a Delivery reads.
const (
	HeaderEventType        = "event_type"
	HeaderAggregateType    = "aggregate_type"
	HeaderAggregateVersion = "aggregate_version"
	HeaderSchemaVersion    = "schema_version"
	// HeaderReplay is "true" on a record `outbox-relay replay` published again.
	HeaderReplay = "outbox.replay"
)

// Delivery is one Kafka record read as an outbox event.
type Delivery struct {
	Message kafka.Message
	ID      string // the id header
	// EventType is the event_type header ("" when the relay does not send it).
	EventType string
	// AggregateType is the aggregate_type header, or the topic when the relay does not send it
	// (builtin_headers without aggregate_type, as in the debezium profile): one topic per
	// aggregate type is the default routing.
	AggregateType string
	AggregateID   string // the record key
	// Version is the aggregate_version header; 0 when the event carries none, and then only the
	// event id tells a duplicate.
	Version int64
	// SchemaVersion is the schema_version header; 1 when the event carries none.
	SchemaVersion int
	// Payload is the record value (a CloudEvent's data), or, once a Registry upcast it, the
	// upcast value.
	Payload []byte
	Replay  bool // the record came from `outbox-relay replay`
	// CloudEvent is the record's CloudEvents envelope (envelope: cloudevents, structured or
	// binary), nil when it has none.
	CloudEvent *CloudEvent
}

// ParseDelivery reads m's headers. Header values that are JSON strings (what Kafka Connect writes
// with the JsonConverter) are unquoted, as EventID does. A CloudEvent (structured or binary) is
// read too: its data is the payload, and its id and type stand for the id and event_type headers
// when the record lacks them.
func ParseDelivery(m kafka.Message) (Delivery, error) {
	ce, err := ParseCloudEvent(m)
	if err != nil {
		return Delivery{}, err
	}
	id, err := eventID(m, ce)
	if err != nil {
		return Delivery{}, err
	}
	d := Delivery{Message: m, ID: id, AggregateID: string(m.Key), SchemaVersion: 1, Payload: m.Value, CloudEvent: ce}
	d.EventType, _ = header(m, HeaderEventType)
	if ce != nil {
		d.Payload = ce.Data
		if d.EventType == "" {
			d.EventType = ce.Type
		}
	}
	var ok bool
	if d.AggregateType, ok = header(m, HeaderAggregateType); !ok || d.AggregateType == "" {
		d.AggregateType = m.Topic
	}
	if v, ok := header(m, HeaderAggregateVersion); ok {
		if d.Version, err = strconv.ParseInt(v, 10, 64); err != nil || d.Version < 0 {
			return Delivery{}, fmt.Errorf("inbox: event %s: header %s = %q is not a version (a non-negative integer)", id, HeaderAggregateVersion, v)
		}
	}
	if v, ok := header(m, HeaderSchemaVersion); ok {
		if d.SchemaVersion, err = strconv.Atoi(v); err != nil || d.SchemaVersion < 1 {
			return Delivery{}, fmt.Errorf("inbox: event %s: header %s = %q is not a schema version (a positive integer)", id, HeaderSchemaVersion, v)
		}
	}
	if v, _ := header(m, HeaderReplay); v == "true" {
		d.Replay = true
	}
	return d, nil
}

// header returns the last value of the header name (as Java's Headers.lastHeader), unquoted when
// it is a JSON string.
func header(m kafka.Message, name string) (string, bool) {
	var v []byte
	found := false
	for _, h := range m.Headers {
		if h.Key == name {
			v, found = h.Value, true
		}
	}
	if !found {
		return "", false
	}
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			return s, true
		}
	}
	return string(v), true
}

// Outcome is what Consumer.Handle did with a delivery.
type Outcome uint8

const (
	// Applied ("new"): the event was the aggregate's next version (or an unversioned event not
	// seen before) and was applied.
	Applied Outcome = iota + 1
	// Duplicate: the consumer applied this event before (its id is recorded); skipped.
	Duplicate
	// Stale: older than the version the consumer applied, and not applied itself (the state was
	// reloaded past it); skipped.
	Stale
	// Gap: versions between the applied one and this one are missing; the GapPolicy decided.
	Gap
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "new"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	case Gap:
		return "gap"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}
