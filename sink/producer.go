package sink

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

// producer sends records to Kafka with one goroutine per partition and at most one batch per
// partition in flight. A partition's batch is ready when it is full (BatchSize records or
// MaxMessageBytes), when its oldest record has waited Linger, or when it must go now (Close, a Kafka
// transaction being committed, the partition's broker sending a request); a ready batch goes in a
// Produce request together with the batches of every other partition of the same broker that hold
// records (coalesce.go), as the Java client's Sender does. A failed batch is retried in place before
// anything after it, so a partition's records reach Kafka in order; only an error the broker returns
// for good ends a record's journey unacknowledged.
//
// kafka-go's Writer is not used: it cuts a batch a linger after its first record even while the
// previous batch of the partition is still in flight, never merges queued batches and sends one
// request per partition, and its retry rule needs patching to keep order.
type producer struct {
	client      *kafka.Client
	compression kafka.Compression
	maxBytes    int // per request: one record batch must fit the broker's message.max.bytes
	maxRecords  int
	linger      time.Duration
	timeout     time.Duration
	ctx         context.Context // ends when the sink stops waiting (Close gave up)
	done        func(batch []*delivery, err error)
	retrying    func(topic string, partition int, records int, err error, delay time.Duration)
	sent        func(records int) // one produce request went out
	stopAt      func() uint64     // the halted record's position once the sink has halted; nothing at or after it is sent
	roundRobin  atomic.Uint32
	failed      func(error) // stops the sink for good (a start error of the idempotent producer)
	ident       *identity   // producer id and epoch (idempotence)
	buffers     sync.Pool   // *[]byte: encoded record sets
	txn         *txnManager // nil unless exactly-once
	requests    *requests   // the produce requests being assembled, per broker
	log         *zap.Logger

	// flushed is the publish position (record.seq) up to which records go without lingering
	// (Sink.Flush).
	flushed atomic.Uint64

	mu     sync.Mutex
	parts  map[topicPartition]*partitionQueue
	topics map[string]topicInfo
	closed bool
	wg     sync.WaitGroup
}

type topicPartition struct {
	topic     string
	partition int
}

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
// requests: kafka-go's transport refreshes its own view as often (Sink's MetadataTTL), and a
// request it finds mixing leaders is split (coalesce.go), so a stale view costs a request, not a
// batch.
const leadersTTL = 5 * time.Second

