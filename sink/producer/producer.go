// Package producer is a Kafka producer for records whose order matters: one goroutine and at most
// one batch in flight per partition, a failed batch retried in place before anything after it, so
// a partition's records reach Kafka in order; only an error the broker returns for good ends a
// record's journey unacknowledged. It is idempotent where the broker allows it (idempotence.go)
// and transactional when given Transactions (the caller runs the Kafka transactions; the producer
// sends only the records of the active one and enrols their partitions). Records in, one answer
// per batch out (Config.Done): acknowledged, or refused for good with a classified error
// (errors.go).
//
// Each partition has its queue and goroutine (queue.go); the topics' partition counts and leaders
// are cached (metadata.go); keys are placed with the Java client's hash (murmur2.go).
//
// A partition's batch is ready when it is full (MaxRecords records or MaxBytes), when its oldest
// record has waited Linger, or when it must go now (Close, a Kafka transaction being committed,
// Flush, the partition's broker sending a request); a ready batch goes in a Produce request
// together with the batches of every other partition of the same broker that hold records
// (coalesce.go), as the Java client's Sender does.
//
// kafka-go's Writer is not used: it cuts a batch a linger after its first record even while the
// previous batch of the partition is still in flight, never merges queued batches and sends one
// request per partition, and its retry rule needs patching to keep order. kafka-go's protocol
// layer and transport are: the record batch (batch.go) and the transactional requests
// (coordinator.go) are encoded here where kafka-go's own lack a field.
package producer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

// Record is one record on its way to Kafka.
type Record struct {
	Msg kafka.Message
	// Partition is the one the caller chose, or -1: then the key's (Murmur2, as the Java client
	// hashes) or, without a key, the next in turn. Enqueue sets Msg.Partition.
	Partition int
	// Size is what the record counts against a batch's MaxBytes (at least RecordSize of Msg).
	Size int64
	// Seq is the record's position in the caller's order, from 1: Flush and Config.StopAt name
	// positions.
	Seq uint64
	// Txn is the generation of the Kafka transaction the record belongs to (Transactions); 0
	// without transactions.
	Txn uint64
	// Enqueued is when the caller handed it over; its linger counts from then.
	Enqueued time.Time
	// Offset is where the broker wrote it, once acknowledged; -1 if the broker did not say.
	Offset int64
	// Owner is the caller's, handed back with the record in Done; the producer does not touch it.
	Owner any
}

// Transactions is what a transactional producer needs of whoever runs its Kafka transactions:
// which transaction's records may go, and the enrolment of partitions in it.
type Transactions interface {
	// Active is the generation whose records may be sent; records of later ones wait.
	Active() uint64
	// Sealed is the latest generation being committed: its records go at once, without lingering.
	Sealed() uint64
	// Add makes tp part of the active transaction before a batch of it goes to tp. An error
	// wrapping ErrTopicRefused refuses the partition's records for good; any other says the
	// transaction is over for this producer.
	Add(ctx context.Context, tp TopicPartition) error
	// Fail ends the active transaction for err: it cannot commit.
	Fail(err error)
}

// Config configures a Producer. Every field but the hooks is required.
type Config struct {
	Client      *kafka.Client
	Compression kafka.Compression
	MaxBytes    int // per batch: it must fit the broker's message.max.bytes
	MaxRecords  int // per batch
	Linger      time.Duration
	Timeout     time.Duration // of one request
	Identity    *Identity     // producer id and epoch, shared by the producers of one client
	// Transactions, when set, makes the producer transactional under TransactionalID.
	Transactions    Transactions
	TransactionalID string
	Log             *zap.Logger
	// AutoCreateTopics asks the brokers to create a missing topic (where auto.create.topics.enable
	// lets them) when its partitions are learned.
	AutoCreateTopics bool

	// Done is told of every batch of one partition: acknowledged (err nil), or refused for good
	// (Permanent(err), or the records were never sent: the transaction refused their topic). It
	// runs on the partition's goroutine.
	Done func(batch []*Record, err error)
	// Retrying is told of each transient failure before the retry (partition -1: learning the
	// topic's partitions).
	Retrying func(topic string, partition int, records int, err error, delay time.Duration)
	// Sent is told of every produce request, with its records.
	Sent func(records int)
	// StopAt returns the position of a record nothing at or after which may be sent any more
	// (math.MaxUint64 while there is none): the caller halted there.
	StopAt func() uint64
	// Failed stops the caller for good: the producer id could not be had (a start error of the
	// idempotent or transactional producer).
	Failed func(error)
}

