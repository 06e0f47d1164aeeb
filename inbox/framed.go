package inbox

import (
	"context"
	"fmt"
	"strconv"

	"github.com/segmentio/kafka-go"
)

// Framed is what reads registry-framed bytes (the Confluent wire format) back as JSON:
// *schemas.Deserializer, built with the registry's URL (a *schemaregistry.Client or a
// schemas.ClientRegistry) and the formats to read.
type Framed interface {
	Decode(ctx context.Context, framed []byte) (doc []byte, schemaID int, err error)
}

// Unframe returns m with its key and value read back through the registry, for a relay that
// writes a registry encoding (value_encoding avro, protobuf or json-schema, key_encoding avro; a
// Deserializer of schemas.Formats() reads them all): the value as the JSON document the payload
// was, the key as the aggregate id (an Avro string, unquoted). A key or value that is not framed (magic
// byte 0 and a schema id) is left as it is, so one consumer reads a topic while its encoding
// changes; a null value (a tombstone) stays null. Pass the result to ParseDelivery or Consumer.
// An error (the registry cannot answer, a schema id it does not know) leaves the record unread:
// do not commit its offset.
func Unframe(ctx context.Context, f Framed, m kafka.Message) (kafka.Message, error) {
	if framed(m.Value) {
		doc, id, err := f.Decode(ctx, m.Value)
		if err != nil {
			return m, fmt.Errorf("inbox: %s/%d@%d: the value (schema id %d): %w", m.Topic, m.Partition, m.Offset, id, err)
		}
		m.Value = doc
	}
	if framed(m.Key) {
		doc, id, err := f.Decode(ctx, m.Key)
		if err != nil {
			return m, fmt.Errorf("inbox: %s/%d@%d: the key (schema id %d): %w", m.Topic, m.Partition, m.Offset, id, err)
		}
		if s, err := strconv.Unquote(string(doc)); err == nil {
			doc = []byte(s) // a string key, as the relay writes the aggregate id
		}
		m.Key = doc
	}
	return m, nil
}

// framed says whether b starts like the Confluent wire format: magic byte 0 and a 4-byte id. A
// JSON document or an aggregate id as text never starts with byte 0.
func framed(b []byte) bool { return len(b) >= 5 && b[0] == 0 }
