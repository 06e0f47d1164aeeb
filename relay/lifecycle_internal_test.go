package relay

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// ended reports whether ctx has ended, waiting up to a second for it (the lifecycle's
// AfterFuncs run on their own goroutines).
func ended(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	case <-time.After(time.Second):
		return false
	}
}

// open reports whether ctx is still running.
func open(ctx context.Context) bool { return ctx.Err() == nil }

// TestTheLifecycleEndsEachStateForItsOwnCauses: stop, hard stop and abandon each end for their
// own causes, one-way, and the stronger ends the weaker (hard ends stop and abandon; neither
// ends hard).
func TestTheLifecycleEndsEachStateForItsOwnCauses(t *testing.T) {
	const long = time.Hour // a shutdown timeout that never fires during the test
	for _, tc := range []struct {
		name string
		// act drives the lifecycle after begin; cancel is the caller's context's.
		act       func(l *lifecycle, cancel context.CancelFunc)
		stop      bool
		hard      bool
		abandon   bool
		hardCause error
		fenced    bool
		onStop    int32
	}{
		{"nothing happens: every state is open", func(*lifecycle, context.CancelFunc) {}, false, false, false, nil, false, 0},
		{"the caller's stop ends stop alone and calls onStop once", func(_ *lifecycle, cancel context.CancelFunc) { cancel(); cancel() }, true, false, false, nil, false, 1},
		{"a fence ends every state with ErrFenced and is remembered", func(l *lifecycle, _ context.CancelFunc) { l.fence() }, true, true, true, ErrFenced, true, 0},
		{"a hard stop for another cause is no fence", func(l *lifecycle, _ context.CancelFunc) { l.hardStop(ErrRestart) }, true, true, true, ErrRestart, false, 0},
		{"giving up on Kafka ends abandon alone", func(l *lifecycle, _ context.CancelFunc) { l.giveUp(errHalted) }, false, false, true, nil, false, 0},
		{"a fence after another hard stop still counts as a fence", func(l *lifecycle, _ context.CancelFunc) { l.hardStop(ErrRestart); l.fence() }, true, true, true, ErrRestart, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLifecycle()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stops atomic.Int32
			first := make(chan struct{})
			end := l.begin(ctx, long, func() {
				if stops.Add(1) == 1 {
					close(first)
				}
			})
			defer end()
			tc.act(l, cancel)
			for _, s := range []struct {
				what string
				ctx  context.Context
				want bool
			}{{"stop", l.stop, tc.stop}, {"hard", l.hard, tc.hard}, {"abandon", l.abandon, tc.abandon}} {
				if s.want && !ended(s.ctx) {
					t.Errorf("%s is still open", s.what)
				}
				if !s.want && !open(s.ctx) {
					t.Errorf("%s ended (%v)", s.what, context.Cause(s.ctx))
				}
			}
			if tc.hardCause != nil && !errors.Is(context.Cause(l.hard), tc.hardCause) {
				t.Errorf("hard ended with %v, want %v", context.Cause(l.hard), tc.hardCause)
			}
			if got := l.isFenced(); got != tc.fenced {
				t.Errorf("isFenced() = %v, want %v", got, tc.fenced)
			}
			if tc.onStop > 0 {
				select {
				case <-first:
				case <-time.After(time.Second):
				}
			}
			if got := stops.Load(); got != tc.onStop {
				t.Errorf("onStop ran %d times, want %d", got, tc.onStop)
			}
		})
	}
}

// TestAFenceBeforeRunIsNotLost: a fence that comes between New and Run (a term lost while the
// relay was built) ends the run's stop as soon as Run ties the lifecycle to its context.
func TestAFenceBeforeRunIsNotLost(t *testing.T) {
	l := newLifecycle()
	l.fence()
	end := l.begin(context.Background(), time.Hour, func() {})
	defer end()
	if !ended(l.stop) {
		t.Fatal("the stop of a lifecycle fenced before begin is still open")
	}
	if !errors.Is(context.Cause(l.hard), ErrFenced) {
		t.Fatalf("hard ended with %v, want ErrFenced", context.Cause(l.hard))
	}
}

// TestTheShutdownTimeoutFollowsTheStop: the hard stop comes the shutdown timeout after the
// caller's stop, never without one, and timedOut says so.
func TestTheShutdownTimeoutFollowsTheStop(t *testing.T) {
	const timeout = 50 * time.Millisecond
	l := newLifecycle()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	end := l.begin(ctx, timeout, func() {})
	defer end()
	select {
	case <-l.hard.Done(): // time is the subject: four timeouts without a stop
		t.Fatal("the hard stop came without a stop")
	case <-time.After(4 * timeout):
	}
	stopped := time.Now()
	cancel()
	if !ended(l.hard) {
		t.Fatalf("no hard stop within a second of the stop (shutdown timeout %s)", timeout)
	}
	if took := time.Since(stopped); took < timeout {
		t.Errorf("the hard stop came %s after the stop, before the shutdown timeout %s", took, timeout)
	}
	if !l.timedOut() {
		t.Errorf("timedOut() = false after the shutdown timeout (hard ended with %v)", context.Cause(l.hard))
	}
}

// TestEndingTheLifecycleLetsEveryWaiterGo: end ends every state, so that nothing waiting on one
// outlives the run; a stop that never came starts no shutdown timeout.
func TestEndingTheLifecycleLetsEveryWaiterGo(t *testing.T) {
	l := newLifecycle()
	end := l.begin(context.Background(), time.Hour, func() { t.Error("onStop ran without a stop") })
	end()
	for what, ctx := range map[string]context.Context{"stop": l.stop, "hard": l.hard, "abandon": l.abandon} {
		if !ended(ctx) {
			t.Errorf("%s is still open after end", what)
		}
	}
	if l.timedOut() || l.isFenced() {
		t.Errorf("after end: timedOut %v, isFenced %v; want neither", l.timedOut(), l.isFenced())
	}
}
