package sink

import (
	"context"
	"errors"
	"testing"
	"time"
)

// acquireAsync runs acquire on its own goroutine; its result arrives on the channel.
func acquireAsync(ctx context.Context, l *limiter, size int64) <-chan error {
	done := make(chan error, 1)
	go func() { done <- l.acquire(ctx, nil, size) }()
	return done
}

func waitBlocked(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("acquire returned %v, want it to block", err)
	case <-time.After(100 * time.Millisecond):
	}
}

func waitReturned(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("acquire still blocked")
		return nil
	}
}

func TestLimiter(t *testing.T) {
	tests := []struct {
		name      string
		maxEvents int64
		maxBytes  int64
		held      []int64    // acquired first, all must succeed at once
		next      int64      // the size then acquired
		releases  [][2]int64 // {events, bytes} released while next waits; blocked until the last
	}{
		{"admits events below both caps", 3, 1000, []int64{100, 100}, 100, nil},
		{"blocks at the event cap", 2, 1000, []int64{10, 10}, 10, [][2]int64{{1, 10}}},
		{"blocks at the byte cap", 10, 1000, []int64{600, 300}, 101, [][2]int64{{1, 600}}},
		{"admits an event that exactly fills the byte cap", 10, 1000, []int64{600, 300}, 100, nil},
		{"admits a single oversize event when empty", 10, 1000, nil, 5000, nil},
		{"blocks an oversize event while anything is in flight", 10, 1000, []int64{1}, 5000, [][2]int64{{1, 1}}},
		{"blocks behind an oversize event in flight", 10, 1000, []int64{5000}, 1, [][2]int64{{1, 5000}}},
		{"a release that still leaves no room keeps it blocked until the next one", 3, 100, []int64{60, 30}, 50,
			[][2]int64{{1, 30}, {1, 60}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLimiter(tt.maxEvents, tt.maxBytes)
			ctx := context.Background()
			var total int64
			for _, n := range tt.held {
				if err := l.acquire(ctx, nil, n); err != nil {
					t.Fatal(err)
				}
				total += n
			}
			if e, b := l.inFlight(); e != int64(len(tt.held)) || b != total {
				t.Fatalf("inFlight = %d, %d; want %d, %d", e, b, len(tt.held), total)
			}
			done := acquireAsync(ctx, l, tt.next)
			for _, r := range tt.releases {
				waitBlocked(t, done)
				l.release(r[0], r[1])
			}
			if err := waitReturned(t, done); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLimiterCancelUnblocksTheWaiter(t *testing.T) {
	l := newLimiter(1, 100)
	if err := l.acquire(context.Background(), nil, 10); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := acquireAsync(ctx, l, 10)
	waitBlocked(t, done)
	cancel()
	if err := waitReturned(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire = %v, want context.Canceled", err)
	}
	if e, b := l.inFlight(); e != 1 || b != 10 {
		t.Fatalf("a cancelled acquire took capacity: inFlight = %d, %d", e, b)
	}
}

func TestLimiterReleaseWakesTheWaiterEveryTime(t *testing.T) {
	// One waiter at a time, many rounds: a release racing with the waiter's check must never be lost.
	l := newLimiter(1, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := l.acquire(ctx, nil, 1); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		for i := 0; i < 2000; i++ {
			// release a slot as soon as the waiter has taken the previous one
			for {
				if e, _ := l.inFlight(); e == 1 {
					break
				}
				time.Sleep(time.Microsecond)
			}
			l.release(1, 1)
		}
	}()
	for i := 0; i < 2000; i++ {
		if err := l.acquire(ctx, nil, 1); err != nil {
			t.Fatalf("round %d: %v (a wake-up was lost)", i, err)
		}
	}
	<-released
	if e, b := l.inFlight(); e != 1 || b != 1 {
		t.Fatalf("inFlight = %d, %d; want 1, 1", e, b)
	}
}

// TestTryAcquireTakesWhatAcquireWouldWithoutWaiting: the window's fast path (no wait, so the
// record's linger starts at the clock reading taken before it) admits exactly what acquire admits
// at once, and takes nothing when acquire would wait.
func TestTryAcquireTakesWhatAcquireWouldWithoutWaiting(t *testing.T) {
	tests := []struct {
		name           string
		events, bytes  int64 // held already
		size           int64
		want           bool
		wantHeldEvents int64
	}{
		{"room for it: taken", 1, 10, 10, true, 2},
		{"an event larger than the byte cap is admitted alone", 0, 0, 500, true, 1},
		{"the event cap is reached: not taken", 3, 30, 1, false, 3},
		{"the byte cap would be passed: not taken", 1, 90, 20, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLimiter(3, 100)
			l.events, l.bytes = tt.events, tt.bytes
			if got := l.tryAcquire(tt.size); got != tt.want {
				t.Fatalf("tryAcquire = %v, want %v", got, tt.want)
			}
			if events, _ := l.inFlight(); events != tt.wantHeldEvents {
				t.Fatalf("%d events held, want %d", events, tt.wantHeldEvents)
			}
		})
	}
}