// partitions returns the topic's partition count, asking the brokers (and letting them auto-create
// the topic) when it is not known or stale.
func (p *producer) partitions(ctx context.Context, topic string) (int, error) {
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
		AllowAutoTopicCreation: true,
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
func (p *producer) leader(tp topicPartition) int32 {
	p.mu.Lock()
	info, ok := p.topics[tp.topic]
	p.mu.Unlock()
	if !ok || time.Since(info.ledAt) >= leadersTTL || tp.partition >= len(info.leaders) {
		ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
		defer cancel()
		res, err := p.client.Transport.RoundTrip(ctx, p.client.Addr, &metadataAPI.Request{TopicNames: []string{tp.topic}})
		if err != nil {
			return noLeader
		}
		for _, t := range res.(*metadataAPI.Response).Topics {
			if t.Name != tp.topic || t.ErrorCode != 0 || len(t.Partitions) == 0 {
				continue
			}
			info.leaders, info.ledAt = leaders(t.Partitions), time.Now()
			p.mu.Lock()
			if cur, ok := p.topics[tp.topic]; ok {
				cur.leaders, cur.ledAt = info.leaders, info.ledAt
				p.topics[tp.topic] = cur
			} else {
				// The positions topic: sent to, never partitioned by the producer.
				p.topics[tp.topic] = topicInfo{leaders: info.leaders, ledAt: info.ledAt}
			}
			p.mu.Unlock()
		}
	}
	if tp.partition >= len(info.leaders) {
		return noLeader
	}
	return info.leaders[tp.partition]
}

// forgetLeaders makes the next leader lookup of topic ask kafka-go's transport again.
func (p *producer) forgetLeaders(topic string) {
	p.mu.Lock()
	if info, ok := p.topics[topic]; ok {
		info.ledAt = time.Time{}
		p.topics[topic] = info
	}
	p.mu.Unlock()
}

// enqueue assigns rec a partition (murmur2 of the key, as the Java client does) and queues it.
// It waits, retrying, while the topic's partition count cannot be learned; it returns a permanent
// error (the topic is invalid or not authorized) or ctx's error.
func (p *producer) enqueue(ctx context.Context, rec *delivery) error {
	var n int
	for attempt := 0; ; attempt++ {
		var err error
		if n, err = p.partitions(ctx, rec.msg.Topic); err == nil {
			break
		}
		if p.txn != nil && errors.Is(err, kafka.TopicAuthorizationFailed) {
			// Waiting would hold every Kafka transaction (errTopicRefused).
			return refusedTopic(rec.msg.Topic, err)
		}
		if permanent(err) {
			return err
		}
		delay := backoff(attempt)
		p.retrying(rec.msg.Topic, -1, 1, err, delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	switch {
	case rec.partition >= n:
		return fmt.Errorf("%w: the event names partition %d, and topic %s has %d", errNoSuchPartition, rec.partition, rec.msg.Topic, n)
	case rec.partition >= 0:
		rec.msg.Partition = rec.partition // the event's own (PlacePartition)
	case rec.msg.Key != nil:
		rec.msg.Partition = int((murmur2(rec.msg.Key) & 0x7fffffff) % uint32(n))
	default:
		rec.msg.Partition = int(p.roundRobin.Add(1) % uint32(n)) // no key, no order to keep: spread
	}
	q := p.queue(topicPartition{rec.msg.Topic, rec.msg.Partition})
	if q == nil {
		return errors.New("sink: producer closed")
	}
	q.push(rec)
	return nil
}

func (p *producer) queue(tp topicPartition) *partitionQueue {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	q := p.parts[tp]
	if q == nil {
		q = &partitionQueue{p: p, tp: tp, wake: make(chan struct{}, 1)}
		if p.txn != nil {
			p.txn.register(q)
		}
		p.parts[tp] = q
		p.wg.Add(1)
		go q.run()
	}
	return q
}

// close lets every partition send what it holds and returns once all have stopped; partitions
// still retrying stop when p.ctx ends.
// flush lets the queued records at or before publish position seq go without lingering.
func (p *producer) flush(seq uint64) {
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

func (p *producer) close() {
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
	p    *producer
	tp   topicPartition
	wake chan struct{}

	mu      sync.Mutex
	pending []*delivery
	bytes   int // of pending
	closed  bool

	// told says its broker is assembling a request that waits for this partition's batch.
	told atomic.Bool
	// at is the broker it waits at (requests.wait); guarded by requests.mu.
	at *brokerRequests

	// Idempotence: the producer id and epoch this partition's batches carry and, in seq, the next
	// batch's base sequence. Only the partition's goroutine uses them.
	ps      producerState
	psReady bool
}

func (q *partitionQueue) push(rec *delivery) {
	q.mu.Lock()
	// Exactly-once: a partition sends from the front only records of the Kafka transaction in
	// progress (readyLocked). The dead-letter producer is fed from two sides: Publish rejects an
	// event of the next transaction at once, while the broker's refusal of an event of the
	// transaction in progress arrives later, from its partition's goroutine. Queued behind the
	// later one, the earlier one would never go, and its transaction never commit. Kept in
	// transaction order it goes first (which is also the order they were published in). Without
	// transactions every txn is 0 and this appends.
	i := len(q.pending)
	for i > 0 && q.pending[i-1].txn > rec.txn {
		i--
	}
	q.pending = slices.Insert(q.pending, i, rec)
	q.bytes += int(rec.size)
	q.mu.Unlock()
	q.signal()
}

func (q *partitionQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
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
			<-q.p.ctx.Done() // halted: sending more would put later events ahead of the failed one
			return
		}
	}
}

// next waits until the partition's batch is ready and takes as many records as one request may
// carry. A batch is ready when it is full, when its oldest record has waited the linger, when the
// partition's broker is sending a request (it goes along), and at once when the partition closes,
// its oldest record was flushed (Sink.Flush) or (exactly-once) the Kafka transaction of its records
// is being committed.
func (q *partitionQueue) next() []*delivery {
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
			wait = q.p.linger - time.Since(q.pending[0].enqueued)
			if q.closed || wait <= 0 || q.told.Load() || q.fullLocked(n) || q.committingLocked() || q.pending[0].seq <= q.p.flushed.Load() {
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
	return len(q.pending) > 0 && q.pending[0].txn == gen
}

// fullLocked reports whether the first n pending records fill a request.
func (q *partitionQueue) fullLocked(n int) bool {
	if n >= q.p.maxRecords {
		return true
	}
	if q.p.txn == nil || n == len(q.pending) {
		return q.bytes >= q.p.maxBytes
	}
	size := 0
	for _, rec := range q.pending[:n] {
		size += int(rec.size)
	}
	return size >= q.p.maxBytes
}

// committingLocked reports whether the pending records are of a Kafka transaction the committer
// has sealed: it waits for them, so they go now.
func (q *partitionQueue) committingLocked() bool {
	return q.p.txn != nil && q.pending[0].txn <= q.p.txn.sealed.Load()
}

// readyLocked counts the pending records that may be sent now (up to one more than a request
// carries): with exactly-once, those of the Kafka transaction in progress; records published while
// it commits wait for the next one.
func (q *partitionQueue) readyLocked() int {
	if q.p.txn == nil {
		return len(q.pending)
	}
	active := q.p.txn.active.Load()
	n := 0
	for n < len(q.pending) && n <= q.p.maxRecords && q.pending[n].txn <= active {
		n++
	}
	return n
}

func (q *partitionQueue) takeLocked() []*delivery {
	size, n := 0, 0
	ready := q.readyLocked()
	for n < ready && n < q.p.maxRecords {
		size += int(q.pending[n].size)
		if n > 0 && size > q.p.maxBytes {
			break
		}
		n++
	}
	batch := make([]*delivery, n)
	copy(batch, q.pending)
	for _, rec := range batch {
		q.bytes -= int(rec.size)
	}
	clear(q.pending[:n])
	q.pending = q.pending[n:]
	if len(q.pending) == 0 {
		q.pending = nil // let a burst's backing array go
	}
	return batch
}

// send produces batch, retrying in place until the broker takes it or refuses it for good. It
// returns false when it withheld records because the sink halted on an earlier one: those and
// everything queued behind them stay unsent and unacknowledged (they are replayed after the
// restart), so a key's later event never reaches Kafka without the halted one. Records before the
// halted one still go: acknowledging them lets the slot move up to it. It also returns false when
// the sink stopped for good (fenced, or its Kafka transaction aborted).
//
// With idempotence, a batch keeps its records, producer id, epoch and base sequence from its first
// attempt on: the broker may have written that attempt, and only an identical retry is recognised
// as the same batch. (Without idempotence a retry is cut at a halt that happened meanwhile.)
func (q *partitionQueue) send(batch []*delivery) bool {
	var ps producerState
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
		if q.p.txn != nil {
			if err := q.p.txn.add(q.p.ctx, q.tp); err != nil {
				if !sent && errors.Is(err, errTopicRefused) {
					// Never sent: its topic refuses the relay for good (under exactly-once), so
					// the failure policy settles the batch; the sequence goes to what comes next.
					q.rewind(ps)
					q.p.done(batch, err)
					return !cut
				}
				return false // the sink stopped; these records are never acknowledged
			}
		}
		sent = ps.id != noProducerID
		err := q.p.produce(q, q.tp, batch, ps)
		switch {
		case err == nil || errors.Is(err, kafka.DuplicateSequenceNumber):
			// DUPLICATE_SEQUENCE_NUMBER: the broker wrote this batch before (an attempt whose answer
			// was lost) and keeps it once.
			q.p.done(batch, nil)
			return !cut
		case permanent(err):
			// Refused for good, so not written: the sequence goes back for what comes next.
			q.rewind(ps)
			if len(batch) > 1 {
				// The broker refuses the whole batch for one record (an invalid record) or for its total
				// size (a topic may set a smaller max.message.bytes than ours): send the records one at a
				// time, in order, so only a record refused on its own goes to the failure policy. Once
				// one of them halts the sink, the rest are withheld.
				for _, rec := range batch {
					if !q.send([]*delivery{rec}) {
						return false
					}
				}
				return !cut
			}
			q.p.done(batch, err)
			return !cut
		case sequenceLost(err) || producerRefused(err):
			if q.p.txn != nil {
				q.p.txn.fail(err)
				return false
			}
			var ok bool
			if ps, ok = q.restart(len(batch), err); !ok {
				return false
			}
			continue // at once: the broker answered, it is not away
		case transactionFailed(err):
			if q.p.txn != nil {
				q.p.txn.fail(err)
				return false
			}
		}
		delay := backoff(attempt)
		if q.p.txn != nil && errors.Is(err, kafka.NotEnoughReplicas) && attempt < verificationRetries {
			delay = verificationBackoff
		}
		q.p.retrying(q.tp.topic, q.tp.partition, len(batch), err, delay)
		select {
		case <-time.After(delay):
		case <-q.p.ctx.Done():
			return false // the sink gave up; these records stay unacknowledged, so they are replayed
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
func (q *partitionQueue) sequence(n int) (producerState, error) {
	if !q.psReady {
		ps, err := q.p.ident.get(q.p.ctx)
		if err != nil {
			if q.p.ctx.Err() == nil {
				q.p.failed(err)
			}
			return producerState{}, err
		}
		q.ps, q.psReady = ps, true
	}
	ps := q.ps
	if ps.id != noProducerID {
		q.ps.seq = nextSequence(ps.seq, n)
	}
	return ps, nil
}

// rewind gives the sequence of a batch the broker did not write back to the next batch. One
// request is in flight per partition, so no later batch has taken a sequence yet.
func (q *partitionQueue) rewind(ps producerState) {
	if ps.id != noProducerID {
		q.ps.seq = ps.seq
	}
}

// restart moves the partition of the plain idempotent producer to a new epoch (or, when the broker
// refused the producer id or the epoch is exhausted, a new producer id) at sequence 0, for a batch
// of n records the broker did not write because it lost or refused the producer's state.
func (q *partitionQueue) restart(n int, cause error) (producerState, bool) {
	old := q.ps
	if producerRefused(cause) || old.epoch == 0x7fff {
		for attempt := 0; ; attempt++ {
			ps, err := q.p.ident.fresh(q.p.ctx)
			if err == nil {
				q.ps = ps
				break
			}
			if q.p.ctx.Err() != nil {
				return producerState{}, false
			}
			if werr := wait(q.p.ctx, attempt, q.p.log, "retrying the producer id request", err); werr != nil {
				return producerState{}, false
			}
		}
	} else {
		q.ps.epoch++
		q.ps.seq = 0
	}
	q.p.log.Warn("the broker lost or refused this producer's state for the partition; continuing at sequence 0 of a new epoch",
		zap.String("topic", q.tp.topic), zap.Int("partition", q.tp.partition), zap.Int64("producer_id", q.ps.id),
		zap.Int16("epoch", q.ps.epoch), zap.Int("events", n), zap.Error(cause))
	ps := q.ps
	q.ps.seq = nextSequence(0, n)
	return ps, true
}

// sequenceLost reports the errors that say the broker has no usable sequence state for the
// producer on the partition; the batch was not written.
func sequenceLost(err error) bool {
	return errors.Is(err, kafka.OutOfOrderSequenceNumber) || errors.Is(err, kafka.UnknownProducerId)
}

// producerRefused reports the errors that say the producer's epoch is not (or no longer) the
// current one: for a transactional producer, someone took over its transactional id.
func producerRefused(err error) bool {
	return errors.Is(err, kafka.InvalidProducerEpoch) || errors.Is(err, kafka.ProducerFenced)
}

// transactionFailed reports the errors after which a Kafka transaction cannot commit.
func transactionFailed(err error) bool {
	return errors.Is(err, kafka.InvalidTransactionState) || errors.Is(err, errTransactionAbortable) ||
		errors.Is(err, kafka.InvalidProducerIDMapping) || errors.Is(err, kafka.TransactionalIDAuthorizationFailed)
}

// beforeHalt returns the records of batch that may still be sent: all of them while the sink runs;
// after a halt, those before the halted record, up to the first one that is not.
func (p *producer) beforeHalt(batch []*delivery) []*delivery {
	stop := p.stopAt()
	for i, rec := range batch {
		if rec.seq >= stop {
			return batch[:i]
		}
	}
	return batch
}

// produce sends batch, for tp with the producer state ps, in the next request to tp's leader and
// returns the broker's answer for tp. q is tp's queue, nil for a batch sent outside one.
func (p *producer) produce(q *partitionQueue, tp topicPartition, batch []*delivery, ps producerState) error {
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
	// (txnManager.landed). A duplicate (DUPLICATE_SEQUENCE_NUMBER) was written, where is unknown.
	for i, rec := range batch {
		rec.offset = -1
		if err == nil && base >= 0 {
			rec.offset = base + int64(i)
		}
	}
	if answered && cap(*buf) <= 4<<20 {
		// Only a buffer whose request was answered is reused: after a timeout kafka-go may still be
		// writing it. A huge batch's is not worth keeping.
		p.buffers.Put(buf)
	}
	return err
}

// murmur2 is the Java client's hash for keys (org.apache.kafka.common.utils.Utils.murmur2).
func murmur2(data []byte) uint32 {
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
