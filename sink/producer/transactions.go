package producer

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
// Partitions join a transaction with AddPartitionsToTxn before their first batch of it: kafka-go
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
		client: cfg.Client, id: cfg.ID, timeout: cfg.Timeout, maxRecords: max(1, cfg.MaxRecords), linger: cfg.Linger,
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

// Run commits the transactions one after the other; it returns when ctx ends (then it aborts the
// transaction in progress), on a failure, or on a halt.
func (tm *Committer) Run(ctx context.Context) {
	defer close(tm.done)
	for {
		t, ok := tm.cut(ctx)
		if !ok {
			return
		}
		if !tm.drain(ctx, t) {
			return
		}
		if err := tm.commit(ctx, t); err != nil {
			if ctx.Err() != nil {
				// Given up (Close, or the owner abandoned): not a failed transaction to
				// report, only an open one to abort.
				tm.abort()
				return
			}
			tm.stop(ctx, err)
			return
		}
	}
}

// cut waits until the open transaction is due and seals it. It returns false when the committer
// stops first.
func (tm *Committer) cut(ctx context.Context) (*kafkaTxn, bool) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if tm.stopping(ctx) {
			return nil, false
		}
		tm.mu.Lock()
		t := tm.txns[0]
		wait := time.Hour
		if t.records > 0 || len(tm.txns) > 1 {
			// The committer is free: the transaction ends once its first record is linger old
			// (under load, commits go back to back, each taking what arrived during the one
			// before), and at the latest after Interval.
			age := time.Since(t.started)
			wait = tm.linger - age
			if wait <= 0 || t.sealed || t.records >= tm.maxRecords || len(tm.txns) > 1 || tm.closing || tm.halted() {
				t.sealed = true
				tm.sealed.Store(t.gen)
				tm.mu.Unlock()
				tm.wakeProducers() // a partition lingering with records of t sends them now
				return t, true
			}
		}
		tm.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-tm.wake:
		case <-timer.C:
		case <-ctx.Done():
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// drain waits until every record of t is written. It returns false when the committer stops first.
func (tm *Committer) drain(ctx context.Context, t *kafkaTxn) bool {
	for {
		if tm.stopping(ctx) {
			return false
		}
		tm.mu.Lock()
		n := t.outstanding
		tm.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-tm.wake:
		case <-ctx.Done():
		}
	}
}

// stopping reports whether the committer must stop, and stops if so: a failure (the transaction is
// aborted), a halt on a record of the current transaction (aborted too: it cannot commit without
// the halted record, and what follows it must not be visible), or the end of ctx.
func (tm *Committer) stopping(ctx context.Context) bool {
	if err := tm.failure(); err != nil {
		tm.stop(ctx, err)
		return true
	}
	if halted, ok := tm.owner.Halted(); ok {
		tm.mu.Lock()
		gen := tm.txns[0].gen
		tm.mu.Unlock()
		if halted <= gen {
			tm.log.Error("halted: aborting the Kafka transaction that holds the halted record; every transaction before it is committed",
				zap.String("transactional_id", tm.id))
			tm.abort()
			return true
		}
	}
	if ctx.Err() != nil {
		tm.abort()
		return true
	}
	return false
}

// commit has the owner write what goes with t, commits t, waits for its markers, then hands its
// batches back and opens the next transaction.
func (tm *Committer) commit(ctx context.Context, t *kafkaTxn) error {
	tm.mu.Lock()
	last := t.last
	written := maps.Clone(t.spans)
	tm.mu.Unlock()
	if last == nil {
		// Every record left (never handed over): nothing to commit.
		tm.open(t)
		return nil
	}
	companion, offset, err := tm.owner.BeforeCommit(ctx, last, written)
	if err != nil {
		return err
	}
	if err := tm.endTxn(ctx, true); err != nil {
		return err
	}
	tm.mu.Lock()
	if companion.Topic != "" {
		t.wrote(companion, Span{offset, offset})
	}
	spans := maps.Clone(t.spans)
	clear(tm.added) // committed: nothing is open to abort
	tm.mu.Unlock()
	tm.owner.Count("committed")
	// EndTxn's answer is not the commit: a partition without a leader then loses its marker.
	repaired, err := tm.landed(ctx, spans, true, companion)
	if err == nil && repaired {
		err = tm.readable(ctx, spans)
	}
	if err != nil {
		return err
	}
	for _, h := range t.held {
		h.done(h.batch)
	}
	tm.owner.Committed(last)
	tm.open(t)
	return nil
}

