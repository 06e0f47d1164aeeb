package await_test

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
)

// recorder is a testing.TB whose Fatalf records the failure and ends the goroutine, as t.Fatalf
// does, so that a wait's failure can be seen without failing the test that provoked it.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls wait with a recorder in a goroutine of its own, and returns the failure, if any.
func run(t *testing.T, wait func(testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait(r)
	}()
	<-done
	return r.failed
}

func TestWaits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wait     func(testing.TB)
		failure  string // "" when the wait must succeed
		atLeast  time.Duration
		atMostOk time.Duration
	}{
		{
			name: "a condition that already holds returns at once",
			wait: func(tb testing.TB) {
				await.True(tb, time.Second, "nothing", func() bool { return true })
			},
			atMostOk: 500 * time.Millisecond,
		},
		{
			name: "a condition that comes true is waited for",
			wait: func(tb testing.TB) {
				var n atomic.Int32
				await.True(tb, 5*time.Second, "three polls", func() bool { return n.Add(1) >= 3 })
			},
			atLeast:  2 * await.Poll,
			atMostOk: 3 * time.Second,
		},
		{
			name: "a condition that never holds fails naming what was awaited and what was seen",
			wait: func(tb testing.TB) {
				await.State(tb, 200*time.Millisecond, "the slot to be free", func() (bool, string) { return false, "active for pid 42" })
			},
			failure: "the slot to be free: not within 200ms (last seen: active for pid 42)",
			atLeast: 200 * time.Millisecond,
		},
		{
			name: "an error that persists is reported",
			wait: func(tb testing.TB) {
				await.NoError(tb, 100*time.Millisecond, "a connection", func() error { return errors.New("connection refused") })
			},
			failure: "a connection: not within 100ms (last seen: connection refused)",
		},
		{
			name: "a window lasts its length",
			wait: func(tb testing.TB) {
				await.Window(tb, 150*time.Millisecond, "a lease runs out")
			},
			atLeast:  150 * time.Millisecond,
			atMostOk: 3 * time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			failed := run(t, tc.wait)
			took := time.Since(start)
			if failed != tc.failure {
				t.Fatalf("failure %q, want %q", failed, tc.failure)
			}
			if took < tc.atLeast {
				t.Fatalf("returned after %s, want at least %s", took, tc.atLeast)
			}
			if tc.atMostOk > 0 && took > tc.atMostOk {
				t.Fatalf("returned after %s, want at most %s", took, tc.atMostOk)
			}
		})
	}
}
