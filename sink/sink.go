// Package sink publishes outbox events to Kafka and reports each one back once Kafka has
// acknowledged it (acks=all) or the failure policy has settled it.
//
// Ordering: kafka-go's Writer keeps one goroutine per partition that writes batches in order and
// retries a failed batch in place; with retryTransport and unlimited attempts nothing short of a
// permanent broker error ends a batch, so a later batch of a partition never overtakes an earlier
// one. Keys are partitioned with murmur2 exactly like the Java client, so a topic written by
// Debezium keeps its key-to-partition mapping.
package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// Policy says what happens to an event that cannot be published to its topic.
type Policy string

const (
	// DeadLetter publishes the event to the dead-letter topic, with headers saying where it was
	// going and why it failed, and then counts it as done.
	DeadLetter Policy = "dead-letter"
	// Halt stops publishing and never acknowledges the event, so the slot stops advancing; the
	// process stays up, not ready, until an operator intervenes.
	Halt Policy = "halt"
)

// Config configures a Sink. Zero values get the defaults noted.
type Config struct {
	Brokers         []string
	TopicTemplate   string        // default "outbox.event.{aggregate_type}"
	BuiltinHeaders  []string      // subset of BuiltinHeaders to send; default all
	ExtraHeaders    []string      // header names for decoder.Event.Extra values, in order
	ValueEncoding   ValueEncoding // default ValueRaw
	KeyEncoding     ValueEncoding // default ValueRaw; ValueJSONString matches Connect's JsonConverter keys
	MaxMessageBytes int           // largest record accepted; default 1048576 (Kafka's max.request.size)
	BatchSize       int           // records per produce request and partition; default 500
	Linger          time.Duration // how long a partial batch waits; default 5ms
	WriteTimeout    time.Duration // one produce request; default 10s
	MaxInFlight     int           // events not yet acknowledged; default 10000
	MaxInFlightSize int64         // bytes not yet acknowledged; default 64 MiB
	Compression     kafka.Compression
	Policy          Policy // default DeadLetter
	DeadLetterTopic string // default "outbox.dead-letter"
	TLS             *tls.Config
	SASL            sasl.Mechanism
	ClientID        string // default "outbox-relay"
}

