package producer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"
)

// Per-broker request coalescing, as the Java client's Sender does it: when one partition's batch
// is ready (full, lingered, flushed), every partition led by the same broker that holds records
// and has no request in flight sends its batch now, in the same Produce request. A broker's cost
// is mostly per request and per append, not per record: at 10,000 records/s over nine partitions,
// one request per kafka.linger instead of one per partition and round trip is what makes the
// producer as cheap for the broker as a tuned Java one.
//
// Each partition still has at most one batch in flight and runs its own send loop (producer.go):
// it encodes its batch with its own producer id, epoch and sequence, hands it to the request
// being assembled for its broker, and gets back exactly the answer the broker gave for its
// partition (error code, or the request's error when the request failed as a whole), so every
// per-partition rule (retries, sequence errors, refusals, fencing) applies unchanged. Batches
// ready at about the same time share a request, and nothing waits for one in flight: a partition
// ready while its broker has a request in flight opens the next one, so full batches of a drain
// still go out in parallel.
//
// The partition whose batch opens a request (the trigger) sends it from its own goroutine, which
// would wait for the answer anyway: it tells the broker's lingering partitions to go, waits until
// each has handed over its batch (or given up: halted, stopped) or gatherWait has passed, or the
// request reached maxRequestBytes, then sends it and hands out the answers.

// requests assembles the produce requests of one producer, per broker.
type requests struct {
	p *Producer

	mu      sync.Mutex
	brokers map[int32]*brokerRequests
}

// brokerRequests is one broker's partitions that will have a batch soon, and the request being
// assembled for it.
type brokerRequests struct {
	// waiting are the partitions that hold records, lingering (told to go when a request opens) or
	// preparing a batch they took (sequence, AddPartitionsToTxn, encoding).
	waiting map[*partitionQueue]bool
	open    *produceCall // nil, or the request that batches still join
}

// produceCall is one Produce request.
type produceCall struct {
	parts    []*producePart
	bytes    int
	told     map[*partitionQueue]bool // partitions it waits for
	gathered chan struct{}            // closed once nothing more is waited for
	closed   bool                     // gathered is closed: later batches go in the next request
}

// producePart is one partition's batch in a request, and the broker's answer for it.
type producePart struct {
	tp      TopicPartition
	set     []byte // the encoded record set, kafka-go's RawRecordSet form
	records int
	err     error
	// base is the offset the broker gave the batch's first record, -1 when it did not say (an
	// error, or a duplicate it no longer had the offset of).
	base int64
	// answered says the broker answered the request, so kafka-go is done with set: a request that
	// failed as a whole (a timeout) may still be being written by kafka-go's connection goroutine.
	answered bool
	done     chan struct{}
}

// noLeader groups partitions whose leader is unknown: each goes in a request of its own, which
// kafka-go routes (and refuses) as it would a single-partition request.
const noLeader int32 = -1

func newRequests(p *Producer) *requests {
	return &requests{p: p, brokers: make(map[int32]*brokerRequests)}
}

func (r *requests) broker(id int32) *brokerRequests {
	b := r.brokers[id]
	if b == nil {
		b = &brokerRequests{waiting: make(map[*partitionQueue]bool)}
		r.brokers[id] = b
	}
	return b
}

// gatherWait bounds how long a request waits for the partitions it told to go; they normally hand
// over their batch within microseconds, so this only matters when one is held up (a transaction's
// AddPartitionsToTxn, a producer id being fetched).
func (r *requests) gatherWait() time.Duration { return max(r.p.linger, time.Millisecond) }

// maxRequestBytes closes a request to more batches: full batches of a drain go in parallel
// requests, which the broker works on in parallel. It is the Java client's max.request.size
// default, and at least one batch.
func (r *requests) maxRequestBytes() int { return max(r.p.maxBytes, 1<<20) }

// wait registers q, which holds records, with its broker until it hands over a batch: lingering
// (the records wait for their linger) or, once it took its batch, preparing it. It reports whether
// q should go at once: a request to its broker is being assembled.
func (r *requests) wait(q *partitionQueue, lingering bool) bool {
	leader := r.p.leader(q.tp)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leaveLocked(q)
	if leader == noLeader {
		return false
	}
	b := r.broker(leader)
	b.waiting[q] = true
	q.at = b
	if c := b.open; c != nil && !c.closed {
		if !c.told[q] {
			c.told[q] = true
			q.told.Store(true)
		}
		return lingering
	}
	return false
}

// leaveLocked takes q off its broker's waiting partitions.
func (r *requests) leaveLocked(q *partitionQueue) {
	if q.at != nil {
		delete(q.at.waiting, q)
		q.at = nil
	}
}

// settle says q hands over nothing now (its batch was withheld, or it stopped): a request waiting
// for it goes without it.
func (r *requests) settle(q *partitionQueue) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leaveLocked(q)
	r.untellLocked(q)
}

// untellLocked ends every wait of a request for q.
func (r *requests) untellLocked(q *partitionQueue) {
	if !q.told.Swap(false) {
		return
	}
	for _, b := range r.brokers {
		if c := b.open; c != nil && c.told[q] {
			delete(c.told, q)
			r.gatheredLocked(b, c)
		}
	}
}

// gatheredLocked closes c to more batches once it waits for nothing more.
func (r *requests) gatheredLocked(b *brokerRequests, c *produceCall) {
	if !c.closed && (len(c.told) == 0 || c.bytes >= r.maxRequestBytes()) {
		c.closed = true
		close(c.gathered)
		if b.open == c {
			b.open = nil
		}
	}
}

