// Package producer is a Kafka producer for records whose order matters: one goroutine and at most
// one batch in flight per partition, a failed batch retried in place before anything after it, so
// a partition's records reach Kafka in order; only an error the broker returns for good ends a
// record's journey unacknowledged. It is idempotent where the broker allows it (idempotence.go)
// and transactional when given Transactions (the caller runs the Kafka transactions; the producer
// sends only the records of the active one and enrols their partitions). Records in, one answer
// per batch out (Config.Done): acknowledged, or refused for good with a classified error
// (errors.go).
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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
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

type topicInfo struct {
	partitions int
	fetched    time.Time
	leaders    []int32 // by partition: the broker that leads it
	ledAt      time.Time
}

// metadataTTL is how long a topic's partition count is trusted. Partitions are rarely added, and
// when they are, keys move to other partitions exactly as with the Java client.
const metadataTTL = time.Minute

// leadersTTL is how long a topic's partition leaders are trusted for grouping batches into
// requests: kafka-go's transport refreshes its own view about as often (its MetadataTTL), and a
// request it finds mixing leaders is split (coalesce.go), so a stale view costs a request, not a
// batch.
const leadersTTL = 5 * time.Second

// partitions returns the topic's partition count, asking the brokers (and, with AutoCreateTopics,
// letting them auto-create the topic) when it is not known or stale.
func (p *Producer) partitions(ctx context.Context, topic string) (int, error) {
	p.mu.Lock()
	info, ok := p.topics[topic]
	p.mu.Unlock()
	if ok && time.Since(info.fetched) < metadataTTL {
		return info.partitions, nil
	}
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	res, err := p.client.Transport.RoundTrip(rctx, p.client.Addr, &metadataAPI.Request{
		TopicNames:             []string{topic},
		AllowAutoTopicCreation: p.autoCreate,
	})
	if err != nil {
		if ok {
			return info.partitions, nil // keep using what we knew while the brokers are away
		}
		return 0, err
	}
	for _, t := range res.(*metadataAPI.Response).Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return 0, kafka.Error(t.ErrorCode)
		}
		if len(t.Partitions) == 0 {
			return 0, kafka.LeaderNotAvailable
		}
		p.mu.Lock()
		p.topics[topic] = topicInfo{partitions: len(t.Partitions), fetched: time.Now(), leaders: leaders(t.Partitions), ledAt: time.Now()}
		p.mu.Unlock()
		return len(t.Partitions), nil
	}
	return 0, kafka.UnknownTopicOrPartition
}

func leaders(partitions []metadataAPI.ResponsePartition) []int32 {
	out := make([]int32, len(partitions))
	for i := range out {
		out[i] = noLeader
	}
	for _, p := range partitions {
		if p.PartitionIndex >= 0 && int(p.PartitionIndex) < len(out) {
			out[p.PartitionIndex] = p.LeaderID
		}
	}
	return out
}

// leader returns the broker that leads tp, as kafka-go's transport last learned it (its cached
// metadata: no request goes out), or noLeader when it does not know.
func (p *Producer) leader(tp TopicPartition) int32 {
	p.mu.Lock()
	info, ok := p.topics[tp.Topic]
	p.mu.Unlock()
	if !ok || time.Since(info.ledAt) >= leadersTTL || tp.Partition >= len(info.leaders) {
		ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
		defer cancel()
		res, err := p.client.Transport.RoundTrip(ctx, p.client.Addr, &metadataAPI.Request{TopicNames: []string{tp.Topic}})
		if err != nil {
			return noLeader
		}
		for _, t := range res.(*metadataAPI.Response).Topics {
			if t.Name != tp.Topic || t.ErrorCode != 0 || len(t.Partitions) == 0 {
				continue
			}
			info.leaders, info.ledAt = leaders(t.Partitions), time.Now()
			p.mu.Lock()
			if cur, ok := p.topics[tp.Topic]; ok {
				cur.leaders, cur.ledAt = info.leaders, info.ledAt
				p.topics[tp.Topic] = cur
			} else {
				// A partition only ever sent to with Produce, never through Enqueue.
				p.topics[tp.Topic] = topicInfo{leaders: info.leaders, ledAt: info.ledAt}
			}
			p.mu.Unlock()
		}
	}
	if tp.Partition >= len(info.leaders) {
		return noLeader
	}
	return info.leaders[tp.Partition]
}

// forgetLeaders makes the next leader lookup of topic ask kafka-go's transport again.
func (p *Producer) forgetLeaders(topic string) {
	p.mu.Lock()
	if info, ok := p.topics[topic]; ok {
		info.ledAt = time.Time{}
		p.topics[topic] = info
	}
	p.mu.Unlock()
}