func (c *Config) setDefaults() {
	if c.TopicTemplate == "" {
		c.TopicTemplate = "outbox.event." + placeholderAggregateType
	}
	if c.BuiltinHeaders == nil {
		c.BuiltinHeaders = BuiltinHeaders
	}
	if c.ValueEncoding == "" {
		c.ValueEncoding = ValueRaw
	}
	if c.KeyEncoding == "" {
		c.KeyEncoding = ValueRaw
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 1 << 20
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.Linger <= 0 {
		c.Linger = 5 * time.Millisecond
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 10000
	}
	if c.MaxInFlightSize <= 0 {
		c.MaxInFlightSize = 64 << 20
	}
	if c.Policy == "" {
		c.Policy = DeadLetter
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = "outbox.dead-letter"
	}
	if c.ClientID == "" {
		c.ClientID = "outbox-relay"
	}
}

// Acker is told when events of one transaction are done. *checkpoint.Txn implements it.
type Acker interface {
	Ack(n int)
}

// Sink publishes events. Publish is called from one goroutine; acknowledgements arrive on
// kafka-go's goroutines.
type Sink struct {
	cfg       Config
	log       *zap.Logger
	m         *metrics.Metrics
	transport *kafka.Transport
	router    *router
	limit     *limiter

	main, dead *lane
	ctx        context.Context // ends when Close gives up waiting
	stop       context.CancelFunc

	halted atomic.Pointer[haltState]
}

// record is one event on its way to Kafka; it rides in kafka.Message.WriterData.
type record struct {
	msg      kafka.Message
	ev       *decoder.Event
	ack      Acker
	size     int64
	enqueued time.Time
	topic    string // the event's own topic, kept when it is dead-lettered
}

type haltState struct {
	EventID string
	Reason  string
	Err     error
}

// New creates a Sink. It does not contact Kafka; see WaitReady.
func New(cfg Config, log *zap.Logger, m *metrics.Metrics) (*Sink, error) {
	cfg.setDefaults()
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("sink: no Kafka brokers configured")
	}
	for _, enc := range []ValueEncoding{cfg.ValueEncoding, cfg.KeyEncoding} {
		if enc != ValueRaw && enc != ValueJSONString {
			return nil, fmt.Errorf("sink: unknown encoding %q (want %q or %q)", enc, ValueRaw, ValueJSONString)
		}
	}
	for _, h := range cfg.BuiltinHeaders {
		if h != HeaderID && h != HeaderEventType && h != HeaderAggregateType {
			return nil, fmt.Errorf("sink: unknown built-in header %q (want some of %v)", h, BuiltinHeaders)
		}
	}
	if cfg.Policy != DeadLetter && cfg.Policy != Halt {
		return nil, fmt.Errorf("sink: unknown failure policy %q (want %q or %q)", cfg.Policy, DeadLetter, Halt)
	}
	rt, err := newRouter(cfg.TopicTemplate)
	if err != nil {
		return nil, fmt.Errorf("sink: topic template: %w", err)
	}
	if err := validTopic(cfg.DeadLetterTopic); err != nil {
		return nil, fmt.Errorf("sink: dead-letter topic: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Sink{
		cfg:    cfg,
		log:    log,
		m:      m,
		router: rt,
		limit:  newLimiter(int64(cfg.MaxInFlight), cfg.MaxInFlightSize),
		ctx:    ctx,
		stop:   stop,
	}
	s.transport = &kafka.Transport{
		ClientID:    cfg.ClientID,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
		DialTimeout: 5 * time.Second,
		IdleTimeout: 30 * time.Second,
		// A short TTL also bounds how long an error cached during an outage outlives the outage.
		MetadataTTL: 5 * time.Second,
	}
	// Records hold limiter capacity from Publish until settled, so neither queue can hold more than
	// MaxInFlight and sending to one never blocks.
	s.main = s.newLane(s.newWriter(s.completed), s.fail)
	s.dead = s.newLane(s.newWriter(s.deadLettered), s.halt)
	go s.main.feed(ctx)
	go s.dead.feed(ctx)
	return s, nil
}

func (s *Sink) newWriter(completion func([]kafka.Message, error)) *kafka.Writer {
	errLog := s.log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
	return &kafka.Writer{
		Addr:         kafka.TCP(s.cfg.Brokers...),
		Balancer:     kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		Async:        true,
		Completion:   completion,
		// Unlimited attempts: a batch is retried in place until the broker takes it or rejects it
		// for good. A finite count would complete it with an error while the next batch of the same
		// partition goes ahead.
		MaxAttempts:            math.MaxInt32,
		WriteBackoffMin:        100 * time.Millisecond,
		WriteBackoffMax:        2 * time.Second,
		BatchSize:              s.cfg.BatchSize,
		BatchBytes:             int64(s.cfg.MaxMessageBytes),
		BatchTimeout:           s.cfg.Linger,
		WriteTimeout:           s.cfg.WriteTimeout,
		ReadTimeout:            s.cfg.WriteTimeout,
		Compression:            s.cfg.Compression,
		AllowAutoTopicCreation: true,
		Transport:              retryTransport{s.transport},
		// One constant message, so the log sampler collapses a broker outage's retries.
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			s.m.KafkaRetries.Inc()
			errLog.Warn("kafka write failed; retrying in place", zap.String("detail", fmt.Sprintf(msg, args...)))
		}),
	}
}

// Publish hands ev to Kafka; ack.Ack(1) is called once it is acknowledged or settled by the failure
// policy. It blocks while the in-flight limits are reached, and for good once the sink has halted.
// It returns an error only when ctx ends.
func (s *Sink) Publish(ctx context.Context, ev *decoder.Event, ack Acker) error {
	if s.halted.Load() != nil {
		<-ctx.Done()
		return ctx.Err()
	}
	rec := &record{ev: ev, ack: ack}
	// The key is encoded before partitioning, so murmur2 hashes the same bytes a Java producer
	// with the same converter would.
	rec.msg = kafka.Message{
		Key:        encodeValue(ev.AggregateID, s.cfg.KeyEncoding),
		Value:      encodeValue(ev.Payload, s.cfg.ValueEncoding),
		WriterData: rec,
	}
	topic, routeErr := s.router.topic(ev)
	rec.msg.Topic, rec.topic = topic, topic
	hs, hdrErr := buildHeaders(ev, s.cfg.BuiltinHeaders, s.cfg.ExtraHeaders)
	rec.msg.Headers = hs
	rec.size = int64(recordSize(&rec.msg))
	if err := s.limit.acquire(ctx, rec.size); err != nil {
		return err
	}
	s.m.InFlightEvents.Inc()
	s.m.InFlightBytes.Add(float64(rec.size))
	switch {
	case routeErr != nil:
		s.fail(rec, ReasonInvalidTopic, routeErr)
	case hdrErr != nil:
		s.fail(rec, ReasonBadHeaders, hdrErr)
	case rec.size > int64(s.cfg.MaxMessageBytes):
		s.fail(rec, ReasonTooLarge, fmt.Errorf("record of %d bytes exceeds the %d-byte limit (max_message_bytes)",
			rec.size, s.cfg.MaxMessageBytes))
	default:
		rec.enqueued = time.Now()
		rec.msg.Time = rec.enqueued
		s.main.queue <- rec
	}
	return nil
}

