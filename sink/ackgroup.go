package sink

import (
	"context"
	"sync"
)

// AckGroup is an Acker for publishers that wait for a known set of events (the backfill, a
// replay): Add before each Publish, then Wait until every one is settled.
type AckGroup struct{ wg sync.WaitGroup }

// Add counts one more event to wait for.
func (a *AckGroup) Add() { a.wg.Add(1) }

// Ack implements Acker.
func (a *AckGroup) Ack(n int) {
	for range n {
		a.wg.Done()
	}
}

// Wait returns once every added event is settled, or ctx's error when ctx ends first.
func (a *AckGroup) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		a.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