// produce sends set, the encoded batch of records for tp, in the next request to tp's leader and
// returns whether set may be reused (the broker answered), the offset of its first record (-1 if
// unknown) and the broker's answer for tp. q is the partition's queue, nil for a batch sent outside
// one (the position record of a Kafka transaction).
func (r *requests) produce(ctx context.Context, q *partitionQueue, tp TopicPartition, set []byte, records int) (answered bool, base int64, err error) {
	leader := r.p.leader(tp)
	part := &producePart{tp: tp, set: set, records: records, base: -1, done: make(chan struct{})}
	r.mu.Lock()
	var b *brokerRequests
	var c *produceCall
	if leader != noLeader {
		b = r.broker(leader)
		c = b.open
	}
	if q != nil {
		r.leaveLocked(q)
		if c != nil && c.told[q] {
			delete(c.told, q) // joins below
			q.told.Store(false)
		}
		r.untellLocked(q) // a request to another broker (the leader moved) goes without it
	}
	if c != nil && c.has(tp) {
		c = nil // cannot happen with one batch in flight per partition; go alone rather than mix them
	}
	trigger := c == nil
	if trigger {
		c = &produceCall{told: make(map[*partitionQueue]bool), gathered: make(chan struct{})}
		if b != nil && b.open == nil {
			b.open = c
			// Every partition of the broker that holds records goes now, in this request.
			for wq := range b.waiting {
				c.told[wq] = true
				wq.told.Store(true)
				wq.signal()
			}
		}
	}
	c.parts = append(c.parts, part)
	c.bytes += len(set)
	if b != nil && b.open == c {
		r.gatheredLocked(b, c)
	} else if !c.closed {
		c.closed = true // a request of its own
		close(c.gathered)
	}
	r.mu.Unlock()

	if trigger {
		r.send(ctx, b, c)
	}
	select {
	case <-part.done:
		return part.answered, part.base, part.err
	case <-ctx.Done():
		return false, -1, ctx.Err()
	}
}

func (c *produceCall) has(tp TopicPartition) bool {
	for _, p := range c.parts {
		if p.tp == tp {
			return true
		}
	}
	return false
}

// send waits until c has gathered its batches, sends it and hands out the answers.
func (r *requests) send(ctx context.Context, b *brokerRequests, c *produceCall) {
	timer := time.NewTimer(r.gatherWait())
	select {
	case <-c.gathered:
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	r.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.gathered)
	}
	if b != nil && b.open == c {
		b.open = nil
	}
	parts := c.parts
	r.mu.Unlock()

	err := r.roundTrip(ctx, parts)
	var layout *rawproduce.Error
	if errors.As(err, &layout) && len(parts) > 1 {
		// kafka-go refused the request before sending it: a topic or partition it does not know yet
		// (just auto-created) or leaders that differ from what this producer knew. Nothing was
		// sent, so each partition goes on its own, and only the one kafka-go cannot route fails.
		for _, part := range parts {
			r.p.forgetLeaders(part.tp.Topic)
			if err := r.roundTrip(ctx, []*producePart{part}); err != nil {
				part.err = err
			}
			close(part.done)
		}
		return
	}
	for _, part := range parts {
		if err != nil {
			part.err = err
		}
		close(part.done)
	}
}

// roundTrip sends one Produce request holding parts and sets each part's err from the broker's
// answer for its partition. It returns the error of the request as a whole.
func (r *requests) roundTrip(ctx context.Context, parts []*producePart) error {
	p := r.p
	records := 0
	req := &rawproduce.Request{Acks: int16(kafka.RequireAll), Timeout: int32(p.timeout.Milliseconds())}
	if p.txns != nil {
		req.TransactionalID = p.transactionalID
	}
	for _, part := range parts {
		records += part.records
		rp := rawproduce.RequestPartition{
			Partition: int32(part.tp.Partition),
			RecordSet: protocol.RawRecordSet{Reader: bytes.NewReader(part.set)},
		}
		i := 0
		for i < len(req.Topics) && req.Topics[i].Topic != part.tp.Topic {
			i++
		}
		if i == len(req.Topics) {
			req.Topics = append(req.Topics, rawproduce.RequestTopic{Topic: part.tp.Topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
	}
	p.sent(records)
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	m, err := p.client.Transport.RoundTrip(rctx, p.client.Addr, req)
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	res, ok := m.(*produceAPI.Response)
	if !ok {
		return fmt.Errorf("produce: unexpected response %T", m)
	}
	for _, part := range parts {
		part.answered = true
		part.err = fmt.Errorf("produce: the broker's answer does not mention partition %d of %s", part.tp.Partition, part.tp.Topic)
	}
	for _, t := range res.Topics {
		for _, rp := range t.Partitions {
			for _, part := range parts {
				if part.tp.Topic == t.Topic && part.tp.Partition == int(rp.Partition) {
					part.err = partitionError(rp.ErrorCode, rp.ErrorMessage)
					if part.err == nil {
						part.base = rp.BaseOffset
					}
				}
			}
		}
	}
	return nil
}

// partitionError is a partition's error code as kafka-go's RawProduce reports it.
func partitionError(code int16, message string) error {
	switch {
	case code == 0:
		return nil
	case message == "":
		return kafka.Error(code)
	}
	return fmt.Errorf("%w: %s", kafka.Error(code), message)
}
