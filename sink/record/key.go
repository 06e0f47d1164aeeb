package record

import (
	"github.com/outbox-relay/outbox-relay/decoder"
)

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
