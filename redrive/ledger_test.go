package redrive

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// topics creates a dead-letter topic and an original topic of one partition each on the shared
// broker, and returns a Config for them that sets nothing else (Transport nil).
func topics(ctx context.Context, t *testing.T) (Config, string, *kafka.Writer) {
	t.Helper()
	k := testenv.SharedKafka(t)
	dlq, topic := testenv.UniqueName(t, "dlq"), testenv.UniqueName(t, "orders")
	for _, name := range []string{dlq, topic} {
		if err := k.CreateTopic(ctx, name, 1); err != nil {
			t.Fatal(err)
		}
	}
	w := &kafka.Writer{Addr: kafka.TCP(k.Brokers()), RequiredAcks: kafka.RequireAll, BatchSize: 1}
	t.Cleanup(func() { w.Close() })
	return Config{Brokers: []string{k.Brokers()}, DeadLetterTopic: dlq, Partition: -1, FromOffset: -1, ToOffset: -1}, topic, w
}

func deadLetter(dlq, topic, id string) kafka.Message {
	return kafka.Message{Topic: dlq, Key: []byte("o-1"), Value: []byte(`{}`), Headers: []kafka.Header{
		{Key: sink.HeaderID, Value: []byte(id)},
		{Key: sink.HeaderDLQTopic, Value: []byte(topic)},
		{Key: sink.HeaderDLQKey, Value: []byte("o-1")},
		{Key: sink.HeaderDLQReason, Value: []byte(sink.ReasonTooLarge)},
	}}
}

func TestARunWithoutATransportUsesKafkaGosDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, topic, w := topics(ctx, t)
	if err := w.WriteMessages(ctx, deadLetter(cfg.DeadLetterTopic, topic, "e-1")); err != nil {
		t.Fatal(err)
	}
	if res, err := Run(ctx, cfg); err != nil || res.Redriven != 1 {
		t.Fatalf("Run = %+v, %v; want the dead letter redriven", res, err)
	}
}
