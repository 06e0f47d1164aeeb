package record

import (
	"github.com/outbox-relay/outbox-relay/decoder"
)

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
