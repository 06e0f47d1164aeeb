package producer

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

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
	wake := q.wakeForLocked(i)
	q.pending = slices.Insert(q.pending, i, rec)
	q.bytes += int(rec.Size)
	wake = wake || len(q.pending) >= q.p.maxRecords || q.bytes >= q.p.maxBytes
	q.mu.Unlock()
	if wake {
		q.signal()
	}
}

// wakeForLocked says whether a record inserted at pending[i] changes what the partition's
// goroutine decided when it last looked: a first record starts the linger (and the wait for a
// request to its broker), and one put ahead of others (an earlier Kafka transaction's) changes
// which records may go. A record appended behind others changes neither: the goroutine already
// waits for the oldest's linger, for a request to its broker, or for its transaction, and push
// wakes it when the batch is full. Waking it for every record cost a round of locks, a clock
// reading, a timer reset and its broker's map of waiting partitions per event.
func (q *partitionQueue) wakeForLocked(i int) bool {
	return len(q.pending) == 0 || i < len(q.pending)
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
			return q.refused(batch, ps, err) && !cut
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
		if q.p.haltedBefore(batch) {
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

// refused answers a batch the broker refused for good with err, so did not write: the sequence goes
// back for what comes next. A batch of several records is sent again one record at a time, in
// order: the broker refuses a whole batch for one record (an invalid record) or for its total size
// (a topic may set a smaller max.message.bytes than ours), and only a record refused on its own is
// answered with the refusal. It returns false once one of them halted the caller: the rest are
// withheld.
func (q *partitionQueue) refused(batch []*Record, ps State, err error) bool {
	q.rewind(ps)
	if len(batch) == 1 {
		q.p.done(batch, err)
		return true
	}
	for _, rec := range batch {
		if !q.send([]*Record{rec}) {
			return false
		}
	}
	return true
}

// haltedBefore reports whether the caller halted at or before every record of batch while it was
// retried (a dead-letter queue is not in publish order, so each record is looked at): the batch is
// never acknowledged (replayed after the restart), and nothing behind it on this partition is sent
// any more, so its sequence numbers matter to nobody. Under exactly-once its transaction was aborted
// at the halt, and a retry, in no transaction, is refused for ever (NOT_ENOUGH_REPLICAS: "Unable to
// verify the partition has been added to the transaction").
func (p *Producer) haltedBefore(batch []*Record) bool {
	stop := p.stopAt()
	return !slices.ContainsFunc(batch, func(r *Record) bool { return r.Seq < stop })
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
