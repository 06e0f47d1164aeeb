// Package await lets tests wait for facts instead of for time: a condition polled until it holds
// (a row count, a metric, a log line, a hook that ran), with a generous deadline that is only
// reached when something is wrong. Where time itself is the subject (a lease, a timeout, a window
// in which something must not happen), Window names the wait so that it reads as such.
package await

import (
	"fmt"
	"testing"
	"time"
)

// Poll is how often a condition is evaluated: often enough not to add latency a test could feel,
// seldom enough not to load a busy machine with the condition's own queries.
const Poll = 50 * time.Millisecond

// True polls cond until it holds and returns how long that took. It fails t (from the test's own
// goroutine) after timeout, naming what it waited for, or when the test's context ends.
func True(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return State(t, timeout, what, func() (bool, string) { return cond(), "" })
}

// State is True for a condition that also describes what it saw, so that a failure says how far
// things got ("3 of 10 events", "slot active for pid 123").
func State(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(Poll)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %s%s", what, timeout, suffix(state))
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatalf("%s: the test ended while waiting%s", what, suffix(state))
		}
	}
}

// NoError polls f until it returns nil, and fails t with the last error after timeout.
func NoError(t testing.TB, timeout time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	return State(t, timeout, what, func() (bool, string) {
		if err := f(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// Window waits d where time is what the test is about: a lease running out, a timeout passing,
// or a window in which something must not happen (then prefer waiting for a later fact that could
// only come after it, such as an event written after the one that must not arrive). why says
// which, and is logged.
func Window(t testing.TB, d time.Duration, why string) {
	t.Helper()
	t.Logf("waiting %s: %s", d, why)
	select {
	case <-time.After(d):
	case <-t.Context().Done():
		t.Fatalf("the test ended during a %s wait: %s", d, why)
	}
}

func suffix(state string) string {
	if state == "" {
		return ""
	}
	return fmt.Sprintf(" (last seen: %s)", state)
}
