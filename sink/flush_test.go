package sink_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestFlushSendsWhatWasPublishedWithoutWaitingForTheLinger: a caller that waits for the
// acknowledgements of what it published before it publishes more (the poller) must not wait a
// linger for them. Flush sends what was published so far, to the event topics and the dead-letter
// topic alike; what is published once that is sent lingers as before.
func TestFlushSendsWhatWasPublishedWithoutWaitingForTheLinger(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "agg")
	s := readySink(t, k.Brokers(), sink.Config{
		Linger:          time.Hour, // nothing goes by age in this test
		DeadLetterTopic: testenv.UniqueName(t, "dlq"),
	})
	before, rejected, after := &acker{}, &acker{}, &acker{}
	const n = 30 // over the topic's 3 partitions
	for i := range n {
		s.publish(t, newEvent(fmt.Sprintf("%s-before-%d", aggType, i), []byte(aggType), fmt.Sprintf("agg-%d", i), "Changed", []byte(`{}`)), before)
	}
	ctx := t.Context()
	if err := s.Reject(ctx, newEvent(aggType+"-rejected", []byte(aggType), "agg-0", "Changed", []byte(`{}`)),
		sink.ReasonSchemaMismatch, fmt.Errorf("test"), rejected); err != nil {
		t.Fatal(err)
	}
	s.Flush()
	eventually(t, 30*time.Second, "the events published before Flush are acknowledged", func() bool {
		return before.n.Load() == n && rejected.n.Load() == 1
	})
	for i := range n {
		s.publish(t, newEvent(fmt.Sprintf("%s-after-%d", aggType, i), []byte(aggType), fmt.Sprintf("agg-%d", i), "Changed", []byte(`{}`)), after)
	}
	// These were not flushed: they wait for the linger (or Close). Nothing comes after a wrong
	// send that the test could wait for instead, so time is the subject here.
	await.Window(t, time.Second, "the events published after Flush would be sent by now if they did not linger")
	if got := after.n.Load(); got != 0 {
		t.Fatalf("%d of the events published after Flush were acknowledged within a second of a one-hour linger", got)
	}
	s.mustClose(t)
	if got := after.n.Load(); got != n {
		t.Fatalf("after Close, %d of %d events published after Flush acknowledged", got, n)
	}
}

// TestARecordThatWaitedForTheWindowStillLingers: the linger counts from when a record is handed
// to the producer, not from when Publish began: a record that first waited for room in the
// in-flight window (a backlog, a Kafka outage) lingers like any other once it has the room,
// rather than going alone in a request of its own the moment the window frees.
func TestARecordThatWaitedForTheWindowStillLingers(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "agg")
	const linger = 400 * time.Millisecond
	s := readySink(t, k.Brokers(), sink.Config{Linger: linger, MaxInFlight: 1})
	// A first event makes the topic and its partitions known, so nothing below waits for them.
	warm, first, second := &acker{}, &acker{}, &acker{}
	s.publish(t, newEvent(aggType+"-0", []byte(aggType), "agg-1", "Changed", []byte(`{}`)), warm)
	eventually(t, 30*time.Second, "the first event is acknowledged", func() bool { return warm.n.Load() == 1 })
	s.publish(t, newEvent(aggType+"-1", []byte(aggType), "agg-1", "Changed", []byte(`{}`)), first)
	s.publish(t, newEvent(aggType+"-2", []byte(aggType), "agg-1", "Changed", []byte(`{}`)), second) // waits for the one before
	handed := time.Now()
	eventually(t, 30*time.Second, "the event that waited is acknowledged", func() bool { return second.n.Load() == 1 })
	if waited := time.Since(handed); waited < linger/2 {
		t.Fatalf("the event that waited for the window was acknowledged %s after it was handed over: it skipped its %s linger", waited.Round(time.Millisecond), linger)
	}
	s.mustClose(t)
}
