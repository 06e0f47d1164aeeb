package sink

import (
	"context"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// ReasonSchemaMismatch: the outbox row was written while the table lacked a mapped column (as
// the replication stream describes the table at that point), so the event cannot be built.
const ReasonSchemaMismatch = "schema_mismatch"

// Reject hands ev straight to the failure policy instead of its topic, for an event the relay
// cannot build (reason says why, err the details); ack.Ack(1) is called once the policy has settled
// it, exactly like Publish. ev carries whatever could be read (missing fields are nil): the
// dead-letter record keeps the id, key and headers that exist. Like Publish it blocks while the
// in-flight limits are reached and returns an error only when ctx ends.
func (s *Sink) Reject(ctx context.Context, ev *decoder.Event, reason string, err error, ack Acker) error {
	if s.halted.Load() != nil {
		<-ctx.Done()
		return ctx.Err()
	}
	rec := &record{ev: ev, ack: ack}
	rec.msg = kafka.Message{
		Key:   encodeValue(ev.AggregateID, s.cfg.KeyEncoding),
		Value: encodeValue(ev.Payload, s.cfg.ValueEncoding),
	}
	// The topic the event would have gone to, when it can be told: the dead-letter headers say so.
	if topic, routeErr := s.router.topic(ev); routeErr == nil {
		rec.topic = topic
	}
	rec.msg.Topic = rec.topic
	if hs, hdrErr := buildHeaders(ev, s.cfg.BuiltinHeaders, s.cfg.ExtraHeaders); hdrErr == nil {
		rec.msg.Headers = hs
	}
	rec.size = int64(recordSize(&rec.msg))
	if err := s.limit.acquire(ctx, rec.size); err != nil {
		return err
	}
	s.m.InFlightEvents.Inc()
	s.m.InFlightBytes.Add(float64(rec.size))
	s.fail(rec, reason, err)
	return nil
}
