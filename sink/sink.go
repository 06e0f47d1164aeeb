// Package sink publishes outbox events to Kafka and reports each one back once Kafka has
// acknowledged it (acks=all) or the failure policy has settled it. It is the policy on top of two
// rooms below it: package record makes an event a Kafka record (topic, key, headers, value), and
// package producer sends records in order, one batch in flight per partition, idempotent where the
// broker allows it. The sink adds what only an outbox relay needs: the in-flight window, the
// failure policy (dead letters, halt), refusals, readiness, and with Config.Transactions the Kafka
// transactions (exactlyonce.go), whose records are acknowledged only once the transaction
// holding them, and the Position it reaches (package positions), committed.
package sink

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/sink/record"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// Acker is told when events of one transaction are done. *checkpoint.Txn implements it.
type Acker interface {
	Ack(n int)
}

// Sink publishes events. Publish is called from one goroutine; acknowledgements arrive on
// the producer's partition goroutines.
type Sink struct {
	cfg       Config
	log       *zap.Logger
	m         *metrics.Metrics
	transport *kafka.Transport
	records   *record.Builder
	limit     *limiter
	labels    *topicLabels

	main, dead *producer.Producer
	ident      *producer.Identity // producer id and epoch
	txn        *exactlyOnce       // nil unless exactly-once
	client     *kafka.Client
	ctx        context.Context // ends when Close gives up waiting, or the sink fails for good
	stop       context.CancelFunc
	abandon    context.CancelFunc // ends the committer's context (Abandon); nil without exactly-once

	halted atomic.Pointer[haltState]
	topics *topicWaits
	reg    registryWait // events waiting for the schema registry (Config.Serializer)

	// seq is the last record's position. Publish, on one goroutine, advances it; Flush reads it.
	seq atomic.Uint64

	failed   chan struct{} // closed by fatal
	failOnce sync.Once
	failErr  error

	lastAnswer atomic.Int64 // unix nanoseconds of the last answer of a broker (LastAnswer)
	starting   atomic.Bool  // WaitReady is waiting for Kafka
	early      *earlyStart  // WaitReady's first attempt, when Prestart made it
}

// delivery is one event on its way to Kafka.
type delivery struct {
	// Record is what the producer needs: Partition is the event's own (PlacePartition) or -1 for
	// the key's, Seq its position in publish (WAL) order, from 1 (a halt stops everything at or
	// after it), Txn (exactly-once) the generation of its Kafka transaction; Owner is the delivery.
	producer.Record
	ev    *decoder.Event
	ack   Acker
	topic string // the event's own topic, kept when it is dead-lettered
	// framed: the value is framed for the schema registry (Config.Serializer); a dead letter
	// says so (HeaderDLQFramed), for redrive.
	framed bool
}

// deliveries are the records of a batch the producer answered for, as the sink made them.
func deliveries(batch []*producer.Record) []*delivery {
	out := make([]*delivery, len(batch))
	for i, r := range batch {
		out[i] = r.Owner.(*delivery)
	}
	return out
}

