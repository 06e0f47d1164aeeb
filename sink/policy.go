package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/sink/record"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// Reasons an event cannot be published to its own topic; the label of events_failed_total.
const (
	ReasonTooLarge      = "message_too_large"
	ReasonInvalidTopic  = "invalid_topic"
	ReasonBadHeaders    = "invalid_headers"
	ReasonNotAuthorized = "not_authorized" // exactly-once only: a topic the relay may not write (producer.RefusedTopic)
	ReasonRejected      = "rejected_by_broker"
	// ReasonInvalidPartition: the partition column (record.PlacePartition) is not an integer, or
	// names a partition the topic does not have.
	ReasonInvalidPartition = "invalid_partition"
	// ReasonTopicNotAllowed: the event routes to a topic outbox rows may not reach (outside
	// topic_allow, reserved, or not matched by topic_regex). Redrive refuses these: publishing one
	// would write where the row had no right to.
	ReasonTopicNotAllowed = "topic_not_allowed"
	// ReasonInvalidCloudEvent: envelope cloudevents is on and the event cannot be a CloudEvent
	// (record.Record.EnvelopeErr says why); it is never published without its envelope.
	ReasonInvalidCloudEvent = "invalid_cloudevent"
)

// RedriveLedgerSuffix names redrive's ledger topic: the dead-letter topic's name with it appended.
// A ledger entry makes every later redrive skip the dead letter it names, so no event may reach it.
const RedriveLedgerSuffix = ".redriven"

// Headers added to a dead-lettered record, next to the event's own.
const (
	HeaderDLQTopic  = "outbox.dlq.original_topic"
	HeaderDLQKey    = "outbox.dlq.original_key"
	HeaderDLQReason = "outbox.dlq.reason"
	HeaderDLQError  = "outbox.dlq.error"
	HeaderDLQLSN    = "outbox.dlq.lsn"
	// HeaderDLQPartition is the partition the event named for itself (an extra_fields column placed
	// as the partition), when it named one: redrive sends it back there, not to its key's.
	HeaderDLQPartition = "outbox.dlq.original_partition"
	// HeaderDLQFramed, with registry encodings (Config.Serializer), says whether the value is as
	// the Serializer made it ("true": framed, unless only the key is a registry encoding) or the
	// payload as the event held it ("false": it
	// failed, or was rejected, before it was framed). Redrive frames the latter: a payload the
	// application serialized itself (frame-only) may start with a zero byte, like a frame.
	HeaderDLQFramed = "outbox.dlq.framed"
	// HeaderDLQSubject is the schema registry subject of an event that could not be serialized
	// (schema_mismatch, schema_incompatible, schema_rejected from the registry encodings): redrive
	// tells it from a row that lacked a column, and serializes it again.
	HeaderDLQSubject = "outbox.dlq.schema_subject"
)

func eventFields(rec *delivery) []zap.Field {
	return []zap.Field{
		zap.ByteString("event_id", rec.ev.ID),
		zap.ByteString("event_type", rec.ev.EventType),
		zap.ByteString("aggregate_type", rec.ev.AggregateType),
		zap.ByteString("aggregate_id", rec.ev.AggregateID),
		zap.Stringer("lsn", rec.ev.LSN),
		zap.String("topic", rec.topic),
	}
}

// fail applies the failure policy to a record that cannot be published to its own topic. The
// record keeps its limiter capacity until the policy settles it. ctx bounds the wait for the
// dead-letter topic's partitions (Publish passes its caller's context, the partition goroutines the
// sink's own, which Close ends); fail returns ctx's error when ctx ended before the record was
// handed over: it is then neither settled nor failed, and is published again after a restart.
func (s *Sink) fail(ctx context.Context, rec *delivery, reason string, err error) error {
	if s.takeBack(rec, reason, err) {
		return nil // the polling mode retries it later, or hands it to Reject once out of attempts
	}
	s.m.EventsFailed.WithLabelValues(reason).Inc()
	if s.cfg.Policy == Halt {
		s.halt(rec, reason, err)
		return nil
	}
	s.log.Error("event cannot be published to its topic; sending it to the dead-letter topic",
		append(eventFields(rec), zap.String("reason", reason), zap.String("dead_letter_topic", s.cfg.DeadLetterTopic), zap.Error(err))...)
	rec.Msg = s.deadLetterMessage(rec, reason, err)
	rec.Partition = -1        // the dead-letter topic's partition is the key's, whatever the event named
	rec.Enqueued = time.Now() // for the linger and the publish latency; the record keeps the event's timestamp
	if err := s.dead.Enqueue(ctx, &rec.Record); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.halt(rec, ReasonRejected, fmt.Errorf("dead-letter topic %s is unusable: %w", s.cfg.DeadLetterTopic, err))
	}
	return nil
}

