package producer

import "testing"

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
