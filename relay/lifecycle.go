package relay

import (
	"context"
	"sync/atomic"
	"time"
)

// lifecycle is a relay's one shutdown signal, for its whole life (the model: redpanda-data/connect's
// shutdown.Signaller). It has three one-way states, each a context that ends once and never comes
// back:
//   - stop: finish what is in hand and take nothing new. It ends when the caller's context ends
//     (SIGTERM), and with every hard stop.
//   - hard: give up now, with the cause: a fence (ErrFenced), a sink that failed for good, or the
//     shutdown timeout after the stop (errShutdownTimeout).
//   - abandon: nobody waits for Kafka any more. It ends with hard, or when a stop finds the sink
//     halted (errHalted): the halted event is never acknowledged.
//
// The relay builds it in New, so that a fence that comes before Run is not lost, and ties it to the
// caller's context in Run (begin). The source and its helpers take the context of the phase their
// work belongs to; nobody builds a private tree of contexts to say the same thing.
type lifecycle struct {
	stop     context.Context
	hard     context.Context
	hardStop context.CancelCauseFunc
	abandon  context.Context
	giveUp   context.CancelCauseFunc
	// fenced is set by fence before the hard stop: a fence counts even when another hard stop
	// came first (the sink failed, then the term was lost), so nothing more waits for Kafka.
	fenced atomic.Bool
}

func newLifecycle() *lifecycle {
	hard, hardStop := context.WithCancelCause(context.Background())
	abandon, giveUp := context.WithCancelCause(hard)
	return &lifecycle{hard: hard, hardStop: hardStop, abandon: abandon, giveUp: giveUp}
}

// begin ties the lifecycle to the caller's context, whose end is the stop: then onStop runs (once),
// and timeout later the hard stop follows (errShutdownTimeout) unless one came already. It returns
// what ends the lifecycle: every state ends, so that every goroutine waiting on one lets go.
func (l *lifecycle) begin(ctx context.Context, timeout time.Duration, onStop func()) (end func()) {
	stop, cancelStop := context.WithCancel(ctx)
	l.stop = stop
	unhookHard := context.AfterFunc(l.hard, cancelStop)
	unhookStop := context.AfterFunc(ctx, func() {
		onStop()
		timer := time.AfterFunc(timeout, func() { l.hardStop(errShutdownTimeout) })
		context.AfterFunc(l.hard, func() { timer.Stop() })
	})
	return func() {
		unhookStop()
		unhookHard()
		l.hardStop(nil)
		cancelStop()
	}
}

// fence stops at once (ErrFenced).
func (l *lifecycle) fence() {
	l.fenced.Store(true)
	l.hardStop(ErrFenced)
}

// isFenced reports whether fence was called.
func (l *lifecycle) isFenced() bool { return l.fenced.Load() }

// timedOut reports whether the shutdown timeout ended the stop.
func (l *lifecycle) timedOut() bool { return context.Cause(l.hard) == errShutdownTimeout }