// lane feeds one writer: records are handed over in order, and what the writer refuses before
// accepting anything (metadata unavailable, broker down at a topic's first message) is retried.
type lane struct {
	s         *Sink
	w         *kafka.Writer
	queue     chan *record
	fed       chan struct{} // closed once everything queued was handed to the writer
	permanent func(rec *record, reason string, err error)
}

func (s *Sink) newLane(w *kafka.Writer, permanent func(*record, string, error)) *lane {
	return &lane{s: s, w: w, queue: make(chan *record, s.cfg.MaxInFlight), fed: make(chan struct{}), permanent: permanent}
}

func (l *lane) feed(ctx context.Context) {
	defer close(l.fed)
	batch := make([]kafka.Message, 0, 256)
	for rec := range l.queue {
		batch = append(batch[:0], rec.msg)
	more:
		for len(batch) < cap(batch) {
			select {
			case r, ok := <-l.queue:
				if !ok {
					break more
				}
				batch = append(batch, r.msg)
			default:
				break more
			}
		}
		if l.s.halted.Load() != nil && l == l.s.main {
			// Halted: publishing more would put later events ahead of the one that failed.
			<-ctx.Done()
			return
		}
		l.write(ctx, batch)
	}
}

func (l *lane) write(ctx context.Context, batch []kafka.Message) {
	for attempt := 0; len(batch) > 0; attempt++ {
		// In async mode WriteMessages only looks up partitions, but that lookup is a metadata request
		// to the broker for a topic the writer has not seen yet, and it has no timeout of its own:
		// over a stalled connection it would wait forever, silently. Bound it like a produce request.
		wctx, cancel := context.WithTimeout(ctx, l.s.cfg.WriteTimeout)
		err := l.w.WriteMessages(wctx, batch...)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		var tooLarge kafka.MessageTooLargeError
		switch {
		case errors.As(err, &tooLarge):
			// Publish checks sizes, so only a smaller broker limit gets here; settle that record.
			i := indexOf(batch, tooLarge.Message)
			l.permanent(batch[i].WriterData.(*record), ReasonTooLarge, err)
			batch = append(batch[:i:i], batch[i+1:]...)
		case permanent(err) && len(batch) > 1:
			// Find the record the broker refuses by writing them one at a time, in order.
			for i := range batch {
				l.write(ctx, batch[i:i+1])
			}
			return
		case permanent(err):
			l.permanent(batch[0].WriterData.(*record), reason(err), err)
			return
		default:
			delay := backoff(attempt)
			msg := "kafka unavailable; retrying"
			if errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.LeaderNotAvailable) {
				msg = "topic not available yet; retrying (if the brokers do not auto-create topics, create it)"
			}
			l.s.log.Warn(msg, zap.String("topic", batch[0].Topic), zap.Int("events", len(batch)),
				zap.Duration("retry_in", delay), zap.Error(err))
			l.s.m.KafkaRetries.Inc()
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
		}
	}
}

func indexOf(batch []kafka.Message, m kafka.Message) int {
	for i := range batch {
		if batch[i].WriterData == m.WriterData {
			return i
		}
	}
	return 0
}

// backoff grows from 200ms to 2s.
// A retry against a broker that is down costs one failed dial, so the ceiling is low: the relay
// notices a broker coming back within seconds.
func backoff(attempt int) time.Duration {
	d := 200 * time.Millisecond << min(attempt, 6)
	return min(d, 2*time.Second)
}

