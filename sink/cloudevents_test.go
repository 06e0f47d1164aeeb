package sink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// With envelope cloudevents, an event the envelope cannot carry (here a payload that is not the
// JSON its data content type says) goes to the failure policy with reason invalid_cloudevent; its
// topic receives only CloudEvents, and the events after it still go out.
func TestAnEventThatCannotBeACloudEventIsDeadLetteredNeverPublishedBare(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "agg")
	topic := "outbox.event." + aggType
	dlq := testenv.UniqueName(t, "dlq")
	if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	s := readySink(t, k.Brokers(), sink.Config{DeadLetterTopic: dlq, Record: record.Options{CloudEvents: &record.CloudEvents{}}})

	acks := make([]*acker, 5)
	for i := range acks {
		payload := fmt.Appendf(nil, `{"seq":%d}`, i)
		if i == 2 {
			payload = []byte("not json")
		}
		acks[i] = &acker{}
		s.publish(t, newEvent(fmt.Sprintf("e-%d", i), []byte(aggType), "order-1", "Placed", payload), acks[i])
	}
	s.mustClose(t)
	for i, a := range acks {
		if a.n.Load() != 1 {
			t.Errorf("event e-%d acked %d times, want once", i, a.n.Load())
		}
	}

	published := readBack(t, k.Brokers(), 30*time.Second, atLeast(4), topic)
	if len(published) != 4 {
		t.Errorf("%d records on %s, want the 4 that could be CloudEvents", len(published), topic)
	}
	for _, r := range published {
		var ce struct{ ID, SpecVersion string }
		if r.Header("content-type") != record.CloudEventsJSONContentType || json.Unmarshal(r.Value, &ce) != nil || ce.ID != r.Header("id") || ce.ID == "e-2" {
			t.Errorf("record %s on the event topic is not its structured CloudEvent: content-type %q, value %s", r.Header("id"), r.Header("content-type"), r.Value)
		}
	}
	dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), dlq)
	if len(dead) != 1 {
		t.Fatalf("%d records on the dead-letter topic, want 1", len(dead))
	}
	if d := dlqRecord(t, dead, "e-2"); d.Header(sink.HeaderDLQReason) != sink.ReasonInvalidCloudEvent || d.Header(sink.HeaderDLQTopic) != topic {
		t.Errorf("dead letter headers %v: want reason %s and original topic %s", d.Headers, sink.ReasonInvalidCloudEvent, topic)
	}
	if got := s.metric(t, "outbox_relay_events_failed_total", "reason", sink.ReasonInvalidCloudEvent); got != 1 {
		t.Errorf("events_failed_total{reason=%q} = %v, want 1", sink.ReasonInvalidCloudEvent, got)
	}
}