// deadLetterMessage builds the record for the dead-letter topic: same key and headers, the payload
// as value, and headers saying where the event was going and why it failed. A payload too large for
// the dead-letter topic too is replaced by a JSON reference to the outbox row.
func (s *Sink) deadLetterMessage(rec *delivery, reason string, cause error) kafka.Message {
	ev := rec.ev
	hs := []kafka.Header{
		{Key: record.HeaderID, Value: ev.ID},
		{Key: record.HeaderEventType, Value: ev.EventType},
		{Key: record.HeaderAggregateType, Value: ev.AggregateType},
	}
	if reason != ReasonBadHeaders {
		for _, h := range rec.Msg.Headers {
			if h.Key != record.HeaderID && h.Key != record.HeaderEventType && h.Key != record.HeaderAggregateType {
				hs = append(hs, h)
			}
		}
	}
	hs = append(hs,
		kafka.Header{Key: HeaderDLQTopic, Value: []byte(rec.topic)},
		kafka.Header{Key: HeaderDLQKey, Value: ev.AggregateID},
		kafka.Header{Key: HeaderDLQReason, Value: []byte(reason)},
		kafka.Header{Key: HeaderDLQError, Value: []byte(cause.Error())},
		kafka.Header{Key: HeaderDLQLSN, Value: []byte(ev.LSN.String())},
	)
	if rec.Partition >= 0 {
		hs = append(hs, kafka.Header{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(rec.Partition))})
	}
	if s.cfg.Serializer != nil {
		hs = append(hs, kafka.Header{Key: HeaderDLQFramed, Value: []byte(strconv.FormatBool(rec.framed))})
	}
	if se := (*schemas.Error)(nil); errors.As(cause, &se) {
		hs = append(hs, kafka.Header{Key: HeaderDLQSubject, Value: []byte(se.Subject)})
	}
	m := kafka.Message{
		Topic:   s.cfg.DeadLetterTopic,
		Key:     ev.AggregateID,
		Value:   rec.Msg.Value,
		Headers: hs,
		Time:    rec.Msg.Time,
	}
	if producer.RecordSize(&m) > s.cfg.MaxMessageBytes {
		ref, _ := json.Marshal(struct {
			EventID       string `json:"event_id"`
			AggregateType string `json:"aggregate_type"`
			AggregateID   string `json:"aggregate_id"`
			EventType     string `json:"event_type"`
			LSN           string `json:"lsn"`
			PayloadBytes  int    `json:"payload_bytes"`
			Note          string `json:"note"`
		}{string(ev.ID), string(ev.AggregateType), string(ev.AggregateID), string(ev.EventType),
			ev.LSN.String(), len(ev.Payload), "payload too large to dead-letter; read it from the outbox table by event_id; a logical decoding message is kept only in the WAL, at lsn"})
		m.Value = ref
		m.Headers = append(m.Headers, kafka.Header{Key: "outbox.dlq.payload_bytes", Value: []byte(strconv.Itoa(len(ev.Payload)))})
	}
	return m
}

// deadLettered is the dead-letter producer's report on a batch.
func (s *Sink) deadLettered(batch []*delivery, err error) {
	if err != nil {
		for _, rec := range batch {
			s.halt(rec, reason(err), fmt.Errorf("dead-letter topic %s refused it too: %w", s.cfg.DeadLetterTopic, err))
		}
		return
	}
	s.topics.available(s.cfg.DeadLetterTopic)
	var bytes int64
	for _, rec := range batch {
		bytes += rec.Size
		s.m.EventsDeadLettered.WithLabelValues(s.labels.of(rec.topic)).Inc()
	}
	s.settle(batch, bytes)
}

// halt stops the sink for good on rec, which is never acknowledged, so the slot's confirmed position
// stays before it and nothing after it is lost; an operator fixes the cause and restarts.
func (s *Sink) halt(rec *delivery, reason string, err error) {
	// The halt holds at the earliest refused record: refusals of several partitions may arrive in
	// any order (a record retried after a transient error is refused last), and a partition may
	// send only what comes before the halt.
	next := &haltState{seq: rec.Seq, txn: rec.Txn, EventID: string(rec.ev.ID), Reason: reason, Err: err}
	earliest := false
	for {
		cur := s.halted.Load()
		if cur != nil && cur.seq <= rec.Seq {
			break
		}
		if s.halted.CompareAndSwap(cur, next) {
			earliest = true
			break
		}
	}
	s.m.Halted.Set(1)
	if s.txn != nil {
		s.txn.c.Wake() // the committer aborts the transaction holding rec
	}
	msg := "halted: event cannot be published; the slot will not advance past it until the cause is fixed and the relay restarted"
	if !earliest {
		msg = "another event cannot be published while halted"
	}
	s.log.Error(msg, append(eventFields(rec), zap.String("reason", reason), zap.Error(err))...)
}
