package sink

import (
	"context"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// ReasonSchemaMismatch: the outbox row was written while the table lacked a mapped column (as
// the replication stream describes the table at that point), so the event cannot be built.
const ReasonSchemaMismatch = "schema_mismatch"

// ReasonInvalidMessage: a transactional logical decoding message with the outbox prefix whose
// content is not an outbox event (not a JSON object, a required member missing or of the wrong
// type); the dead-letter record's value is the content as written.
const ReasonInvalidMessage = "invalid_message"

// ReasonInvalidTimestamp: the timestamp column (columns.timestamp) holds a value that is no Kafka
// record timestamp (infinity, a date BC).
const ReasonInvalidTimestamp = "invalid_timestamp"

// Reject hands ev straight to the failure policy instead of its topic, for an event the relay
// cannot build (reason says why, err the details); ack.Ack(1) is called once the policy has settled
// it, exactly like Publish. ev carries whatever could be read (missing fields are nil): the
// dead-letter record keeps the id, key and headers that exist. Like Publish it blocks while the
// in-flight limits are reached and returns an error only when ctx ends.
func (s *Sink) Reject(ctx context.Context, ev *decoder.Event, reason string, err error, ack Acker) error {
	return s.submit(ctx, ev, ack, reason, err)
}
