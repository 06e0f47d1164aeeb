package producer

import (
	"context"
	"fmt"
	"maps"
	"time"

	"go.uber.org/zap"
)

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
