package producer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

// Transactions: the stream of records is cut into Kafka transactions, each a prefix of what is
// left, in the caller's order. A record joins the transaction that is open when it is handed over
// (Committer.Join: its generation, Record.Txn). The committer seals the open transaction as soon as
// it is free and the transaction's first record is Linger old (so under load commits go back to
// back, each taking what arrived while the one before committed); a transaction also closes once
// it holds MaxRecords records (the next record then opens the next one, which waits behind it).
// The committer, one transaction after the other,
//
//  1. waits until every record of it is written (or dead-lettered, inside the same transaction),
//     while the records published meanwhile wait in their partitions' queues for the next one;
//  2. lets the owner write what goes with the records (Owner.BeforeCommit: the relay's position of
//     its last record, to the positions topic), inside the transaction;
//  3. commits it (EndTxn), waits until its markers landed (markers.go), and only then hands its
//     batches back (Committer.Written's done): the caller acknowledges only what a read_committed
//     consumer can see.
//
// The loop that cuts, commits and aborts the transactions is in commit.go. Partitions join a
// transaction with AddPartitionsToTxn (addpartitions.go) before their first batch of it: kafka-go
// speaks Produce up to v8, so the broker's implicit adding (KIP-890 transactions v2, Produce v12)
// is not available.
//
// Anything that ends a transaction other than its commit stops the committer for good, without
// handing back any record of it (Owner.Stopped): the relay restarts from the last committed
// position (the records are replayed from PostgreSQL). That is simpler than resending an aborted
// transaction's records from memory, and a failed transaction is rare (the coordinator timed it
// out, the broker lost the producer's state, another producer took over). A halt aborts the
// transaction holding the halted record and commits none after it: what is committed is every
// transaction before it.

// Owner is what a Committer needs of whoever publishes through it (the relay's sink).
type Owner interface {
	// Halted returns the generation of the transaction holding the record the owner halted on:
	// that transaction is aborted and none after it commits.
	Halted() (gen uint64, halted bool)
	// Companion returns a partition the owner writes in every transaction (the relay's
	// positions partition), once it is known: it joins with each transaction's first partitions,
	// and its marker is not waited for behind other producers' transactions (landed).
	Companion() (TopicPartition, bool)
	// BeforeCommit writes, inside the transaction, what goes with its records (the relay: the
	// position of last, the written record latest in order, with where the records lie) and
	// returns where it wrote (offset -1 if the broker did not say; no topic if it wrote nothing).
	BeforeCommit(ctx context.Context, last *Record, spans map[TopicPartition]Span) (TopicPartition, int64, error)
	// Committed says that the transaction of last is committed and readable; its batches have
	// been handed back.
	Committed(last *Record)
	// Stopped says the committer stopped for good after err, having aborted what it could;
	// fenced says another producer took the transactional id.
	Stopped(err error, fenced bool)
	// Count counts a transaction's outcome: committed, aborted, fenced or repaired.
	Count(outcome string)
}

// CommitterConfig configures a Committer.
type CommitterConfig struct {
	Client   *kafka.Client
	ID       string // the transactional id
	Identity *Identity
	Timeout  time.Duration // of one request
	// MaxRecords closes a transaction once it holds this many records.
	MaxRecords int
	// Linger is how old a transaction's first record gets before the committer, once it is free,
	// takes the transaction.
	Linger time.Duration
	Owner  Owner
	Log    *zap.Logger
}

// Committer runs the Kafka transactions of one or more producers (Producers) sharing a
// transactional id: it implements their Transactions.
type Committer struct {
	client     *kafka.Client
	id         string
	timeout    time.Duration
	maxRecords int
	linger     time.Duration // how old a transaction's first record gets before the committer takes it
	ident      *Identity
	coord      *Coordinator
	owner      Owner
	log        *zap.Logger
	producers  []*Producer
	// firstCheck is how long after a commit or abort the check of its markers waits (landed).
	firstCheck markerDelay

	// active is the generation partitions may send; records of a later one wait.
	active atomic.Uint64
	// sealed is the latest generation the committer has sealed: its records go at once, without
	// lingering, since the commit waits for them.
	sealed atomic.Uint64

	mu sync.Mutex
	// txns are the transactions not yet committed, oldest first: txns[0] is the active one (open,
	// or sealed and committing), the last one is where new records go; generations are
	// consecutive.
	txns   []*kafkaTxn
	added  map[TopicPartition]bool // partitions added to txns[0]
	adding map[TopicPartition]bool // partitions waiting for the AddPartitionsToTxn in flight or the next one
	// refused are the partitions of txns[0] whose topic the producer may not write (RefusedTopic):
	// their records are handed back with the refusal. The next transaction asks again (an ACL may
	// have been granted meanwhile).
	refused map[TopicPartition]error
	addBusy bool
	addDone chan struct{} // closed when the AddPartitionsToTxn in flight ends
	closing bool
	ended   bool  // no transaction is begun any more: the committer stopped, failed or halted
	failErr error // why the transaction failed; the committer acts on it

	wake chan struct{}
	done chan struct{} // closed when the committer has stopped
}

// kafkaTxn is one Kafka transaction's records.
type kafkaTxn struct {
	gen         uint64
	started     time.Time // its first record's arrival
	records     int       // records that joined it
	outstanding int       // of those, not yet written or dead-lettered
	held        []heldBatch
	last        *Record // the written record latest in order
	sealed      bool
	// spans is where its records lie in each partition it wrote: its marker must land past them
	// (landed).
	spans map[TopicPartition]Span
}

