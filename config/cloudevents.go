package config

import (
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// CloudEvents holds the envelope keys: envelope and cloudevents.* (record.CloudEvents).
type CloudEvents struct {
	Envelope        string // EnvelopeNone or EnvelopeCloudEvents
	Mode            string // structured or binary
	Source          string
	Type            string
	Subject         string
	DataContentType string
}

// Values of envelope.
const (
	EnvelopeNone        = "none"
	EnvelopeCloudEvents = "cloudevents"
)

// cloudEventsSettings are the envelope's keys; settings (keys.go) ends with them.
var cloudEventsSettings = []setting{
	{key: "envelope", see: []string{"migrating-from-debezium.md#CloudEvents", "guarantees.md#Failure policies"}, group: GroupRouting, kind: choices(EnvelopeNone, EnvelopeCloudEvents), def: EnvelopeNone, help: "none, or cloudevents: every record is a CloudEvent 1.0 (Kafka protocol binding) in cloudevents.mode, around the value value_encoding builds (a registry encoding needs cloudevents.mode binary); the key, the routing and the relay's own headers stay. An event the envelope cannot carry goes to the failure policy (reason invalid_cloudevent), never out bare; a tombstone stays a tombstone, its attributes in ce_ headers",
		apply: oneOf(func(c *Config) *string { return &c.CloudEvents.Envelope }, EnvelopeNone, EnvelopeCloudEvents)},
	{key: "cloudevents.mode", see: []string{"migrating-from-debezium.md#CloudEvents"}, group: GroupRouting, kind: choices(record.CloudEventsStructured, record.CloudEventsBinary), def: record.CloudEventsStructured, help: "structured: the value is a JSON CloudEvent (content-type application/cloudevents+json; charset=UTF-8) with the members Debezium's CloudEventsConverter writes, in its order, the encoded value as data (a JSON string with json-string, the document with json-expanded, {schema, payload} with json-with-schema; data_base64 when the content type is not JSON); binary: the value as encoded, the attributes in ce_ headers (ce_specversion, ce_id, ce_source, ce_type, ce_time, and ce_subject, ce_traceparent, ce_tracestate when there are) and content-type the data content type. time is the record timestamp (the commit time, or columns.timestamp) in RFC 3339, UTC, milliseconds (2026-01-13T12:55:39.738Z), as Debezium writes it",
		apply: oneOf(func(c *Config) *string { return &c.CloudEvents.Mode }, record.CloudEventsStructured, record.CloudEventsBinary)},
	{key: "cloudevents.source", group: GroupRouting, kind: kindString, def: record.DefaultCloudEventsSource, help: "the source attribute, a URI-reference; {aggregate_type}, {aggregate_id} and {event_type} are replaced (Debezium writes /debezium/postgresql/<topic.prefix>)",
		apply: str(func(c *Config) *string { return &c.CloudEvents.Source })},
	{key: "cloudevents.type", group: GroupRouting, kind: kindString, def: record.DefaultCloudEventsType, help: "the type attribute; {aggregate_type}, {aggregate_id} and {event_type} are replaced (e.g. com.example.{event_type}); Debezium's converter with the outbox router takes the event type too",
		apply: str(func(c *Config) *string { return &c.CloudEvents.Type })},
	{key: "cloudevents.subject", group: GroupRouting, kind: kindString, help: "the subject attribute, with the same placeholders, e.g. {aggregate_id}; empty, or empty once replaced, sends none",
		apply: str(func(c *Config) *string { return &c.CloudEvents.Subject })},
	{key: "cloudevents.data_content_type", group: GroupRouting, kind: kindString, def: record.DefaultCloudEventsContentType, help: "the datacontenttype attribute (binary: the content-type header); a JSON type (application/json, text/json, *+json; required with a JSON value_encoding) puts the value as data, another (e.g. application/octet-stream for a bytea payload) puts it base64 in data_base64 (structured); with a registry value_encoding the default is its format's (application/avro, application/protobuf, application/json)",
		apply: str(func(c *Config) *string { return &c.CloudEvents.DataContentType })},
}

// RecordCloudEvents is the record builder's CloudEvents option: nil without the envelope.
func (c *Config) RecordCloudEvents() *record.CloudEvents {
	if c.CloudEvents.Envelope != EnvelopeCloudEvents {
		return nil
	}
	ct := c.CloudEvents.DataContentType
	if RegistryEncoding(c.ValueEncoding) && ct == record.DefaultCloudEventsContentType {
		ct = registryMediaTypes[c.ValueEncoding]
	}
	return &record.CloudEvents{Mode: c.CloudEvents.Mode, Source: c.CloudEvents.Source, Type: c.CloudEvents.Type,
		Subject: c.CloudEvents.Subject, DataContentType: ct}
}

// registryMediaTypes are the content-type of a binary CloudEvent whose value a registry encoding
// frames, where cloudevents.data_content_type is left at its default: the data's format (the
// Confluent wire format's magic byte and schema id before it, as every record of the encoding).
var registryMediaTypes = map[string]string{
	EncodingAvro:       "application/avro",
	EncodingProtobuf:   "application/protobuf",
	EncodingJSONSchema: "application/json",
}

// checkCloudEvents checks the envelope keys together with the value encoding.
func (c *Config) checkCloudEvents(p *problems) {
	if ce := c.RecordCloudEvents(); ce != nil {
		enc := record.Encoding(c.ValueEncoding)
		if RegistryEncoding(c.ValueEncoding) {
			// The Builder builds the value raw (the payload) and the sink frames it afterwards:
			// in binary mode the framed value is the data, the attributes stay in headers. A
			// structured envelope would be framed whole, or hold framed bytes as base64 data
			// that no CloudEvents consumer reads through a registry.
			if ce.Mode != record.CloudEventsBinary {
				p.bad("cloudevents.mode", "value_encoding %s with envelope cloudevents needs cloudevents.mode binary (the framed value, the attributes in ce_ headers, content-type %s): a structured CloudEvent around data in a registry encoding is not supported",
					c.ValueEncoding, ce.DataContentType)
				return
			}
			enc = record.Raw
		}
		if err := record.CheckCloudEvents(*ce, enc); err != nil {
			p.bad("envelope", "%v", err)
		}
		return
	}
	// Set to what is not the default, a key would look in effect while it is not.
	ce := c.CloudEvents
	for _, k := range []struct{ key, value, def string }{
		{"cloudevents.mode", ce.Mode, record.CloudEventsStructured},
		{"cloudevents.source", ce.Source, record.DefaultCloudEventsSource},
		{"cloudevents.type", ce.Type, record.DefaultCloudEventsType},
		{"cloudevents.subject", ce.Subject, ""},
		{"cloudevents.data_content_type", ce.DataContentType, record.DefaultCloudEventsContentType},
	} {
		if k.value != k.def {
			p.bad(k.key, "applies with envelope: cloudevents only; remove it or set envelope: cloudevents")
		}
	}
}
