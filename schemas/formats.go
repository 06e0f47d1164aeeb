package schemas

import (
	"fmt"

	"github.com/outbox-relay/outbox-relay/schemas/avro"
	"github.com/outbox-relay/outbox-relay/schemas/jsonschema"
	"github.com/outbox-relay/outbox-relay/schemas/protobuf"
)

// Value encodings (value_encoding) framed through a schema registry, by the name the
// configuration gives them.
const (
	EncodingAvro       = "avro"
	EncodingProtobuf   = "protobuf"
	EncodingJSONSchema = "json-schema"
)

// ValueFormat returns the Format of a registry value encoding: avro (schemas/avro), protobuf
// (schemas/protobuf) or json-schema (schemas/jsonschema). Each package's doc says how a JSON
// payload maps to its schemas.
func ValueFormat(encoding string) (Format, error) {
	switch encoding {
	case EncodingAvro:
		return avro.New(), nil
	case EncodingProtobuf:
		return protobuf.New(), nil
	case EncodingJSONSchema:
		return jsonschema.New(), nil
	}
	return nil, fmt.Errorf("value_encoding %q is not framed through a schema registry (want %s, %s or %s)", encoding, EncodingAvro, EncodingProtobuf, EncodingJSONSchema)
}

// Formats returns every format, for a Deserializer that reads whatever the registry's schema
// type says (a consumer, redrive, replay).
func Formats() []Format {
	return []Format{avro.New(), protobuf.New(), jsonschema.New()}
}