// open makes the transaction after t the active one and wakes the partitions waiting for it.
func (tm *Committer) open(t *kafkaTxn) {
	tm.mu.Lock()
	t.held, t.last = nil, nil // acknowledged: let the records go
	if len(tm.txns) > 1 {
		tm.txns[0] = nil
		tm.txns = tm.txns[1:]
	} else {
		tm.txns = []*kafkaTxn{{gen: t.gen + 1}}
	}
	clear(tm.added)
	clear(tm.refused)
	tm.active.Store(tm.txns[0].gen)
	tm.mu.Unlock()
	tm.wakeProducers()
	tm.signal()
}

// Flush seals and commits every record joined so far. It returns when nothing is left uncommitted,
// the committer stopped (ErrStopped), or ctx ends. Under a ctx that has already ended it seals
// nothing: a caller that gave up (a fenced relay) must not have the open transaction committed
// behind its back.
func (tm *Committer) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tm.mu.Lock()
	tm.closing = true
	tm.mu.Unlock()
	tm.signal()
	for {
		tm.mu.Lock()
		empty := tm.txns[0].records == 0 && len(tm.txns) == 1
		tm.mu.Unlock()
		if empty {
			return nil
		}
		select {
		case <-tm.done:
			return ErrStopped
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// stop ends the committer for good after the transaction failed with err.
func (tm *Committer) stop(ctx context.Context, err error) {
	if ProducerRefused(err) {
		fenced, cerr := tm.fenced(ctx)
		if fenced {
			tm.end()
			tm.owner.Count("fenced")
			tm.owner.Stopped(err, true)
			return
		}
		if cerr != nil {
			err = fmt.Errorf("%w (checking for a newer producer: %v)", err, cerr)
		}
		// The coordinator aborted the transaction itself (it timed out).
		if tm.end() {
			tm.owner.Count("aborted")
		}
	} else {
		tm.abort()
	}
	tm.owner.Stopped(err, false)
}

// fenced asks the coordinator whether another producer took the transactional id: InitProducerID
// with the current producer id and epoch is refused then (KIP-360), and otherwise bumps the epoch,
// which aborts what the coordinator may still hold open of ours.
func (tm *Committer) fenced(ctx context.Context) (bool, error) {
	ps, err := tm.ident.Get(ctx)
	if err != nil {
		return false, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _, err = tm.ident.InitProducerID(cctx, ps.ID, ps.Epoch)
	if ProducerRefused(err) {
		return true, nil
	}
	return false, err
}

// end stops adding partitions, so nothing more is written in a transaction, and waits for an
// AddPartitionsToTxn in flight. It reports whether the transaction in progress holds partitions
// and had not ended before. Only the committer calls it.
//
// The wait is bounded by one request (Config.WriteTimeout) and one backoff (2s at most): an
// AddPartitionsToTxn retries what heals (a coordinator moving or loading) for as long as its
// context lasts, which is the committer's, but it sees ended before each retry and gives up.
func (tm *Committer) end() (began bool) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if tm.ended {
		return false
	}
	tm.ended = true
	for tm.addBusy {
		done := tm.addDone
		tm.mu.Unlock()
		<-done
		tm.mu.Lock()
	}
	return len(tm.added) > 0 || tm.txns[0].records > 0
}

// abort ends the transaction in progress for good: no partition is added to it any more, and
// EndTxn(abort) ends it at once, so that read_committed consumers are not held up by it until the
// transaction timeout. Best effort: a producer that takes over the transactional id aborts it too.
func (tm *Committer) abort() {
	if !tm.end() {
		return
	}
	tm.owner.Count("aborted")
	tm.mu.Lock()
	added := len(tm.added) > 0
	tm.mu.Unlock()
	if !added {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), AbortGrace)
	defer cancel()
	if err := tm.endTxn(ctx, false); err != nil {
		tm.log.Warn("could not abort the kafka transaction; the coordinator aborts it after its timeout, or the next relay with this transactional id at once",
			zap.String("transactional_id", tm.id), zap.Error(err))
		return
	}
	// An abort marker lost at a partition without a leader leaves the records open, and this
	// producer's next transaction there would commit them with its own: duplicates.
	tm.mu.Lock()
	spans := make(map[TopicPartition]Span, len(tm.added))
	for tp := range tm.added {
		// Only where the broker said it wrote (a record whose answer was lost may be there too).
		if sp, ok := tm.txns[0].spans[tp]; ok && sp.Known() {
			spans[tp] = sp
		}
	}
	tm.mu.Unlock()
	companion, _ := tm.owner.Companion()
	if _, err := tm.landed(ctx, spans, false, companion); err != nil {
		tm.log.Warn("the abort marker of the kafka transaction may not have reached every partition (a partition without a leader); this producer's next transaction there would commit the records left open (duplicates)",
			zap.String("transactional_id", tm.id), zap.Error(err))
	}
}

// endTxn commits or aborts the transaction, retrying what heals. A commit retried after its
// answer was lost is answered with success by the coordinator.
func (tm *Committer) endTxn(ctx context.Context, commit bool) error {
	ps, err := tm.ident.Get(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, tm.timeout)
		err := tm.coord.EndTxn(rctx, ps, commit)
		cancel()
		if err == nil {
			return nil
		}
		if !RetriableCoordinatorError(err) {
			return fmt.Errorf("end transaction: %w", err)
		}
		if err := Wait(ctx, attempt, tm.log, "retrying the end of the kafka transaction", err); err != nil {
			return err
		}
	}
}

