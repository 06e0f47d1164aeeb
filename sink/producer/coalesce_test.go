package producer_test

import (
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
)

// TestARequestWithATopicKafkaGoCannotRouteYetSendsTheOthersAlone: kafka-go refuses a whole request
// when one of its topics is missing from its metadata (a topic the brokers are still creating);
// the other partitions of that request must not wait with it.
func TestARequestWithATopicKafkaGoCannotRouteYetSendsTheOthersAlone(t *testing.T) {
	t.Parallel()
	fb := fakebroker.New(t)
	fb.SetIdempotent(true, 0)
	f := newOnFake(t, fb, 300*time.Millisecond, time.Second)
	// The fake answers for topic New when asked for it by name, but never lists it among every
	// topic, which is what kafka-go's transport routes by: it cannot route a request holding New.
	// (Learning New's partitions waits out the request timeout for the transport to see it.)
	f.enqueue(t, "New", "n0")
	f.enqueue(t, "A", "a0")
	f.enqueue(t, "B", "b0")
	f.wait(t, 2) // A's and B's
	stored(t, fb, "A/a0", "B/b0")
	if got, _ := fb.State(); slices.Contains(got, "New/n0") {
		t.Errorf("the broker stored n0, which kafka-go cannot route: %v", got)
	}
	// n0 is retried once the transport gave up routing it (the request timeout): wait for that
	// rather than assume it came before A and B were written.
	deadline := time.Now().Add(30 * time.Second)
	for !f.retriedTopic("New") {
		if time.Now().After(deadline) {
			t.Fatal("n0 was never retried")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f.retriedTopic("A") || f.retriedTopic("B") {
		t.Errorf("A or B was retried; both were written at their first attempt")
	}
}
