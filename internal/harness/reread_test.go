package harness_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Reread finds every record of every partition, with its headers, in offset order, and so does the
// consumer: the two readings a delivery check compares.
func TestRereadFindsWhatWasWritten(t *testing.T) {
	k := testenv.SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.UniqueName(t, "reread")
	if err := k.CreateTopic(ctx, topic, 3); err != nil {
		t.Fatal(err)
	}
	w := &kafka.Writer{Addr: kafka.TCP(strings.Split(k.Brokers(), ",")...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	const n = 300
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "k%d", i%7), Value: fmt.Appendf(nil, "v%d", i),
			Headers: []kafka.Header{{Key: "id", Value: fmt.Appendf(nil, "%d", i)}}}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	recs, err := harness.Reread(ctx, k.Brokers(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("re-read %d records, want %d", len(recs), n)
	}
	seen := make(map[string]bool)
	last := map[int]int64{}
	for _, r := range recs {
		seen[r.Header("id")] = true
		if prev, ok := last[r.Partition]; ok && r.Offset <= prev {
			t.Fatalf("partition %d: offset %d after %d", r.Partition, r.Offset, prev)
		}
		last[r.Partition] = r.Offset
	}
	if len(seen) != n {
		t.Fatalf("re-read %d distinct ids, want %d", len(seen), n)
	}
}