// Producer sends records to Kafka. Its methods may be called from any goroutine.
type Producer struct {
	client          *kafka.Client
	compression     kafka.Compression
	maxBytes        int // per request: one record batch must fit the broker's message.max.bytes
	maxRecords      int
	linger          time.Duration
	timeout         time.Duration
	ctx             context.Context // ends when the caller stops waiting (Close gave up)
	done            func(batch []*Record, err error)
	retrying        func(topic string, partition int, records int, err error, delay time.Duration)
	sent            func(records int) // one produce request went out
	stopAt          func() uint64     // the halted record's position once the caller has halted; nothing at or after it is sent
	roundRobin      atomic.Uint32
	failed          func(error) // stops the caller for good (a start error of the idempotent producer)
	ident           *Identity   // producer id and epoch (idempotence)
	autoCreate      bool        // ask the brokers to create a missing topic
	buffers         sync.Pool   // *[]byte: encoded record sets
	txns            Transactions
	transactionalID string
	requests        *requests // the produce requests being assembled, per broker
	log             *zap.Logger

	// flushed is the position (Record.Seq) up to which records go without lingering (Flush).
	flushed atomic.Uint64

	mu     sync.Mutex
	parts  map[TopicPartition]*partitionQueue
	topics map[string]topicInfo
	closed bool
	wg     sync.WaitGroup
}

// New returns a producer that sends until ctx ends or Close; nothing is contacted before the
// first record.
func New(ctx context.Context, cfg Config) *Producer {
	p := &Producer{
		client: withTransport(cfg.Client), compression: cfg.Compression, maxBytes: cfg.MaxBytes, maxRecords: cfg.MaxRecords,
		linger: cfg.Linger, timeout: cfg.Timeout, ctx: ctx, done: cfg.Done, retrying: cfg.Retrying, sent: cfg.Sent,
		stopAt: cfg.StopAt, failed: cfg.Failed, ident: cfg.Identity, txns: cfg.Transactions, transactionalID: cfg.TransactionalID,
		log: cfg.Log, autoCreate: cfg.AutoCreateTopics, parts: make(map[TopicPartition]*partitionQueue), topics: make(map[string]topicInfo),
	}
	p.requests = newRequests(p)
	return p
}

// withTransport returns c, or a copy of it with kafka-go's default transport when it has none: the
// producer sends its requests through the transport directly (kafka.Client leaves that to its
// methods, which this producer does not use for producing).
func withTransport(c *kafka.Client) *kafka.Client {
	if c.Transport != nil {
		return c
	}
	cc := *c
	cc.Transport = kafka.DefaultTransport
	return &cc
}

// TopicPartition names one partition.
type TopicPartition struct {
	Topic     string
	Partition int
}

func (tp TopicPartition) String() string { return fmt.Sprintf("%s/%d", tp.Topic, tp.Partition) }