type haltState struct {
	seq     uint64 // the halted record's position
	txn     uint64 // and its Kafka transaction's generation
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
	// No event may reach the relay's own topics (and redrive's ledger beside the dead-letter
	// topic), whatever the routing and the allowlist say.
	cfg.Record.TopicDeny = append(append([]string(nil), cfg.Record.TopicDeny...), cfg.DeadLetterTopic,
		cfg.DeadLetterTopic+RedriveLedgerSuffix)
	if t := cfg.Transactions; t != nil {
		cfg.Record.TopicDeny = append(cfg.Record.TopicDeny, t.PositionsTopic)
	}
	records, err := record.NewBuilder(cfg.Record)
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	labels := newTopicLabels()
	s := &Sink{
		cfg:     cfg,
		log:     log,
		m:       m,
		records: records,
		limit:   newLimiter(int64(cfg.MaxInFlight), cfg.MaxInFlightSize),
		labels:  labels,
		ctx:     ctx,
		stop:    stop,
		topics:  &topicWaits{log: log, gauge: m.TopicUnavailable, labels: labels, waiting: make(map[string]*topicWait)},
		failed:  make(chan struct{}),
	}
	client, transport := NewClient(cfg, cfg.WriteTimeout)
	s.client, s.transport = client, transport
	var txnID string
	var txnTimeout time.Duration
	if t := cfg.Transactions; t != nil {
		txnID, txnTimeout = t.ID, t.Timeout
	}
	s.ident = producer.NewIdentity(client, log, cfg.Idempotence, txnID, txnTimeout)
	completed := func(batch []*producer.Record, err error) { s.completed(deliveries(batch), err) }
	deadLettered := func(batch []*producer.Record, err error) { s.deadLettered(deliveries(batch), err) }
	mainDone, deadDone := completed, deadLettered
	if t := cfg.Transactions; t != nil {
		s.txn = newExactlyOnce(s, *t, s.ident)
		// Written records are held until their Kafka transaction commits, then acknowledged.
		mainCommitted := func(batch []*producer.Record) { completed(batch, nil) }
		deadCommitted := func(batch []*producer.Record) { deadLettered(batch, nil) }
		mainDone = func(batch []*producer.Record, err error) {
			if err != nil {
				completed(batch, err)
				return
			}
			s.txn.c.Written(batch, mainCommitted)
		}
		deadDone = func(batch []*producer.Record, err error) {
			if err != nil {
				deadLettered(batch, err)
				return
			}
			s.txn.c.Written(batch, deadCommitted)
		}
	}
	s.main = s.newProducer(client, mainDone, !cfg.NoAutoCreateTopics)
	s.dead = s.newProducer(client, deadDone, true)
	if s.txn != nil {
		s.txn.c.Producers(s.main, s.dead)
		s.txn.carry(s.main)
		var committing context.Context
		committing, s.abandon = context.WithCancel(ctx)
		go s.txn.c.Run(committing)
	}
	return s, nil
}

func (s *Sink) newProducer(client *kafka.Client, done func([]*producer.Record, error), autoCreate bool) *producer.Producer {
	cfg := producer.Config{
		AutoCreateTopics: autoCreate,
		Client:           client,
		Compression:      s.cfg.Compression,
		MaxBytes:         s.cfg.MaxMessageBytes,
		MaxRecords:       s.cfg.BatchSize,
		Linger:           s.cfg.Linger,
		Timeout:          s.cfg.WriteTimeout,
		Identity:         s.ident,
		Log:              s.log,
		Done:             done,
		Retrying:         s.retrying,
		Sent: func(records int) {
			s.m.ProduceRequests.Inc()
			s.m.RequestRecords.Observe(float64(records))
		},
		StopAt: s.stopAt,
		Failed: s.fatal,
	}
	if s.txn != nil {
		cfg.Transactions, cfg.TransactionalID = s.txn.c, s.cfg.Transactions.ID
	}
	return producer.New(s.ctx, cfg)
}

// retrying logs a transient failure. The messages are constant, so the log sampler collapses an
// outage's retries.
func (s *Sink) retrying(topic string, partition, records int, err error, delay time.Duration) {
	s.m.KafkaRetries.Inc()
	if topicLevel(err) {
		s.answered() // the broker is there; the topic is what is missing
		s.topics.unavailable(topic, err)
	}
	fields := []zap.Field{zap.String("topic", topic), zap.Int("partition", partition), zap.Int("events", records),
		zap.Duration("retry_in", delay), zap.Error(err)}
	if line, ok := tlsProblem(err); ok {
		s.log.Error("TLS with the broker fails; retrying in place until the certificates are fixed",
			append(fields, zap.String("problem", line))...)
		return
	}
	switch {
	case producer.AuthFailed(err):
		// Loud, but retried: during a credential or ACL rotation this heals by itself, and
		// dead-lettering would cut a gap into every aggregate of the topic.
		s.log.Error("kafka refused the relay's credentials or permissions; retrying in place until they are fixed", fields...)
	case errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.LeaderNotAvailable):
		s.log.Warn("topic not available yet; retrying (if the brokers do not auto-create topics, create it)", fields...)
	default:
		s.log.Warn("kafka unavailable; retrying in place", fields...)
	}
}