// Enqueue assigns rec a partition (murmur2 of the key, as the Java client does) and queues it.
// It waits, retrying, while the topic's partition count cannot be learned; it returns a permanent
// error (the topic is invalid or not authorized) or ctx's error.
func (p *Producer) Enqueue(ctx context.Context, rec *Record) error {
	var n int
	for attempt := 0; ; attempt++ {
		var err error
		if n, err = p.partitions(ctx, rec.Msg.Topic); err == nil {
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

// partitionQueue holds one partition's records not yet handed to a produce request.
type partitionQueue struct {
	p    *Producer
	tp   TopicPartition
	wake chan struct{}

	mu      sync.Mutex
	pending []*Record
	bytes   int // of pending
	closed  bool

	// told says its broker is assembling a request that waits for this partition's batch.
	told atomic.Bool
	// at is the broker it waits at (requests.wait); guarded by requests.mu.
	at *brokerRequests

	// Idempotence: the producer id and epoch this partition's batches carry and, in seq, the next
	// batch's base sequence. Only the partition's goroutine uses them.
	ps      State
	psReady bool
}

func (q *partitionQueue) push(rec *Record) {
	q.mu.Lock()
	// Transactional: a partition sends from the front only records of the Kafka transaction in
	// progress (readyLocked). A producer may be fed out of transaction order (the relay's
	// dead-letter producer gets a record of the next transaction rejected at once, before the
	// broker's refusal of a record of the transaction in progress arrives from its partition's
	// goroutine). Queued behind the later one, the earlier one would never go, and its transaction
	// never commit. Kept in transaction order it goes first. Without transactions every Txn is 0
	// and this appends.
	i := len(q.pending)
	for i > 0 && q.pending[i-1].Txn > rec.Txn {
		i--
	}
	q.pending = slices.Insert(q.pending, i, rec)
	q.bytes += int(rec.Size)
	q.mu.Unlock()
	q.signal()
}

func (q *partitionQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

// waitClosed waits, once the partition may send nothing more (a halt at or before its next
// record, a transaction that is over), until the producer closes or its context ends: sending on
// would put later records ahead of the withheld ones, and a Close has nothing left here to send,
// so it need not wait for the context (a halted relay's stop did, for its whole timeout).
func (q *partitionQueue) waitClosed() {
	for {
		q.mu.Lock()
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return
		}
		select {
		case <-q.wake:
		case <-q.p.ctx.Done():
			return
		}
	}
}

func (q *partitionQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *partitionQueue) run() {
	defer q.p.wg.Done()
	defer q.p.requests.settle(q)
	for {
		batch := q.next()
		if batch == nil {
			return
		}
		ok := q.send(batch)
		q.p.requests.settle(q) // a batch withheld before it went out: nobody waits for it
		if !ok {
			q.waitClosed()
			return
		}
	}
}

// next waits until the partition's batch is ready and takes as many records as one request may
// carry. A batch is ready when it is full, when its oldest record has waited the linger, when the
// partition's broker is sending a request (it goes along), and at once when the partition closes,
// its oldest record was flushed (Flush) or the Kafka transaction of its records
// is being committed.
func (q *partitionQueue) next() []*Record {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		q.mu.Lock()
		n := q.readyLocked()
		var wait time.Duration
		if n > 0 {
			wait = q.p.linger - time.Since(q.pending[0].Enqueued)
			if q.closed || wait <= 0 || q.told.Load() || q.fullLocked(n) || q.committingLocked() || q.pending[0].Seq <= q.p.flushed.Load() {
				batch := q.takeLocked()
				q.mu.Unlock()
				q.p.requests.wait(q, false) // a request opened meanwhile waits for this batch
				return batch
			}
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return nil
		}
		if n == 0 {
			q.p.requests.settle(q) // told while nothing of it may go yet (exactly-once)
		}
		var expired <-chan time.Time
		if n > 0 {
			if q.p.requests.wait(q, true) {
				continue // told: its broker is sending now
			}
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			expired = timer.C
		}
		select {
		case <-q.wake:
		case <-expired:
		case <-q.p.ctx.Done():
			return nil
		}
	}
}

// holds reports whether the partition has records of Kafka transaction gen waiting to be sent.
func (q *partitionQueue) holds(gen uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) > 0 && q.pending[0].Txn == gen
}

// fullLocked reports whether the first n pending records fill a request.
func (q *partitionQueue) fullLocked(n int) bool {
	if n >= q.p.maxRecords {
		return true
	}
	if q.p.txns == nil || n == len(q.pending) {
		return q.bytes >= q.p.maxBytes
	}
	size := 0
	for _, rec := range q.pending[:n] {
		size += int(rec.Size)
	}
	return size >= q.p.maxBytes
}

// committingLocked reports whether the pending records are of a Kafka transaction the committer
// has sealed: it waits for them, so they go now.
func (q *partitionQueue) committingLocked() bool {
	return q.p.txns != nil && q.pending[0].Txn <= q.p.txns.Sealed()
}

// readyLocked counts the pending records that may be sent now (up to one more than a request
// carries): with exactly-once, those of the Kafka transaction in progress; records published while
// it commits wait for the next one.
func (q *partitionQueue) readyLocked() int {
	if q.p.txns == nil {
		return len(q.pending)
	}
	active := q.p.txns.Active()
	n := 0
	for n < len(q.pending) && n <= q.p.maxRecords && q.pending[n].Txn <= active {
		n++
	}
	return n
}

func (q *partitionQueue) takeLocked() []*Record {
	size, n := 0, 0
	ready := q.readyLocked()
	for n < ready && n < q.p.maxRecords {
		size += int(q.pending[n].Size)
		if n > 0 && size > q.p.maxBytes {
			break
		}
		n++
	}
	batch := make([]*Record, n)
	copy(batch, q.pending)
	for _, rec := range batch {
		q.bytes -= int(rec.Size)
	}
	clear(q.pending[:n])
	q.pending = q.pending[n:]
	if len(q.pending) == 0 {
		q.pending = nil // let a burst's backing array go
	}
	return batch
}

// send produces batch, retrying in place until the broker takes it or refuses it for good. It
// returns false when it withheld records because the caller halted on an earlier one: those and
// everything queued behind them stay unsent and unacknowledged (they are replayed after the
// restart), so a key's later record never reaches Kafka without the halted one. Records before the
// halted one still go: acknowledging them lets the caller move up to it. It also returns false when
// the producer stopped for good (fenced, or its Kafka transaction failed).
//
// With idempotence, a batch keeps its records, producer id, epoch and base sequence from its first
// attempt on: the broker may have written that attempt, and only an identical retry is recognised
// as the same batch. (Without idempotence a retry is cut at a halt that happened meanwhile.)
func (q *partitionQueue) send(batch []*Record) bool {
	var ps State
	sent, cut := false, false
	for attempt := 0; ; attempt++ {
		if !sent {
			allowed := q.p.beforeHalt(batch)
			if len(allowed) == 0 {
				return false
			}
			cut = cut || len(allowed) < len(batch)
			batch = allowed
			var err error
			if ps, err = q.sequence(len(batch)); err != nil {
				return false
			}
		}
		if q.p.txns != nil {
			if err := q.p.txns.Add(q.p.ctx, q.tp); err != nil {
				if !sent && errors.Is(err, ErrTopicRefused) {
					// Never sent: its topic refuses the producer for good (transactional), so
					// Done settles the batch with the refusal; the sequence goes to what comes next.
					q.rewind(ps)
					q.p.done(batch, err)
					return !cut
				}
				return false // the transaction is over; these records are never acknowledged
			}
		}
		sent = ps.ID != NoProducerID
		err := q.p.produce(q, q.tp, batch, ps)
		switch {
		case err == nil || errors.Is(err, kafka.DuplicateSequenceNumber):
			// DUPLICATE_SEQUENCE_NUMBER: the broker wrote this batch before (an attempt whose answer
			// was lost) and keeps it once.
			q.p.done(batch, nil)
			return !cut
		case Permanent(err):
			// Refused for good, so not written: the sequence goes back for what comes next.
			q.rewind(ps)
			if len(batch) > 1 {
				// The broker refuses the whole batch for one record (an invalid record) or for its total
				// size (a topic may set a smaller max.message.bytes than ours): send the records one at a
				// time, in order, so only a record refused on its own is answered with the refusal. Once
				// one of them halts the caller, the rest are withheld.
				for _, rec := range batch {
					if !q.send([]*Record{rec}) {
						return false
					}
				}
				return !cut
			}
			q.p.done(batch, err)
			return !cut
		case SequenceLost(err) || ProducerRefused(err):
			if q.p.txns != nil {
				q.p.txns.Fail(err)
				return false
			}
			var ok bool
			if ps, ok = q.restart(len(batch), err); !ok {
				return false
			}
			continue // at once: the broker answered, it is not away
		case TransactionFailed(err):
			if q.p.txns != nil {
				q.p.txns.Fail(err)
				return false
			}
		}
		if stop := q.p.stopAt(); !slices.ContainsFunc(batch, func(r *Record) bool { return r.Seq < stop }) {
			// The caller halted at or before every record of this batch while it was retried (a
			// dead-letter queue is not in publish order, so each record is looked at): it is never
			// acknowledged (replayed after the restart), and nothing behind it on this partition is
			// sent any more, so its sequence numbers matter to nobody. Under exactly-once its
			// transaction was aborted at the halt, and a retry, in no transaction, is refused for
			// ever (NOT_ENOUGH_REPLICAS: "Unable to verify the partition has been added to the
			// transaction").
			return false
		}
		delay := Backoff(attempt)
		if q.p.txns != nil && errors.Is(err, kafka.NotEnoughReplicas) && attempt < verificationRetries {
			delay = verificationBackoff
		}
		q.p.retrying(q.tp.Topic, q.tp.Partition, len(batch), err, delay)
		select {
		case <-time.After(delay):
		case <-q.p.ctx.Done():
			return false // the caller gave up; these records stay unacknowledged
		}
	}
}

// A Kafka 3.6+ broker verifies that a partition was added to the transaction before it takes a
// transactional batch sent with Produce below v12 (kafka-go's), asking the coordinator; right after
// AddPartitionsToTxn that check often fails at once with NOT_ENOUGH_REPLICAS ("Unable to verify the
// partition has been added to the transaction"), and the next attempt passes. With the ordinary
// backoff (200 ms and up) nearly every Kafka transaction paid it: exactly-once drained at a fifth
// of the at-least-once rate. So a transactional batch refused so is tried again after
// verificationBackoff, for verificationRetries attempts, then with the ordinary backoff (a real
// shortage of in-sync replicas).
const (
	verificationBackoff = 5 * time.Millisecond
	verificationRetries = 100
)

// sequence returns the producer state for a new batch of n records and advances the partition's
// sequence past it.
func (q *partitionQueue) sequence(n int) (State, error) {
	if !q.psReady {
		ps, err := q.p.ident.Get(q.p.ctx)
		if err != nil {
			if q.p.ctx.Err() == nil {
				q.p.failed(err)
			}
			return State{}, err
		}
		q.ps, q.psReady = ps, true
	}
	ps := q.ps
	if ps.ID != NoProducerID {
		q.ps.Seq = NextSequence(ps.Seq, n)
	}
	return ps, nil
}

// rewind gives the sequence of a batch the broker did not write back to the next batch. One
// request is in flight per partition, so no later batch has taken a sequence yet.
func (q *partitionQueue) rewind(ps State) {
	if ps.ID != NoProducerID {
		q.ps.Seq = ps.Seq
	}
}

// restart moves the partition of the plain idempotent producer to a new epoch (or, when the broker
// refused the producer id or the epoch is exhausted, a new producer id) at sequence 0, for a batch
// of n records the broker did not write because it lost or refused the producer's state.
func (q *partitionQueue) restart(n int, cause error) (State, bool) {
	old := q.ps
	if ProducerRefused(cause) || old.Epoch == 0x7fff {
		for attempt := 0; ; attempt++ {
			ps, err := q.p.ident.Fresh(q.p.ctx)
			if err == nil {
				q.ps = ps
				break
			}
			if q.p.ctx.Err() != nil {
				return State{}, false
			}
			if werr := Wait(q.p.ctx, attempt, q.p.log, "retrying the producer id request", err); werr != nil {
				return State{}, false
			}
		}
	} else {
		q.ps.Epoch++
		q.ps.Seq = 0
	}
	q.p.log.Warn("the broker lost or refused this producer's state for the partition; continuing at sequence 0 of a new epoch",
		zap.String("topic", q.tp.Topic), zap.Int("partition", q.tp.Partition), zap.Int64("producer_id", q.ps.ID),
		zap.Int16("epoch", q.ps.Epoch), zap.Int("records", n), zap.Error(cause))
	ps := q.ps
	q.ps.Seq = NextSequence(0, n)
	return ps, true
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

// Murmur2 is the Java client's hash for keys (org.apache.kafka.common.utils.Utils.murmur2).
func Murmur2(data []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m           = 0x5bd1e995
		r           = 24
	)
	length := len(data)
	h := seed ^ uint32(length)
	for i := 0; i+4 <= length; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[length&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
