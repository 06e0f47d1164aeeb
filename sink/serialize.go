package sink

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/sink/producer"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Serializer frames a record's key and value with a schema registry's schema ids
// (*schemas.Serializer): key is the aggregate id, value the payload, as package record built them.
// An error schemas.Permanent names is the event's fault; any other is the registry's.
type Serializer interface {
	Serialize(ctx context.Context, topic, eventType string, key, value []byte) (k, v []byte, err error)
}

// ReasonSchemaIncompatible: the schema inferred from the payload is not compatible with its
// subject's versions under the subject's compatibility rule (value_encoding avro with
// schema_registry.auto_register). A payload that does not fit a strict subject's schema fails with
// ReasonSchemaMismatch, naming the field.
const ReasonSchemaIncompatible = schemas.ReasonIncompatible

// ReasonSchemaRejected: the registry refused the schema inferred from the payload as invalid.
const ReasonSchemaRejected = schemas.ReasonRejected

// registryGrace is how long events wait for the registry before /readyz names the wait: a
// registry restart or a slow answer is not worth an alarm.
const registryGrace = 10 * time.Second

// registryWait is the wait for the schema registry in progress, for Stalled.
type registryWait struct {
	mu    sync.Mutex
	since time.Time // zero when not waiting
}

// serialize frames built's key and value through the Serializer. While the registry cannot
// answer, the event waits, retried with backoff: nothing is published unframed, nothing skipped,
// and since the event takes no position in the window before it is framed, everything after it
// waits too (the stream holds; the slot is not confirmed past what Kafka has). It returns the
// failure reason and the error of an event that cannot be serialized, or ctx's error.
func (s *Sink) serialize(ctx context.Context, ev *decoder.Event, built *record.Record) (reason string, cause, ctxErr error) {
	for attempt := 0; ; attempt++ {
		k, v, err := s.cfg.Serializer.Serialize(ctx, built.Msg.Topic, string(ev.EventType), built.Msg.Key, built.Msg.Value)
		if err == nil {
			built.Msg.Key, built.Msg.Value = k, v
			s.registryWaited(attempt)
			return "", nil, nil
		}
		if ctx.Err() != nil {
			return "", nil, ctx.Err()
		}
		if r, ok := schemas.Permanent(err); ok {
			s.registryWaited(attempt)
			return r, err, nil
		}
		s.reg.mu.Lock()
		if s.reg.since.IsZero() {
			s.reg.since = time.Now()
		}
		s.reg.mu.Unlock()
		delay := producer.Backoff(attempt)
		// A constant message: the log sampler collapses an outage's retries.
		s.log.Warn("schema registry cannot serve the event; it waits, and every event after it, retrying",
			zap.ByteString("event_id", ev.ID), zap.String("topic", built.Msg.Topic), zap.Int("attempt", attempt+1),
			zap.Duration("retry_in", delay), zap.Error(err))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-s.failed:
			return "", nil, s.Err()
		}
	}
}

// registryWaited ends a wait for the registry, if attempt says there was one.
func (s *Sink) registryWaited(attempt int) {
	if attempt == 0 {
		return
	}
	s.reg.mu.Lock()
	waited := time.Since(s.reg.since)
	s.reg.since = time.Time{}
	s.reg.mu.Unlock()
	s.log.Info("schema registry serves events again", zap.Duration("waited", waited.Round(time.Millisecond)))
}

// registryStalled reports, for /readyz, a wait for the registry past registryGrace.
func (s *Sink) registryStalled() (string, bool) {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	if s.reg.since.IsZero() || time.Since(s.reg.since) < registryGrace {
		return "", false
	}
	// Not the error's text: /readyz is unauthenticated, and registry errors name hosts. The log
	// line of each retry has it.
	return fmt.Sprintf("waiting for the schema registry for %s; every later event waits behind it (the relay's log says why)",
		time.Since(s.reg.since).Round(time.Second)), true
}