// Stalled reports, in words for /readyz, a topic the relay has been waiting for past a short grace
// period (missing with auto-creation off, or not authorized): every later event waits behind it.
// A wait for the schema registry (Config.Serializer) is named too.
func (s *Sink) Stalled() (string, bool) {
	if msg, ok := s.registryStalled(); ok {
		return msg, true
	}
	return s.topics.stalled()
}

// Publish hands ev to Kafka; ack.Ack(1) is called once it is acknowledged or settled by the failure
// policy. It blocks while the in-flight limits are reached, and for good once the sink has halted.
// It returns an error only when ctx ends.
func (s *Sink) Publish(ctx context.Context, ev *decoder.Event, ack Acker) error {
	return s.submit(ctx, ev, ack, "", nil)
}

// Flush lets every event published so far go to Kafka without waiting for kafka.linger; it does
// not wait for them. Lingering gathers what is published next into fewer, larger requests; a
// caller that waits for the acknowledgements of what it published before it publishes more (the
// poller: its rows stay locked until then) publishes nothing meanwhile, so for it the linger only
// delays the acknowledgements.
func (s *Sink) Flush() {
	seq := s.seq.Load()
	s.main.Flush(seq)
	s.dead.Flush(seq)
}

// submit is Publish, or, with a reject reason, Reject: both take a position in publish order and
// in-flight capacity the same way, so a rejected event is ordered, bounded and halted like any other.
func (s *Sink) submit(ctx context.Context, ev *decoder.Event, ack Acker, reject string, cause error) error {
	if err := ctx.Err(); err != nil {
		return err // a stopped or fenced relay hands Kafka nothing more, even while the window has room
	}
	if err := s.Err(); err != nil {
		return err
	}
	if s.halted.Load() != nil {
		<-ctx.Done()
		return ctx.Err()
	}
	// One clock reading serves the record's fallback timestamp and the start of its linger, unless
	// something below waits (the registry, the window): then the linger starts after the wait. A
	// reading costs ~0.15 µs on a virtual machine's clock, a few percent of an event's cost.
	now := time.Now()
	waited := false
	built := s.records.Build(ev, now)
	framed := false
	if s.cfg.Serializer != nil && reject == "" && built.TopicErr == nil {
		waited = true // the registry may have been asked
		// Framed before it takes a position: an event the registry cannot serve yet holds the
		// stream here, and one that cannot be serialized goes to the policy like a rejected one.
		var ctxErr error
		if reject, cause, ctxErr = s.serialize(ctx, ev, &built); ctxErr != nil {
			return ctxErr
		}
		framed = reject == ""
	}
	rec := &delivery{Record: producer.Record{Seq: s.seq.Add(1), Msg: built.Msg, Partition: built.Partition}, ev: ev, ack: ack, framed: framed}
	rec.Owner = rec
	// An event never reaches the dead-letter or the positions topic (New puts them in the
	// builder's TopicDeny): one partition written by two producers, or by an event and a position
	// under one producer id and epoch, would have its sequence numbers collide (one record taken
	// for a duplicate of the other and never written), and a position a row could write would be
	// trusted by the next start.
	rec.topic = built.Msg.Topic
	size := int64(producer.RecordSize(&rec.Msg))
	rec.Size = s.held(size, ev) // what the window counts: the memory kept until Kafka acknowledges
	if !s.limit.tryAcquire(rec.Size) {
		if err := s.limit.acquire(ctx, s.failed, rec.Size); err != nil {
			if ctx.Err() == nil && s.Err() != nil {
				return s.Err()
			}
			return err
		}
		waited = true
	}
	if waited {
		now = time.Now()
	}
	if s.txn != nil {
		s.txn.c.Join(&rec.Record)
	}
	s.m.InFlightEvents.Inc()
	s.m.InFlightBytes.Add(float64(rec.Size))
	// The waits in hand end with ctx: a stop must never hang on a topic that cannot be learned. An
	// event not handed over then gives its capacity back; it was never acknowledged, so it is
	// published again after a restart.
	if err := s.hand(ctx, rec, &built, size, reject, cause, now); err != nil {
		if s.txn != nil {
			s.txn.c.Leave(&rec.Record)
		}
		s.limit.release(1, rec.Size)
		s.m.InFlightEvents.Dec()
		s.m.InFlightBytes.Sub(float64(rec.Size))
		if ctx.Err() == nil && s.Err() != nil {
			return s.Err()
		}
		return ctx.Err()
	}
	return nil
}

