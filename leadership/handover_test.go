package leadership

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeProgress is a sink as the Kafka watch sees it.
type fakeProgress struct {
	mu       sync.Mutex
	events   int64
	answer   time.Time
	starting bool
	halted   bool
}

func (f *fakeProgress) InFlight() (int64, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.events, 0
}
func (f *fakeProgress) LastAnswer() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.answer }
func (f *fakeProgress) Starting() bool        { f.mu.Lock(); defer f.mu.Unlock(); return f.starting }
func (f *fakeProgress) Halted() (string, string, error, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return "", "", nil, f.halted
}

// TestTheKafkaWatchReportsOnlyASilenceWhileEventsWait: the watch behind leader_kafka_timeout fires
// when events (or the start) wait for Kafka without an answer for the limit, and never for an idle
// relay, a halted one, or one whose Kafka keeps answering.
func TestTheKafkaWatchReportsOnlyASilenceWhileEventsWait(t *testing.T) {
	const limit = 500 * time.Millisecond
	for _, tc := range []struct {
		name  string
		state *fakeProgress
		keep  func(*fakeProgress) // runs every 50ms
		alone bool                // no standby ready to take over waits
		fires bool
	}{
		{"events in flight, no answer", &fakeProgress{events: 3}, nil, false, true},
		{"the start waits for the brokers", &fakeProgress{starting: true}, nil, false, true},
		{"events in flight, no answer, no standby ready", &fakeProgress{events: 3}, nil, true, false},
		{"idle: nothing waits", &fakeProgress{}, nil, false, false},
		{"halted by the failure policy", &fakeProgress{events: 3, halted: true}, nil, false, false},
		{"events in flight, Kafka answering", &fakeProgress{events: 3}, func(f *fakeProgress) { f.answer = time.Now() }, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := tc.state
			silent := watchKafka(ctx, f, limit, func() bool { return !tc.alone })
			deadline := time.After(4 * limit)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case d := <-silent:
					if !tc.fires {
						t.Fatalf("the watch fired (silent %s)", d)
					}
					if d < limit {
						t.Fatalf("the watch fired after %s of silence, before the limit %s", d, limit)
					}
					return
				case <-deadline:
					if tc.fires {
						t.Fatalf("the watch did not fire within %s", 4*limit)
					}
					return
				case <-tick.C:
					if tc.keep != nil {
						f.mu.Lock()
						tc.keep(f)
						f.mu.Unlock()
					}
				}
			}
		})
	}
}

func TestAHandoverPauseDoublesUpToTenMinutes(t *testing.T) {
	if got := handoverBase(2 * time.Second); got != 9*time.Second {
		t.Errorf("handoverBase(2s) = %s, want 9s (two standby attempts and their Kafka check)", got)
	}
	for n, want := range map[int]time.Duration{1: time.Minute, 2: 2 * time.Minute, 4: 8 * time.Minute, 5: 10 * time.Minute, 60: 10 * time.Minute} {
		if got := handoverPause(time.Minute, n); got != want {
			t.Errorf("handoverPause(1m, %d) = %s, want %s", n, got, want)
		}
	}
}
