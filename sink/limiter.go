package sink

import (
	"context"
	"errors"
	"sync"
)

var errStopped = errors.New("sink: stopped")

// limiter caps the events and bytes handed to Kafka and not yet settled. It admits one waiter at a
// time (the pipeline goroutine), which is why a single-slot wake channel is enough.
type limiter struct {
	maxEvents, maxBytes int64

	mu     sync.Mutex
	events int64
	bytes  int64
	wake   chan struct{}
}

func newLimiter(maxEvents, maxBytes int64) *limiter {
	return &limiter{maxEvents: maxEvents, maxBytes: maxBytes, wake: make(chan struct{}, 1)}
}

// tryAcquire takes one event of size bytes if it fits now, without waiting.
func (l *limiter) tryAcquire(size int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == 0 || (l.events < l.maxEvents && l.bytes+size <= l.maxBytes) {
		l.events++
		l.bytes += size
		return true
	}
	return false
}

// acquire blocks until one event of size bytes fits. An event larger than the byte cap is admitted
// alone, so a single big event cannot wedge the relay. It gives up when ctx ends or stop closes.
func (l *limiter) acquire(ctx context.Context, stop <-chan struct{}, size int64) error {
	for {
		l.mu.Lock()
		if l.events == 0 || (l.events < l.maxEvents && l.bytes+size <= l.maxBytes) {
			l.events++
			l.bytes += size
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return errStopped
		}
	}
}

func (l *limiter) release(events, bytes int64) {
	l.mu.Lock()
	l.events -= events
	l.bytes -= bytes
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *limiter) inFlight() (events, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events, l.bytes
}
