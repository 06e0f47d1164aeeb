package producer

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestBackoff(t *testing.T) {
	prev := Backoff(0)
	if prev != 200e6 {
		t.Fatalf("Backoff(0) = %v, want 200ms", prev)
	}
	for attempt := 1; attempt < 100; attempt++ {
		d := Backoff(attempt)
		if d < prev || d > 2e9 {
			t.Fatalf("Backoff(%d) = %v after %v: want non-decreasing and at most 2s", attempt, d, prev)
		}
		prev = d
	}
	if prev != 2e9 {
		t.Fatalf("backoff tops out at %v, want 2s", prev)
	}
}

// A coordinator still loading (a broker's first InitProducerId, while it fetches producer ids from
// the controller) answers within milliseconds: the first retries are short, then they back off like
// any other, and only a load that lasts says so.
func TestRetryDelay(t *testing.T) {
	network := errors.New("connection refused")
	tests := []struct {
		name    string
		err     error
		attempt int
		delay   time.Duration
		warn    bool
	}{
		{"loading, first retry", kafka.GroupLoadInProgress, 0, 10 * time.Millisecond, false},
		{"loading, fourth retry", kafka.GroupLoadInProgress, 3, 80 * time.Millisecond, false},
		{"loading, fifth retry says so", kafka.GroupLoadInProgress, 4, 160 * time.Millisecond, true},
		{"loading, long", kafka.GroupLoadInProgress, 8, 2 * time.Second, true},
		{"loading, longer", kafka.GroupLoadInProgress, 50, 2 * time.Second, true},
		{"wrapped loading", fmt.Errorf("init producer id: %w", kafka.GroupLoadInProgress), 0, 10 * time.Millisecond, false},
		{"concurrent transactions", kafka.ConcurrentTransactions, 0, 5 * time.Millisecond, false},
		{"concurrent transactions, for long", kafka.ConcurrentTransactions, 100, 5 * time.Millisecond, true},
		{"coordinator not available", kafka.GroupCoordinatorNotAvailable, 0, 200 * time.Millisecond, false},
		{"network, second retry", network, 1, 400 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			delay, warn := retryDelay(tt.attempt, tt.err)
			if delay != tt.delay || warn != tt.warn {
				t.Errorf("retryDelay(%d, %v) = %v, warn %v; want %v, warn %v", tt.attempt, tt.err, delay, warn, tt.delay, tt.warn)
			}
		})
	}
}
