package sink

import (
	"cmp"
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

// Exactly-once delivery: the published stream is cut into Kafka transactions, each a prefix of
// what is left, in publish (WAL) order. A record joins the transaction that is open when it is
// published (its generation, record.txn). The committer seals the open transaction as soon as it
// is free and the transaction's first record is kafka.linger old (so under load commits go back to
// back, each taking what arrived while the one before committed), and at the latest after
// Interval; a transaction also closes once it holds MaxEvents records (the next record then opens
// the next one, which waits behind it). The committer, one transaction after the other,
//
//  1. waits until every record of it is written (or dead-lettered, inside the same transaction),
//     while the records published meanwhile wait in their partitions' queues for the next one;
//  2. writes the position of its last record to the positions topic, inside the transaction;
//  3. commits it (EndTxn), and only then acknowledges its records: the slot is confirmed only past
//     what a read_committed consumer can see.
//
// Partitions join a transaction with AddPartitionsToTxn before their first batch of it: kafka-go
// speaks Produce up to v8, so the broker's implicit adding (KIP-890 transactions v2, Produce v12)
// is not available.
//
// Anything that ends a transaction other than its commit stops the sink for good, without
// acknowledging any record of it: the relay restarts from the last committed position (the records
// are replayed from PostgreSQL). That is simpler than resending an aborted transaction's records
// from memory, and a failed transaction is rare (the coordinator timed it out, the broker lost the
// producer's state, another producer took over). A halt aborts the transaction holding the halted
// record and commits none after it: what is committed is every transaction before it.

// txnManager runs the Kafka transactions of one sink.
type txnManager struct {
	s         *Sink
	client    *kafka.Client
	id        string
	cfg       Transactions
	maxEvents int
	linger    time.Duration // how old a transaction's first record gets before the committer takes it
	ident     *identity
	coord     *coordinator
	log       *zap.Logger
	// stableWait bounds how long ReadPosition waits for other producers' open transactions in the
	// positions partition (readPosition); set from cfg.Timeout.
	stableWait time.Duration

	// active is the generation partitions may send; records of a later one wait.
	active atomic.Uint64
	// sealed is the latest generation the committer has sealed: its records go at once, without
	// lingering, since the commit waits for them.
	sealed atomic.Uint64
	// settled says the first ReadPosition settled what earlier producers left (markers.go).
	settled atomic.Bool

	mu sync.Mutex
	// txns are the transactions not yet committed, oldest first: txns[0] is the active one (open,
	// or sealed and committing), the last one is where new records go; generations are
	// consecutive.
	txns   []*kafkaTxn
	queues []*partitionQueue
	added  map[topicPartition]bool // partitions added to txns[0]
	adding map[topicPartition]bool // partitions waiting for the AddPartitionsToTxn in flight or the next one
	// refused are the partitions of txns[0] whose topic the relay may not write (refusedTopic):
	// their records go to the failure policy. The next transaction asks again (an ACL may have
	// been granted meanwhile).
	refused map[topicPartition]error
	addBusy bool
	addDone chan struct{} // closed when the AddPartitionsToTxn in flight ends
	closing bool
	ended   bool  // no transaction is begun any more: the sink stopped, failed or halted
	failErr error // why the transaction failed; the committer acts on it
	last    Position
	lastOK  bool

	wake chan struct{}
	done chan struct{} // closed when the committer has stopped

	positions *positionsWriter
}

// kafkaTxn is one Kafka transaction's records.
type kafkaTxn struct {
	gen         uint64
	started     time.Time // its first record's arrival
	records     int       // records that joined it
	outstanding int       // of those, not yet written or dead-lettered
	held        []heldBatch
	last        *delivery // the written record latest in publish order
	sealed      bool
	// spans is where its records lie in each partition it wrote: its marker must land past them
	// (landed).
	spans map[topicPartition]span
}

type heldBatch struct {
	batch []*delivery
	dead  bool // written to the dead-letter topic
}

func newTxnManager(s *Sink, client *kafka.Client, ident *identity) *txnManager {
	cfg := *s.cfg.Transactions
	tm := &txnManager{
		s: s, client: client, id: cfg.ID, cfg: cfg, ident: ident, log: s.log,
		coord: &coordinator{client: client, id: cfg.ID}, stableWait: stableWait(cfg.Timeout),
		// Two transactions must fit in the in-flight window: one committing, one filling.
		maxEvents: max(1, min(cfg.MaxEvents, s.cfg.MaxInFlight/2)),
		linger:    min(cmp.Or(cfg.Linger, max(0, s.cfg.Linger)), cfg.Interval),
		txns:      []*kafkaTxn{{gen: 1}},
		added:     make(map[topicPartition]bool),
		adding:    make(map[topicPartition]bool),
		refused:   make(map[topicPartition]error),
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	tm.active.Store(1)
	tm.positions = &positionsWriter{tm: tm}
	return tm
}

func (tm *txnManager) signal() {
	select {
	case tm.wake <- struct{}{}:
	default:
	}
}

// register lets a partition queue be woken when the next transaction opens.
func (tm *txnManager) register(q *partitionQueue) {
	tm.mu.Lock()
	tm.queues = append(tm.queues, q)
	tm.mu.Unlock()
}

// join puts a record being published into the open transaction: the last one, unless it is sealed
// or full. Publish calls it, on one goroutine, before handing the record over.
func (tm *txnManager) join(rec *delivery) {
	tm.mu.Lock()
	t := tm.txns[len(tm.txns)-1]
	if t.sealed || t.records >= tm.maxEvents {
		t.sealed = len(tm.txns) > 1 || t.sealed // a full waiting one is sealed; the active one is sealed by the committer
		t = &kafkaTxn{gen: t.gen + 1}
		tm.txns = append(tm.txns, t)
	}
	rec.txn = t.gen
	if t.records == 0 {
		t.started = time.Now()
	}
	t.records++
	t.outstanding++
	due := t.records == 1 || t.records >= tm.maxEvents
	tm.mu.Unlock()
	if due {
		tm.signal()
	}
}

// leave takes back a record that joined but was never handed over (its Publish ended).
func (tm *txnManager) leave(rec *delivery) {
	tm.mu.Lock()
	if t := tm.txn(rec.txn); t != nil {
		t.records--
		t.outstanding--
	}
	tm.mu.Unlock()
	tm.signal()
}

func (tm *txnManager) txn(gen uint64) *kafkaTxn {
	if i := gen - tm.txns[0].gen; gen >= tm.txns[0].gen && i < uint64(len(tm.txns)) {
		return tm.txns[i]
	}
	return nil
}

// written holds a batch the broker took (inside the transaction) until the transaction commits.
func (tm *txnManager) written(batch []*delivery, dead bool) {
	tm.mu.Lock()
	t := tm.txn(batch[0].txn)
	if t == nil {
		tm.mu.Unlock()
		return // cannot happen: a transaction commits only once all its records are written
	}
	t.held = append(t.held, heldBatch{batch: batch, dead: dead})
	t.outstanding -= len(batch)
	for _, rec := range batch {
		if t.last == nil || rec.seq > t.last.seq {
			t.last = rec
		}
	}
	t.wrote(topicPartition{batch[0].msg.Topic, batch[0].msg.Partition}, span{batch[0].offset, batch[len(batch)-1].offset})
	finished := t.outstanding == 0 && t.sealed
	tm.mu.Unlock()
	if finished {
		tm.signal()
	}
}

// wrote notes that the transaction wrote sp in tp.
func (t *kafkaTxn) wrote(tp topicPartition, sp span) {
	if t.spans == nil {
		t.spans = make(map[topicPartition]span)
	}
	cur, ok := t.spans[tp]
	switch {
	case !ok:
		t.spans[tp] = sp
	case !cur.known() || !sp.known():
		t.spans[tp] = span{-1, -1}
	default:
		t.spans[tp] = span{min(cur.first, sp.first), max(cur.last, sp.last)}
	}
}

// fail ends the transaction in progress for err (from a produce or AddPartitionsToTxn): the
// committer aborts it and stops the sink.
func (tm *txnManager) fail(err error) {
	tm.mu.Lock()
	if tm.failErr == nil {
		tm.failErr = err
	}
	tm.mu.Unlock()
	tm.signal()
}

func (tm *txnManager) failure() error {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.failErr
}

// Committed returns the position of the last Kafka transaction this sink committed.
func (tm *txnManager) committed() (Position, bool) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.last, tm.lastOK
}

// run is the committer; it returns when the sink stops (Close, a failure, a halt).
func (tm *txnManager) run() {
	defer close(tm.done)
	ctx := tm.s.ctx
	for {
		t, ok := tm.cut(ctx)
		if !ok {
			return
		}
		if !tm.drain(ctx, t) {
			return
		}
		if err := tm.commit(ctx, t); err != nil {
			tm.stop(ctx, err)
			return
		}
	}
}

// cut waits until the open transaction is due and seals it. It returns false when the sink
// stops first (and then stops it).
func (tm *txnManager) cut(ctx context.Context) (*kafkaTxn, bool) {
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
			if wait <= 0 || t.sealed || t.records >= tm.maxEvents || len(tm.txns) > 1 || tm.closing || tm.s.halted.Load() != nil {
				t.sealed = true
				tm.sealed.Store(t.gen)
				queues := tm.queues
				tm.mu.Unlock()
				for _, q := range queues {
					q.signal() // a partition lingering with records of t sends them now
				}
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

// drain waits until every record of t is written. It returns false when the sink stops first.
func (tm *txnManager) drain(ctx context.Context, t *kafkaTxn) bool {
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

// stopping reports whether the committer must stop, and stops the sink if so: a failure (the
// transaction is aborted), a halt on a record of the current transaction (aborted too: it cannot
// commit without the halted record, and what follows it must not be visible), or the end of the
// sink's context.
func (tm *txnManager) stopping(ctx context.Context) bool {
	if err := tm.failure(); err != nil {
		tm.stop(ctx, err)
		return true
	}
	if h := tm.s.halted.Load(); h != nil {
		tm.mu.Lock()
		gen := tm.txns[0].gen
		tm.mu.Unlock()
		if h.txn <= gen {
			tm.log.Error("halted: aborting the Kafka transaction that holds the halted event; every transaction before it is committed",
				zap.String("event_id", h.EventID))
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

// commit writes t's position and commits t, then acknowledges its records and opens the next
// transaction.
func (tm *txnManager) commit(ctx context.Context, t *kafkaTxn) error {
	tm.mu.Lock()
	last := t.last
	written := maps.Clone(t.spans)
	tm.mu.Unlock()
	if last == nil {
		// Every record left (their Publish ended before they were handed over): nothing to commit.
		tm.open(t, Position{}, false)
		return nil
	}
	pos := Position{CommitLSN: last.ev.Tx.CommitLSN, Events: last.ev.Index + 1, SystemID: last.ev.Tx.SystemID, Timeline: last.ev.Tx.Timeline}
	offset, err := tm.positions.write(ctx, pos, written)
	if err != nil {
		return err
	}
	if err := tm.endTxn(ctx, true); err != nil {
		return err
	}
	tm.mu.Lock()
	t.wrote(tm.positions.tp, span{offset, offset})
	spans := maps.Clone(t.spans)
	clear(tm.added) // committed: nothing is open to abort
	tm.mu.Unlock()
	tm.s.m.KafkaTransactions.WithLabelValues("committed").Inc()
	// EndTxn's answer is not the commit: a partition without a leader then loses its marker.
	repaired, err := tm.landed(ctx, spans, true, tm.positions.tp)
	if err == nil && repaired {
		err = tm.readable(ctx, spans)
	}
	if err != nil {
		return err
	}
	for _, h := range t.held {
		if h.dead {
			tm.s.deadLettered(h.batch, nil)
		} else {
			tm.s.completed(h.batch, nil)
		}
	}
	tm.open(t, pos, true)
	return nil
}

// open makes the transaction after t the active one and wakes the partitions waiting for it.
func (tm *txnManager) open(t *kafkaTxn, pos Position, committed bool) {
	tm.mu.Lock()
	if committed {
		tm.last, tm.lastOK = pos, true
	}
	t.held, t.last = nil, nil // acknowledged: let the records go
	if len(tm.txns) > 1 {
		tm.txns[0] = nil
		tm.txns = tm.txns[1:]
	} else {
		tm.txns = []*kafkaTxn{{gen: t.gen + 1}}
	}
	clear(tm.added)
	clear(tm.refused)
	queues := tm.queues
	tm.active.Store(tm.txns[0].gen)
	tm.mu.Unlock()
	for _, q := range queues {
		q.signal()
	}
	tm.signal()
}

// flush seals and commits everything published so far; Close calls it. It returns when nothing
// is left uncommitted, the sink stopped, or ctx ends.
func (tm *txnManager) flush(ctx context.Context) error {
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
			return tm.s.Err()
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// stop ends the sink for good after the transaction failed with err.
func (tm *txnManager) stop(ctx context.Context, err error) {
	if errors.Is(err, errPositionsRefused) {
		// Not ErrAborted: a fresh start would abort again, for ever. An operator fixes this.
		tm.abort()
		tm.s.fatal(fmt.Errorf("sink: transactional id %q: %w", tm.id, err))
		tm.log.Error("kafka transaction aborted: the relay may not write its positions topic; stopping",
			zap.String("transactional_id", tm.id), zap.Error(err))
		tm.s.stop()
		return
	}
	if producerRefused(err) {
		fenced, cerr := tm.fenced(ctx)
		if fenced {
			tm.end()
			tm.s.m.KafkaTransactions.WithLabelValues("fenced").Inc()
			tm.s.fatal(fmt.Errorf("sink: transactional id %q: %w (%v)", tm.id, ErrFenced, err))
			tm.log.Error("fenced: another relay with the same transactional id took over; this one stops and writes nothing more",
				zap.String("transactional_id", tm.id), zap.Error(err))
			tm.s.stop()
			return
		}
		if cerr != nil {
			err = fmt.Errorf("%w (checking for a newer producer: %v)", err, cerr)
		}
		// The coordinator aborted the transaction itself (it timed out).
		if tm.end() {
			tm.s.m.KafkaTransactions.WithLabelValues("aborted").Inc()
		}
	} else {
		tm.abort()
	}
	tm.s.fatal(fmt.Errorf("sink: transactional id %q: %w: %v; nothing of it was acknowledged, so it is replayed from the last committed position", tm.id, ErrAborted, err))
	tm.log.Error("kafka transaction aborted; stopping the sink so the relay replays from the last committed position",
		zap.String("transactional_id", tm.id), zap.Error(err))
	tm.s.stop()
}

// fenced asks the coordinator whether another producer took the transactional id: InitProducerID
// with the current producer id and epoch is refused then (KIP-360), and otherwise bumps the epoch,
// which aborts what the coordinator may still hold open of ours.
func (tm *txnManager) fenced(ctx context.Context) (bool, error) {
	ps, err := tm.ident.get(ctx)
	if err != nil {
		return false, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _, err = tm.ident.initProducerID(cctx, ps.id, ps.epoch)
	if producerRefused(err) {
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
// context lasts, which is the sink's, but it sees ended before each retry and gives up.
func (tm *txnManager) end() (began bool) {
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
func (tm *txnManager) abort() {
	if !tm.end() {
		return
	}
	tm.s.m.KafkaTransactions.WithLabelValues("aborted").Inc()
	tm.mu.Lock()
	added := len(tm.added) > 0
	tm.mu.Unlock()
	if !added {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), abortGrace)
	defer cancel()
	if err := tm.endTxn(ctx, false); err != nil {
		tm.log.Warn("could not abort the kafka transaction; the coordinator aborts it after its timeout, or the next relay with this transactional id at once",
			zap.String("transactional_id", tm.id), zap.Error(err))
		return
	}
	// An abort marker lost at a partition without a leader leaves the records open, and this
	// producer's next transaction there would commit them with its own: duplicates.
	tm.mu.Lock()
	spans := make(map[topicPartition]span, len(tm.added))
	for tp := range tm.added {
		// Only where the broker said it wrote (a record whose answer was lost may be there too).
		if sp, ok := tm.txns[0].spans[tp]; ok && sp.known() {
			spans[tp] = sp
		}
	}
	tm.mu.Unlock()
	if _, err := tm.landed(ctx, spans, false, tm.positions.tp); err != nil {
		tm.log.Warn("the abort marker of the kafka transaction may not have reached every partition (a partition without a leader); this producer's next transaction there would commit the records left open (duplicates)",
			zap.String("transactional_id", tm.id), zap.Error(err))
	}
}

// endTxn commits or aborts the transaction, retrying what heals. A commit retried after its
// answer was lost is answered with success by the coordinator.
func (tm *txnManager) endTxn(ctx context.Context, commit bool) error {
	ps, err := tm.ident.get(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, tm.s.cfg.WriteTimeout)
		err := tm.coord.endTxn(rctx, ps, commit)
		cancel()
		if err == nil {
			return nil
		}
		if !retriableCoordinatorError(err) {
			return fmt.Errorf("end transaction: %w", err)
		}
		if err := wait(ctx, attempt, tm.log, "retrying the end of the kafka transaction", err); err != nil {
			return err
		}
	}
}

// add makes sure tp is part of the current transaction before a batch goes to it. Partitions that
// ask while an AddPartitionsToTxn is in flight go together in the next one.
func (tm *txnManager) add(ctx context.Context, tp topicPartition) error {
	tm.mu.Lock()
	if tm.ended {
		tm.mu.Unlock()
		return errStopped
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
			return errStopped
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
		if len(tm.added) == 0 && tm.positions.ready {
			// The positions partition joins with the transaction's first partitions: one
			// AddPartitionsToTxn fewer at the commit.
			tm.adding[tm.positions.tp] = true
		}
		// Every partition holding records of this transaction joins now too: they all send when it
		// is sealed, and would otherwise wait for this AddPartitionsToTxn, then send another.
		for _, q := range tm.queues {
			if !tm.added[q.tp] && q.holds(tm.active.Load()) {
				tm.adding[q.tp] = true
			}
		}
		tm.addBusy, tm.addDone = true, make(chan struct{})
		tps := tm.adding
		tm.adding = make(map[topicPartition]bool)
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
			if ctx.Err() == nil && !errors.Is(err, errStopped) {
				tm.fail(err)
			}
			return err
		}
	}
	tm.mu.Unlock()
	return nil
}

// addPartitions sends AddPartitionsToTxn for tps, retrying what heals. The partitions of a topic
// the relay may not write leave tps for tm.refused (their records go to the failure policy), and
// the others are asked for again at once: the broker attempted none of them.
func (tm *txnManager) addPartitions(ctx context.Context, tps map[topicPartition]bool) error {
	ps, err := tm.ident.get(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			tm.mu.Lock()
			if tm.ended {
				tm.mu.Unlock()
				return errStopped // the committer stops and waits for this (end)
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
		rctx, cancel := context.WithTimeout(ctx, tm.s.cfg.WriteTimeout)
		err := tm.coord.addPartitions(rctx, ps, tps)
		cancel()
		if err == nil {
			return nil
		}
		var refused *topicsRefusedError
		if errors.As(err, &refused) {
			n := len(tps)
			tm.mu.Lock()
			for tp := range tps {
				if refused.topics[tp.topic] {
					delete(tps, tp)
					tm.refused[tp] = refusedTopic(tp.topic, kafka.TopicAuthorizationFailed)
				}
			}
			tm.mu.Unlock()
			if len(tps) == n {
				return fmt.Errorf("add partitions to the kafka transaction: %w, none of which it was asked for", err)
			}
			continue // at once: the broker answered, and attempted none of the others
		}
		if !retriableCoordinatorError(err) {
			return fmt.Errorf("add partitions to the kafka transaction: %w", err)
		}
		if err := wait(ctx, attempt, tm.log, "retrying adding partitions to the kafka transaction", err); err != nil {
			return err
		}
	}
}