// completed is the writer's Completion callback: a batch of one partition was acknowledged, or the
// broker rejected it for good.
func (s *Sink) completed(msgs []kafka.Message, err error) {
	if err != nil && len(msgs) > 1 && permanent(err) {
		// The broker refuses a whole batch for one record (an invalid record), or for its total size
		// (max.message.bytes applies to the batch, and a topic may set a smaller limit than ours):
		// write the records one at a time, so only a record refused on its own goes to the policy.
		// The partition's writer waits for this callback, so no later batch of the partition goes
		// ahead of them.
		for i := range msgs {
			err := s.produceOne(msgs[i])
			if s.ctx.Err() != nil {
				return // Close gave up: leave the rest unsettled, as the writer would
			}
			s.completed(msgs[i:i+1], err)
		}
		return
	}
	if err != nil {
		for i := range msgs {
			rec := msgs[i].WriterData.(*record)
			if permanent(err) {
				s.fail(rec, reason(err), err)
			} else {
				// Cannot happen with retryTransport; if it does, the batch cannot be retried in place
				// any more, and going on would reorder the partition.
				s.halt(rec, ReasonRejected, fmt.Errorf("unexpected error after retries: %w", err))
			}
		}
		return
	}
	now := time.Now()
	var bytes int64
	var newest time.Time
	for i := range msgs {
		rec := msgs[i].WriterData.(*record)
		bytes += rec.size
		s.m.EventsPublished.WithLabelValues(msgs[i].Topic).Inc()
		s.m.PublishLatency.Observe(now.Sub(rec.enqueued).Seconds())
		s.m.EndToEndLatency.Observe(now.Sub(rec.ev.Tx.CommitTime).Seconds())
		if rec.ev.Tx.CommitTime.After(newest) {
			newest = rec.ev.Tx.CommitTime
		}
	}
	s.settle(msgs, bytes)
	s.m.BytesPublished.Add(float64(bytes))
	s.m.LastAckTimestamp.Set(float64(now.UnixNano()) / 1e9)
	if events, _ := s.limit.inFlight(); events > 0 {
		s.m.SecondsBehind.Set(now.Sub(newest).Seconds())
	} else {
		s.m.SecondsBehind.Set(0)
	}
}

// produceOne writes m alone to the partition the writer chose for it, retrying in place until the
// broker takes it or rejects it for good, and returns nil or the broker's permanent error.
func (s *Sink) produceOne(m kafka.Message) error {
	client := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Transport: retryTransport{s.transport}, Timeout: s.cfg.WriteTimeout}
	for attempt := 0; ; attempt++ {
		res, err := client.Produce(s.ctx, &kafka.ProduceRequest{
			Topic: m.Topic, Partition: m.Partition, RequiredAcks: kafka.RequireAll, Compression: s.cfg.Compression,
			Records: kafka.NewRecordReader(kafka.Record{Time: m.Time, Key: kafka.NewBytes(m.Key), Value: kafka.NewBytes(m.Value), Headers: m.Headers}),
		})
		if err == nil && res != nil {
			err = res.Error
		}
		if err == nil || permanent(err) {
			return err
		}
		delay := backoff(attempt)
		s.m.KafkaRetries.Inc()
		s.log.Warn("kafka write failed; retrying in place", zap.String("topic", m.Topic), zap.Int("partition", m.Partition),
			zap.Duration("retry_in", delay), zap.Error(err))
		select {
		case <-time.After(delay):
		case <-s.ctx.Done():
			return s.ctx.Err()
		}
	}
}

// settle acknowledges records to their transactions, one call per run of the same transaction,
// and returns their capacity to the limiter.
func (s *Sink) settle(msgs []kafka.Message, bytes int64) {
	var run Acker
	n := 0
	for i := range msgs {
		ack := msgs[i].WriterData.(*record).ack
		if ack != run && n > 0 {
			run.Ack(n)
			n = 0
		}
		run = ack
		n++
	}
	if n > 0 {
		run.Ack(n)
	}
	s.limit.release(int64(len(msgs)), bytes)
	s.m.InFlightEvents.Sub(float64(len(msgs)))
	s.m.InFlightBytes.Sub(float64(bytes))
}

// Halted reports the event that stopped the sink under the halt policy, if any.
func (s *Sink) Halted() (eventID, reason string, err error, halted bool) {
	h := s.halted.Load()
	if h == nil {
		return "", "", nil, false
	}
	return h.EventID, h.Reason, h.Err, true
}

// InFlight returns the events and bytes handed to Kafka and not yet settled.
func (s *Sink) InFlight() (events, bytes int64) { return s.limit.inFlight() }

// Close stops accepting events and waits until everything handed to Kafka is settled or ctx ends.
// Whatever is still unacknowledged then is abandoned: it was never confirmed to PostgreSQL, so it
// is published again after a restart. Publish must not be called concurrently with or after Close.
func (s *Sink) Close(ctx context.Context) error {
	close(s.main.queue)
	done := make(chan struct{})
	go func() {
		// The main writer's completions may still dead-letter records, so the dead-letter lane
		// closes only after the main writer has finished.
		<-s.main.fed
		s.main.w.Close()
		close(s.dead.queue)
		<-s.dead.fed
		s.dead.w.Close()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		events, _ := s.limit.inFlight()
		err = fmt.Errorf("sink: %d events still unacknowledged at shutdown: %w", events, ctx.Err())
	}
	s.stop()
	s.transport.CloseIdleConnections()
	return err
}
