package producer

import (
	"context"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
)

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
