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

// TestABrokerThatDeniesIdempotenceIsAWarningUnlessItIsRequired: kafka.idempotence auto publishes
// without it and says so; on refuses to start, naming the key.
func TestABrokerThatDeniesIdempotenceIsAWarningUnlessItIsRequired(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		offered    bool        // the broker offers InitProducerId
		code       kafka.Error // and answers it with
		mode       sink.Idempotence
		startError bool
	}{
		{"auto, IDEMPOTENT_WRITE denied: published without, with a warning", true, kafka.ClusterAuthorizationFailed, sink.IdempotenceAuto, false},
		{"auto, a broker without InitProducerId: published without, with a warning", false, 0, sink.IdempotenceAuto, false},
		{"on, IDEMPOTENT_WRITE denied: a start error naming kafka.idempotence", true, kafka.ClusterAuthorizationFailed, sink.IdempotenceOn, true},
		{"on, a broker without InitProducerId: a start error", false, 0, sink.IdempotenceOn, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := fakebroker.New(t)
			fb.SetIdempotent(tt.offered, tt.code)
			s := newSink(t, "", sink.Config{Brokers: []string{fb.Addr()}, Record: record.Options{TopicTemplate: "events"}, DeadLetterTopic: "dlq",
				Linger: -1, WriteTimeout: 5 * time.Second, Idempotence: tt.mode})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := s.WaitReady(ctx)
			if tt.startError {
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
				return
			}
			if err != nil {
				t.Fatalf("WaitReady: %v", err)
			}
			if s.logs.FilterMessageSnippet("refuse the idempotent producer").Len() != 1 {
				t.Error("no warning says the producer runs without idempotence")
			}
			a := &acker{}
			s.publish(t, newEvent("e0", []byte("Order"), "order-1", "Changed", []byte(`{}`)), a)
			eventually(t, 30*time.Second, "the event acknowledged", func() bool { return a.n.Load() == 1 })
			s.mustClose(t)
			for _, b := range fb.Batches() {
				if b.ProducerID != -1 || b.Seq != -1 {
					t.Errorf("batch %v carries a producer id", b)
				}
			}
		})
	}
}