// hand gives rec, the event built as built (size bytes as a record), to the main producer, or, with
// a reject reason or a record that cannot go to its topic, to the failure policy. Its waits (for a
// topic's partitions, the dead-letter topic's included) end with ctx. now is when it was admitted
// to the window.
func (s *Sink) hand(ctx context.Context, rec *delivery, built *record.Record, size int64, reject string, cause error, now time.Time) error {
	topic, routeErr, hdrErr, partErr := built.Msg.Topic, built.TopicErr, built.HeadersErr, built.PartitionErr
	var err error
	switch {
	case reject != "":
		if routeErr != nil {
			rec.topic = "" // the dead-letter headers name the event's topic only when there is one
		}
		if hdrErr != nil {
			rec.Msg.Headers = nil
		}
		err = s.fail(ctx, rec, reject, cause)
	case errors.Is(routeErr, record.ErrTopicNotAllowed):
		err = s.fail(ctx, rec, ReasonTopicNotAllowed, routeErr)
	case routeErr != nil:
		err = s.fail(ctx, rec, ReasonInvalidTopic, routeErr)
	case hdrErr != nil:
		err = s.fail(ctx, rec, ReasonBadHeaders, hdrErr)
	case partErr != nil:
		err = s.fail(ctx, rec, ReasonInvalidPartition, partErr)
	case built.EnvelopeErr != nil:
		err = s.fail(ctx, rec, ReasonInvalidCloudEvent, built.EnvelopeErr)
	case size > int64(s.cfg.MaxMessageBytes):
		err = s.fail(ctx, rec, ReasonTooLarge, fmt.Errorf("record of %d bytes exceeds the %d-byte limit (max_message_bytes)",
			size, s.cfg.MaxMessageBytes))
	default:
		// The linger counts from here, after the wait for room in the window: a record that waited
		// lingers like any other (TestARecordThatWaitedForTheWindowStillLingers).
		rec.Enqueued = now
		if err = s.main.Enqueue(ctx, &rec.Record); err != nil && ctx.Err() == nil {
			if errors.Is(err, producer.ErrTopicRefused) {
				s.topics.unavailable(topic, err)
			} else {
				err = fmt.Errorf("topic %s: %w", topic, err)
			}
			err = s.fail(ctx, rec, reason(err), err)
		}
	}
	return err
}

// abortGrace is how long Close waits, after giving up, for the abort of the Kafka transaction
// that did not commit.
const abortGrace = 2 * time.Second

// completed is the main producer's report on a batch of one partition: acknowledged, or refused
// for good by the broker (then for a single record).
func (s *Sink) completed(batch []*delivery, err error) {
	s.answered()
	if errors.Is(err, producer.ErrTopicRefused) {
		s.topics.unavailable(batch[0].Msg.Topic, err) // readiness names it until the topic takes a record
	} else {
		s.topics.available(batch[0].Msg.Topic) // the broker answered for the topic
	}
	if err != nil {
		for _, rec := range batch {
			// Ends only when Close gives up: the record then stays unacknowledged and is replayed.
			_ = s.fail(s.ctx, rec, reason(err), err)
		}
		return
	}
	now := time.Now()
	var bytes int64
	var newest time.Time
	for _, rec := range batch {
		bytes += rec.Size
		s.m.PublishLatency.Observe(now.Sub(rec.Enqueued).Seconds())
		s.m.EndToEndLatency.Observe(now.Sub(rec.ev.Tx.CommitTime).Seconds())
		if rec.ev.Tx.CommitTime.After(newest) {
			newest = rec.ev.Tx.CommitTime
		}
	}
	s.m.EventsPublished.WithLabelValues(s.labels.of(batch[0].Msg.Topic)).Add(float64(len(batch)))
	s.settle(batch, bytes)
	s.m.BytesPublished.Add(float64(bytes))
	s.m.LastAckTimestamp.Set(float64(now.UnixNano()) / 1e9)
	if events, _ := s.limit.inFlight(); events > 0 {
		s.m.SecondsBehind.Set(now.Sub(newest).Seconds())
	} else {
		s.m.SecondsBehind.Set(0)
	}
}

