package positions

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// ErrRefused marks a positions topic the relay may not write: no Kafka transaction can commit
// without its position, so unlike an event's topic it ends the relay with the fix (a fresh start
// would abort the same transaction again, for ever).
var ErrRefused = errors.New("kafka refused the relay's principal on the positions topic, so no Kafka transaction can commit")

// WriterConfig is what a Writer writes through: the producer and the committer of the Kafka
// transactions that carry the events, and their client.
type WriterConfig struct {
	Topic     string // the positions topic
	ID        string // the transactional id: the records' key
	Client    *kafka.Client
	Identity  *producer.Identity
	Committer *producer.Committer
	Producer  *producer.Producer // the events' producer, under the committer's transactional id
	// Retrying is told of each transient failure of a write before it is retried, as the
	// producer's own Config.Retrying is (the sink logs it and counts it).
	Retrying func(topic string, partition, records int, err error, delay time.Duration)
	Log      *zap.Logger
}

// Writer writes the position record of each Kafka transaction into the positions partition of
// its transactional id, numbered by the producer's identity like the events' records.
type Writer struct {
	cfg WriterConfig

	mu    sync.Mutex
	tp    producer.TopicPartition
	ready bool
	ps    producer.State // the next position record's; only the committer uses it once ready
}

// NewWriter returns a writer of cfg's positions; it does not contact Kafka (see Resolve).
func NewWriter(cfg WriterConfig) *Writer { return &Writer{cfg: cfg} }

// Partition returns the positions partition once resolved.
func (w *Writer) Partition() (producer.TopicPartition, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tp, w.ready
}

// Resolve learns the positions partition (creating the topic if it is missing, checking it
// otherwise) and the producer state it starts from.
func (w *Writer) Resolve(ctx context.Context) error {
	if _, ready := w.Partition(); ready {
		return nil
	}
	c := w.cfg
	partition, _, err := Partition(ctx, c.Client, c.Topic, c.ID, c.Log)
	if err != nil {
		return err
	}
	if err := CheckTopic(ctx, c.Client, c.Topic, c.Log); err != nil {
		return err
	}
	ps, err := c.Identity.Get(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	if !w.ready {
		w.tp, w.ps, w.ready = producer.TopicPartition{Topic: c.Topic, Partition: partition}, ps, true
	}
	w.mu.Unlock()
	return nil
}

// Write produces pos, inside the committer's current transaction, retrying in place what heals,
// and returns the record's offset (-1 if the broker did not say). written is where the
// transaction's records lie, kept with the position for the next start to check
// (producer.Committer.Settle). Only the committer calls it (producer.Owner.BeforeCommit).
func (w *Writer) Write(ctx context.Context, pos Position, written map[producer.TopicPartition]producer.Span) (int64, error) {
	c := w.cfg
	if err := w.Resolve(ctx); err != nil {
		return -1, err
	}
	if err := c.Committer.Add(ctx, w.tp); err != nil {
		if errors.Is(err, producer.ErrTopicRefused) {
			return -1, refused(w.tp.Topic, err)
		}
		return -1, err
	}
	now := time.Now()
	rec := &producer.Record{Msg: kafka.Message{Topic: w.tp.Topic, Partition: w.tp.Partition, Key: []byte(c.ID), Value: Encode(pos, written), Time: now}}
	rec.Size = int64(producer.RecordSize(&rec.Msg))
	ps := w.ps
	for attempt := 0; ; attempt++ {
		err := c.Producer.Produce(w.tp, []*producer.Record{rec}, ps)
		if err == nil || errors.Is(err, kafka.DuplicateSequenceNumber) {
			w.ps.Seq = producer.NextSequence(ps.Seq, 1)
			return rec.Offset, nil
		}
		if errors.Is(err, kafka.TopicAuthorizationFailed) {
			return -1, refused(w.tp.Topic, err)
		}
		if producer.Permanent(err) || producer.SequenceLost(err) || producer.ProducerRefused(err) || producer.TransactionFailed(err) {
			return -1, fmt.Errorf("write the position to %s: %w", w.tp.Topic, err)
		}
		delay := producer.Backoff(attempt)
		c.Retrying(w.tp.Topic, w.tp.Partition, 1, err, delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return -1, ctx.Err()
		}
	}
}

// refused is the error of a positions topic the relay may not write (ErrRefused),
// naming the Kafka error without the event topics' wording of err.
func refused(topic string, err error) error {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		err = kerr
	}
	return fmt.Errorf("%w (topic %s: %v); grant the relay's principal Write, Describe and Read on positions_topic %s", ErrRefused, topic, err, topic)
}
