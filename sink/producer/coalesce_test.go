package producer_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
)

// TestPartitionsOfOneBrokerShareAProduceRequestAndKeepTheirOwnAnswers: records of three partitions
// led by the same broker, handed over within one linger, travel in one Produce request; the broker
// answers each partition on its own, and each answer is handled for its partition only: A's
// OUT_OF_ORDER_SEQUENCE_NUMBER restarts A's sequence (a new epoch), B's refused record is split out
// and answered alone with the refusal, and C's batch, written at once, is sent exactly once.
func TestPartitionsOfOneBrokerShareAProduceRequestAndKeepTheirOwnAnswers(t *testing.T) {
	t.Parallel()
	fb := fakebroker.New(t)
	firstA := true
	fb.SetIdempotent(true, 0)
	fb.SetPlan(func(ids []string) int16 {
		switch {
		case slices.Contains(ids, "A/a0") && firstA:
			firstA = false
			return int16(kafka.OutOfOrderSequenceNumber)
		case slices.Contains(ids, "B/b1"):
			return int16(kafka.InvalidRecord) // alone or with others
		}
		return 0
	})
	f := newOnFake(t, fb, 300*time.Millisecond, 5*time.Second)
	ids := []string{"a0", "b0", "c0", "a1", "b1", "c1", "b2"}
	for _, id := range ids {
		f.enqueue(t, strings.ToUpper(id[:1]), id)
	}
	f.wait(t, len(ids))

	requests := fb.Requests()
	if len(requests) == 0 || !sameSet(requests[0], []string{"A/0", "B/0", "C/0"}) {
		t.Errorf("the first produce request held %v, want the batches of A, B and C together (every request: %v)", firstOr(requests), requests)
	}
	want := map[string][]string{
		// A's sequence was lost: a new epoch from sequence 0, the same records.
		"A": {"[a0 a1] pid 1000 epoch 0 seq 0 -> 45", "[a0 a1] pid 1000 epoch 1 seq 0 -> 0"},
		// B's batch was refused for b1: split, b1 refused on its own gives its sequence back.
		"B": {"[b0 b1 b2] pid 1000 epoch 0 seq 0 -> 87", "[b0] pid 1000 epoch 0 seq 0 -> 0",
			"[b1] pid 1000 epoch 0 seq 1 -> 87", "[b2] pid 1000 epoch 0 seq 1 -> 0"},
		// C was written by the first request and never sent again.
		"C": {"[c0 c1] pid 1000 epoch 0 seq 0 -> 0"},
	}
	for topic, w := range want {
		if g := sawFor(fb, topic); strings.Join(g, "\n") != strings.Join(w, "\n") {
			t.Errorf("the broker saw for %s\n  %s\nwant\n  %s", topic, strings.Join(g, "\n  "), strings.Join(w, "\n  "))
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		err, answered := f.answers[id]
		if !answered || (id == "b1") != (err != nil) || id == "b1" && !errors.Is(err, kafka.InvalidRecord) {
			t.Errorf("%s answered %v with %v; want b1 alone refused (INVALID_RECORD), the others acknowledged", id, answered, err)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func firstOr(requests [][]string) string {
	if len(requests) == 0 {
		return "nothing"
	}
	return fmt.Sprint(requests[0])
}

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
	await.True(t, 30*time.Second, "n0 retried", func() bool { return f.retriedTopic("New") })
	if f.retriedTopic("A") || f.retriedTopic("B") {
		t.Errorf("A or B was retried; both were written at their first attempt")
	}
}