// settle acknowledges records to their transactions, one call per run of the same transaction,
// and returns their capacity to the limiter.
func (s *Sink) settle(batch []*delivery, bytes int64) {
	var run Acker
	n := 0
	for _, rec := range batch {
		ack := rec.ack
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
	s.limit.release(int64(len(batch)), bytes)
	s.m.InFlightEvents.Sub(float64(len(batch)))
	s.m.InFlightBytes.Sub(float64(bytes))
}

// stopAt is the position of the halted record, or the largest position while not halted: no
// record at or after it may be sent, or a key's later event would reach Kafka without the halted
// one.
func (s *Sink) stopAt() uint64 {
	if h := s.halted.Load(); h != nil {
		return h.seq
	}
	return math.MaxUint64
}

// Published returns the position in publish order of the last event handed over (by Publish or
// Reject). Publish is called from one goroutine, so right after it returns this is that event's.
func (s *Sink) Published() uint64 { return s.seq.Load() }

// Withholds reports whether the sink holds the event at position pos back for good, so that an
// acknowledgement or a refusal can come for it only if it was sent before the halt: the sink
// halted at it or at an event before it. Events before the halted one still go and are settled,
// which lets a caller that waits for them (the poller, to mark what Kafka has) wait for those.
func (s *Sink) Withholds(pos uint64) bool { return pos >= s.stopAt() }

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

// Abandon commits nothing more, from now on: with exactly-once, the committer aborts the open
// Kafka transaction instead of committing it, and no later one begins, so nothing handed over
// and not yet committed is acknowledged (it is published again by whoever streams next). For a
// relay that was fenced: another instance may lead already. A commit whose EndTxn is already on
// its way cannot be called back. Close still follows; without exactly-once Abandon does nothing
// (Close abandons what is in flight).
func (s *Sink) Abandon() {
	if s.abandon != nil {
		s.abandon()
	}
}

// Close stops accepting events and waits until everything handed to Kafka is settled or ctx ends.
// Whatever is still unacknowledged then is abandoned: it was never confirmed to PostgreSQL, so it
// is published again after a restart. With exactly-once, what was published is committed first,
// within ctx; a ctx that has already ended (a fence) commits nothing more: the open Kafka
// transaction is aborted. Publish must not be called concurrently with or after Close.
func (s *Sink) Close(ctx context.Context) error {
	if e := s.early; e != nil {
		select { // its context has ended: it stops at its next round trip's end
		case <-e.done:
		case <-ctx.Done():
		}
	}
	var txnErr error
	if s.txn != nil {
		// Commit what was published; the producers then hold nothing and close at once.
		if txnErr = s.txn.c.Flush(ctx); errors.Is(txnErr, producer.ErrStopped) {
			txnErr = s.Err()
		}
	}
	done := make(chan struct{})
	go func() {
		// The main producer may still dead-letter records, so the dead-letter producer closes
		// only after it.
		s.main.Close()
		s.dead.Close()
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
	if s.txn != nil {
		// The committer aborts what did not commit (EndTxn), so read_committed consumers are not
		// held at it until the transaction timeout. Best effort, and bounded: the next producer
		// with the transactional id aborts it too.
		select {
		case <-s.txn.c.Done():
		case <-time.After(abortGrace):
		}
		if err == nil && txnErr != nil {
			err = fmt.Errorf("sink: committing the last kafka transaction: %w", txnErr)
		}
	}
	s.transport.CloseIdleConnections()
	return err
}