// Enqueue assigns rec a partition (murmur2 of the key, as the Java client does) and queues it.
// It waits, retrying, while the topic's partition count cannot be learned; it returns a permanent
// error (the topic is invalid or not authorized) or ctx's error.
func (p *Producer) Enqueue(ctx context.Context, rec *Record) error {
	var n int
	// The caller's clock reading when it handed the record over is recent enough to tell whether
	// the topic's partition count is still trusted: a reading per record was a measurable part of
	// the hot path's cost on a virtual machine's clock.
	now := rec.Enqueued
	if now.IsZero() {
		now = time.Now()
	}
	for attempt := 0; ; attempt++ {
		var err error
		if n, err = p.partitions(ctx, rec.Msg.Topic, now); err == nil {
			break
		}
		if p.txns != nil && errors.Is(err, kafka.TopicAuthorizationFailed) {
			// Waiting would hold every Kafka transaction (ErrTopicRefused).
			return RefusedTopic(rec.Msg.Topic, err)
		}
		if Permanent(err) {
			return err
		}
		delay := Backoff(attempt)
		p.retrying(rec.Msg.Topic, -1, 1, err, delay)
		select {
		case <-time.After(delay):
			now = time.Now()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	switch {
	case rec.Partition >= n:
		return fmt.Errorf("%w: the record names partition %d, and topic %s has %d", ErrNoSuchPartition, rec.Partition, rec.Msg.Topic, n)
	case rec.Partition >= 0:
		rec.Msg.Partition = rec.Partition // the caller's choice
	case rec.Msg.Key != nil:
		rec.Msg.Partition = int((Murmur2(rec.Msg.Key) & 0x7fffffff) % uint32(n))
	default:
		rec.Msg.Partition = int(p.roundRobin.Add(1) % uint32(n)) // no key, no order to keep: spread
	}
	q := p.queue(TopicPartition{rec.Msg.Topic, rec.Msg.Partition})
	if q == nil {
		return errors.New("producer: closed")
	}
	q.push(rec)
	return nil
}

func (p *Producer) queue(tp TopicPartition) *partitionQueue {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	q := p.parts[tp]
	if q == nil {
		q = &partitionQueue{p: p, tp: tp, wake: make(chan struct{}, 1)}
		p.parts[tp] = q
		p.wg.Add(1)
		go q.run()
	}
	return q
}

// Flush lets the queued records at or before position seq go without lingering.
func (p *Producer) Flush(seq uint64) {
	for {
		cur := p.flushed.Load()
		if seq <= cur {
			return
		}
		if p.flushed.CompareAndSwap(cur, seq) {
			break
		}
	}
	p.mu.Lock()
	for _, q := range p.parts {
		q.signal()
	}
	p.mu.Unlock()
}

// Wake makes every partition look at its records again: the Kafka transaction whose records may
// go (Transactions.Active) or the one being committed (Sealed) changed.
func (p *Producer) Wake() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, q := range p.parts {
		q.signal()
	}
}

// Holding returns the partitions whose next records to send are of Kafka transaction gen: they
// will ask Transactions.Add for their partition soon.
func (p *Producer) Holding(gen uint64) []TopicPartition {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []TopicPartition
	for tp, q := range p.parts {
		if q.holds(gen) {
			out = append(out, tp)
		}
	}
	return out
}

// SetMaxBytes lowers the batch size limit to the broker's (message.max.bytes); it is called
// before the first record.
func (p *Producer) SetMaxBytes(n int) { p.maxBytes = n }

// Close lets every partition send what it holds and returns once all have stopped; partitions
// still retrying stop when the producer's context ends.
func (p *Producer) Close() {
	p.mu.Lock()
	p.closed = true
	for _, q := range p.parts {
		q.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// beforeHalt returns the records of batch that may still be sent: all of them while the caller runs;
// after a halt, those before the halted record, up to the first one that is not.
func (p *Producer) beforeHalt(batch []*Record) []*Record {
	stop := p.stopAt()
	for i, rec := range batch {
		if rec.Seq >= stop {
			return batch[:i]
		}
	}
	return batch
}

// Produce sends batch to tp with the producer state ps, outside tp's queue, in the next request to
// tp's leader, and returns the broker's answer for tp: for a partition the caller numbers itself
// (a Kafka transaction's position record). Retrying is the caller's.
func (p *Producer) Produce(tp TopicPartition, batch []*Record, ps State) error {
	return p.produce(nil, tp, batch, ps)
}

// produce sends batch, for tp with the producer state ps, in the next request to tp's leader and
// returns the broker's answer for tp. q is tp's queue, nil for a batch sent outside one.
func (p *Producer) produce(q *partitionQueue, tp TopicPartition, batch []*Record, ps State) error {
	buf, _ := p.buffers.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	set, err := encodeRecordSet((*buf)[:0], batch, ps, p.compression)
	if err != nil {
		p.buffers.Put(buf)
		return err
	}
	*buf = set
	answered, base, err := p.requests.produce(p.ctx, q, tp, set, len(batch))
	// Exactly-once checks that each partition's commit marker lands past its records
	// (Committer.landed). A duplicate (DUPLICATE_SEQUENCE_NUMBER) was written, where is unknown.
	for i, rec := range batch {
		rec.Offset = -1
		if err == nil && base >= 0 {
			rec.Offset = base + int64(i)
		}
	}
	if answered && cap(*buf) <= 4<<20 {
		// Only a buffer whose request was answered is reused: after a timeout kafka-go may still be
		// writing it. A huge batch's is not worth keeping.
		p.buffers.Put(buf)
	}
	return err
}