type heldBatch struct {
	batch []*Record
	done  func([]*Record) // hands it back once committed
}

// NewCommitter returns a committer; Run runs it, and its producers are set before the first
// record (Producers).
func NewCommitter(cfg CommitterConfig) *Committer {
	tm := &Committer{
		client: withTransport(cfg.Client), id: cfg.ID, timeout: cfg.Timeout, maxRecords: max(1, cfg.MaxRecords), linger: cfg.Linger,
		ident: cfg.Identity, coord: NewCoordinator(cfg.Client, cfg.ID), owner: cfg.Owner, log: cfg.Log,
		txns:    []*kafkaTxn{{gen: 1}},
		added:   make(map[TopicPartition]bool),
		adding:  make(map[TopicPartition]bool),
		refused: make(map[TopicPartition]error),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	tm.active.Store(1)
	return tm
}

// Producers names the producers whose partitions send the records of the active transaction;
// call it once, before the first record.
func (tm *Committer) Producers(ps ...*Producer) { tm.producers = ps }

// AbortGrace bounds the abort of the transaction in progress when the committer stops.
const AbortGrace = 2 * time.Second

// ErrStopped is the answer of a committer that stopped (Add, Flush).
var ErrStopped = errors.New("producer: the kafka transactions stopped")

// halted reports whether the owner halted.
func (tm *Committer) halted() bool {
	_, ok := tm.owner.Halted()
	return ok
}

// Done is closed once the committer has stopped.
func (tm *Committer) Done() <-chan struct{} { return tm.done }

// Wake makes the committer look at its owner again: it halted.
func (tm *Committer) Wake() { tm.signal() }

func (tm *Committer) signal() {
	select {
	case tm.wake <- struct{}{}:
	default:
	}
}

// Active is the generation partitions may send (Transactions).
func (tm *Committer) Active() uint64 { return tm.active.Load() }

// Sealed is the latest generation the committer has sealed (Transactions).
func (tm *Committer) Sealed() uint64 { return tm.sealed.Load() }

// wakeProducers makes the partitions look at their records again: the active or the sealed
// transaction changed.
func (tm *Committer) wakeProducers() {
	for _, p := range tm.producers {
		p.Wake()
	}
}

// Join puts a record into the open transaction: the last one, unless it is sealed or full. It is
// called on one goroutine, before the record is handed to a producer.
func (tm *Committer) Join(rec *Record) {
	tm.mu.Lock()
	t := tm.txns[len(tm.txns)-1]
	if t.sealed || t.records >= tm.maxRecords {
		t.sealed = len(tm.txns) > 1 || t.sealed // a full waiting one is sealed; the active one is sealed by the committer
		t = &kafkaTxn{gen: t.gen + 1}
		tm.txns = append(tm.txns, t)
	}
	rec.Txn = t.gen
	if t.records == 0 {
		t.started = time.Now()
	}
	t.records++
	t.outstanding++
	due := t.records == 1 || t.records >= tm.maxRecords
	tm.mu.Unlock()
	if due {
		tm.signal()
	}
}

// Leave takes back a record that joined but was never handed over.
func (tm *Committer) Leave(rec *Record) {
	tm.mu.Lock()
	if t := tm.txn(rec.Txn); t != nil {
		t.records--
		t.outstanding--
	}
	tm.mu.Unlock()
	tm.signal()
}

func (tm *Committer) txn(gen uint64) *kafkaTxn {
	if i := gen - tm.txns[0].gen; gen >= tm.txns[0].gen && i < uint64(len(tm.txns)) {
		return tm.txns[i]
	}
	return nil
}

// Written holds a batch the broker took (inside the transaction) until the transaction commits,
// then hands it to done. A producer's Config.Done calls it for an acknowledged batch.
func (tm *Committer) Written(batch []*Record, done func([]*Record)) {
	tm.mu.Lock()
	t := tm.txn(batch[0].Txn)
	if t == nil {
		tm.mu.Unlock()
		return // cannot happen: a transaction commits only once all its records are written
	}
	t.held = append(t.held, heldBatch{batch: batch, done: done})
	t.outstanding -= len(batch)
	for _, rec := range batch {
		if t.last == nil || rec.Seq > t.last.Seq {
			t.last = rec
		}
	}
	t.wrote(TopicPartition{Topic: batch[0].Msg.Topic, Partition: batch[0].Msg.Partition}, Span{batch[0].Offset, batch[len(batch)-1].Offset})
	finished := t.outstanding == 0 && t.sealed
	tm.mu.Unlock()
	if finished {
		tm.signal()
	}
}

// wrote notes that the transaction wrote sp in tp.
func (t *kafkaTxn) wrote(tp TopicPartition, sp Span) {
	if t.spans == nil {
		t.spans = make(map[TopicPartition]Span)
	}
	cur, ok := t.spans[tp]
	switch {
	case !ok:
		t.spans[tp] = sp
	case !cur.Known() || !sp.Known():
		t.spans[tp] = Span{-1, -1}
	default:
		t.spans[tp] = Span{min(cur.First, sp.First), max(cur.Last, sp.Last)}
	}
}

// Fail ends the transaction in progress for err (from a produce or AddPartitionsToTxn): the
// committer aborts it and stops.
func (tm *Committer) Fail(err error) {
	tm.mu.Lock()
	if tm.failErr == nil {
		tm.failErr = err
	}
	tm.mu.Unlock()
	tm.signal()
}

func (tm *Committer) failure() error {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.failErr
}
