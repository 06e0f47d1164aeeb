package redrive

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
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

// TestNothingIsRedrivenToATopicTheRelayTrustsOrARowMayNotReach is the forged position of issue
// 46 at redrive: a dead letter naming the positions topic as its original topic, keyed like a
// position, goes nowhere; nor does a route the relay refused, nor one the current routing refuses.
// A dead letter the routing allows goes where the routing sends it now.
func TestNothingIsRedrivenToATopicTheRelayTrustsOrARowMayNotReach(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, topic, w := topics(ctx, t)
	positions := "_" + topic + "_positions"
	if err := testenv.SharedKafka(t).CreateTopic(ctx, positions, 1); err != nil {
		t.Fatal(err)
	}
	forged := deadLetter(cfg.DeadLetterTopic, positions, "e-forged")
	forged.Key = []byte("victim-transactional-id")
	forged.Value = []byte(`{"v":1,"commit_lsn":"FFFFFFFF/0","events":0}`)
	refused := deadLetter(cfg.DeadLetterTopic, "connect-configs", "e-refused")
	refused.Headers = append(refused.Headers, kafka.Header{Key: sink.HeaderDLQReason, Value: []byte(sink.ReasonTopicNotAllowed)})
	outside := deadLetter(cfg.DeadLetterTopic, topic, "e-outside")
	outside.Headers = append(outside.Headers, kafka.Header{Key: record.HeaderAggregateType, Value: []byte("connect-configs")})
	good := deadLetter(cfg.DeadLetterTopic, topic, "e-good")
	good.Headers = append(good.Headers, kafka.Header{Key: record.HeaderAggregateType, Value: []byte(topic)})
	if err := w.WriteMessages(ctx, forged, refused, outside, good); err != nil {
		t.Fatal(err)
	}
	cfg.PositionsTopic = positions

	t.Run("without the routing, a reserved original topic is refused", func(t *testing.T) {
		c := cfg
		c.EventIDs = []string{"e-forged"}
		res, err := Run(ctx, c)
		if err != nil || res.Redriven != 0 || len(res.Failed) != 1 || !strings.Contains(res.Failed[0].Err.Error(), "reserved") {
			t.Fatalf("Run = %+v, %v; want the forged position refused as reserved", res, err)
		}
	})
	t.Run("with the routing, only what it allows goes back, to where it routes", func(t *testing.T) {
		c := cfg
		c.Route = &record.Options{TopicTemplate: "{aggregate_type}", TopicAllow: []string{topic}}
		res, err := Run(ctx, c)
		if err != nil || res.Redriven != 1 || len(res.Failed) != 3 {
			t.Fatalf("Run = %+v, %v; want e-good redriven, the others refused", res, err)
		}
		for _, f := range res.Failed {
			if f.EventID == "e-good" {
				t.Errorf("%s failed: %v", f.EventID, f.Err)
			}
		}
	})
	client := &kafka.Client{Addr: kafka.TCP(cfg.Brokers[0]), Timeout: 10 * time.Second}
	offs, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{positions: {kafka.LastOffsetOf(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	if p := offs.Topics[positions]; len(p) != 1 || p[0].Error != nil || p[0].LastOffset != 0 {
		t.Errorf("positions topic offsets %+v: redrive wrote to it", p)
	}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{"connect-configs"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Topics) != 1 || !errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) {
		t.Error("topic connect-configs exists: redrive wrote to it")
	}
}
