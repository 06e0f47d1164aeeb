package sink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// readCommitted reads topics like a read_committed consumer until want holds, then a little
// longer for late duplicates.
func readCommitted(t *testing.T, brokers string, timeout time.Duration, want func([]harness.Record) bool, topics ...string) []harness.Record {
	t.Helper()
	return readWith(t, harness.NewCommittedConsumer(brokers, topics...), timeout, want, topics)
}

// TestAStartThatRequiresIdempotenceFailsWhenTheBrokerDeniesIt: with kafka.idempotence on, a
// broker that denies the producer id is a start error: WaitReady returns it, naming the key,
// Failed closes and Publish takes nothing more. (The producer's side, and auto's warning, are
// sink/producer's TestABrokerThatDeniesIdempotenceIsAWarningUnlessItIsRequired; the sink's
// default, auto, publishing on a broker without producer ids is
// TestSinkRetriesBrokerErrorsThatAreNotAboutTheRecord's premise.)
func TestAStartThatRequiresIdempotenceFailsWhenTheBrokerDeniesIt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		offered bool        // the broker offers InitProducerId
		code    kafka.Error // and answers it with
	}{
		{"IDEMPOTENT_WRITE denied", true, kafka.ClusterAuthorizationFailed},
		{"a broker without InitProducerId", false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := fakebroker.New(t)
			fb.SetIdempotent(tt.offered, tt.code)
			s := newSink(t, "", sink.Config{Brokers: []string{fb.Addr()}, Record: record.Options{TopicTemplate: "events"}, DeadLetterTopic: "dlq",
				Linger: -1, WriteTimeout: 5 * time.Second, Idempotence: sink.IdempotenceOn})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := s.WaitReady(ctx)
			if err == nil || !strings.Contains(err.Error(), "kafka.idempotence") {
				t.Fatalf("WaitReady = %v, want an error naming kafka.idempotence", err)
			}
			select {
			case <-s.Failed():
			default:
				t.Error("Failed did not close")
			}
			if perr := s.Publish(ctx, newEvent("e0", []byte("Order"), "order-1", "Changed", []byte(`{}`)), &acker{}); perr == nil {
				t.Error("Publish accepted an event after the start error")
			}
		})
	}
}
