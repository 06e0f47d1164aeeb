package redrive

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
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
		{Key: record.HeaderID, Value: []byte(id)},
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

// A dead-letter topic deleted and created again (to clear it, or by a new environment) starts
// its offsets at 0 again, while the ledger still holds what went back from the old topic's
// offsets. A new dead letter at an old offset is another event: it must go back, not be skipped
// as "redriven by an earlier run".
func TestADeadLetterAtAnOffsetTheLedgerHoldsForAnotherEventIsRedriven(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, topic, w := topics(ctx, t)
	// What an earlier run recorded for offset 0 of the topic's previous incarnation.
	old, _ := json.Marshal(ledgerEntry{EventID: "e-old", Topic: topic, At: time.Now().UTC()})
	if err := testenv.SharedKafka(t).CreateTopic(ctx, cfg.DeadLetterTopic+LedgerSuffix, 1); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteMessages(ctx,
		kafka.Message{Topic: cfg.DeadLetterTopic + LedgerSuffix, Key: []byte(cfg.DeadLetterTopic + "/0/0"), Value: old},
		deadLetter(cfg.DeadLetterTopic, topic, "e-new"),
	); err != nil {
		t.Fatal(err)
	}
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Read != 1 || res.Redriven != 1 || res.Already != 0 || len(res.Failed) != 0 {
		t.Fatalf("result %+v; want the new event at offset 0 redriven, not skipped for the old one", res)
	}
	// And now it is recorded: a second run skips it.
	if res, err := Run(ctx, cfg); err != nil || res.Redriven != 0 || res.Already != 1 {
		t.Fatalf("second run: %+v, %v; want it skipped", res, err)
	}
}
