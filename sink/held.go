package sink

import (
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// held is the memory a record of size bytes (key, value, headers) keeps alive until Kafka
// acknowledges it, which is what max_in_flight_bytes bounds. The event's fields alias its whole WAL
// message (ev.RawSize: every column of the row, mapped or not, and the decoder's copies), and the
// record aliases the event, except where the sink encodes a copy: a JSON-string key or value, a key or value framed for the schema registry. The
// record's own size still decides whether Kafka can take it (max_message_bytes).
func (s *Sink) held(size int64, ev *decoder.Event) int64 {
	if rc := s.cfg.Record; rc.ValueEncoding == record.JSONString || rc.KeyEncoding == record.JSONString || s.cfg.Serializer != nil {
		return size + ev.RawSize
	}
	return max(size, ev.RawSize)
}