// Add makes sure tp is part of the current transaction before a batch goes to it. Partitions that
// ask while an AddPartitionsToTxn is in flight go together in the next one.
func (tm *Committer) Add(ctx context.Context, tp TopicPartition) error {
	tm.mu.Lock()
	if tm.ended {
		tm.mu.Unlock()
		return ErrStopped
	}
	for !tm.added[tp] {
		if err := tm.refused[tp]; err != nil {
			tm.mu.Unlock()
			return err
		}
		if tm.failErr != nil {
			tm.mu.Unlock()
			return tm.failErr
		}
		if tm.ended {
			tm.mu.Unlock()
			return ErrStopped
		}
		tm.adding[tp] = true
		if tm.addBusy {
			done := tm.addDone
			tm.mu.Unlock()
			select {
			case <-done:
			case <-ctx.Done():
				return ctx.Err()
			}
			tm.mu.Lock()
			continue
		}
		if companion, ok := tm.owner.Companion(); ok && len(tm.added) == 0 {
			// The owner's partition joins with the transaction's first partitions: one
			// AddPartitionsToTxn fewer at the commit.
			tm.adding[companion] = true
		}
		// Every partition holding records of this transaction joins now too: they all send when it
		// is sealed, and would otherwise wait for this AddPartitionsToTxn, then send another.
		for _, p := range tm.producers {
			for _, held := range p.Holding(tm.active.Load()) {
				if !tm.added[held] {
					tm.adding[held] = true
				}
			}
		}
		tm.addBusy, tm.addDone = true, make(chan struct{})
		tps := tm.adding
		tm.adding = make(map[TopicPartition]bool)
		tm.mu.Unlock()
		err := tm.addPartitions(ctx, tps)
		tm.mu.Lock()
		if err == nil {
			for tp := range tps {
				tm.added[tp] = true
			}
		}
		tm.addBusy = false
		close(tm.addDone)
		if err != nil {
			tm.mu.Unlock()
			if ctx.Err() == nil && !errors.Is(err, ErrStopped) {
				tm.Fail(err)
			}
			return err
		}
	}
	tm.mu.Unlock()
	return nil
}

// addPartitions sends AddPartitionsToTxn for tps, retrying what heals. The partitions of a topic
// the producer may not write leave tps for tm.refused (their records are handed back refused), and
// the others are asked for again at once: the broker attempted none of them.
func (tm *Committer) addPartitions(ctx context.Context, tps map[TopicPartition]bool) error {
	ps, err := tm.ident.Get(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			tm.mu.Lock()
			if tm.ended {
				tm.mu.Unlock()
				return ErrStopped // the committer stops and waits for this (end)
			}
			// Partitions that asked meanwhile go along (after a commit, the first attempts meet
			// CONCURRENT_TRANSACTIONS while every partition of the new transaction asks).
			for tp := range tm.adding {
				tps[tp] = true
			}
			clear(tm.adding)
			tm.mu.Unlock()
		}
		if len(tps) == 0 {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, tm.timeout)
		err := tm.coord.AddPartitions(rctx, ps, tps)
		cancel()
		if err == nil {
			return nil
		}
		var refused *TopicsRefusedError
		if errors.As(err, &refused) {
			n := len(tps)
			tm.mu.Lock()
			for tp := range tps {
				if refused.Topics[tp.Topic] {
					delete(tps, tp)
					tm.refused[tp] = RefusedTopic(tp.Topic, kafka.TopicAuthorizationFailed)
				}
			}
			tm.mu.Unlock()
			if len(tps) == n {
				return fmt.Errorf("add partitions to the kafka transaction: %w, none of which it was asked for", err)
			}
			continue // at once: the broker answered, and attempted none of the others
		}
		if !RetriableCoordinatorError(err) {
			return fmt.Errorf("add partitions to the kafka transaction: %w", err)
		}
		if err := Wait(ctx, attempt, tm.log, "retrying adding partitions to the kafka transaction", err); err != nil {
			return err
		}
	}
}
