package sink_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestABrokerRefusalDeadLetteredAfterALaterRejectStillCommits: with exactly-once, the dead-letter
// producer is fed from two sides: Publish rejects an event it cannot build
// (headers that are no JSON object)
// at once, while the broker's refusal of an earlier event arrives later, from its partition. The
// later event belongs to the next Kafka transaction; the earlier one to the transaction being
// committed, which cannot commit without it. Queued behind the later one in the dead-letter
// partition, it must still go, or the transaction never commits and nothing more is acknowledged.
//
// The first Kafka transaction is made to close full (transaction_max_events, never by time) with
// the refused event last, behind a backlog its partition sends one record per request, so the
// refusal comes well after the next event, the first of the second transaction, was rejected.
func TestABrokerRefusalDeadLetteredAfterALaterRejectStillCommits(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	const backlog = 300
	// One Kafka transaction of backlog+1 events: it closes full, never by time.
	cfg := txnConfig(t, k, 30*time.Second, backlog+1)
	cfg.Transactions.Linger = cfg.Transactions.Interval
	cfg.Record.TopicTemplate = testenv.UniqueName(t, "small")
	createTopic(t, k.Brokers(), cfg.Record.TopicTemplate, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "2000"})
	createTopic(t, k.Brokers(), cfg.DeadLetterTopic, 1)
	cfg.BatchSize = 1
	s := readySink(t, k.Brokers(), cfg)
	a := &acker{}
	stream := newPGStream(1000)
	for i := range backlog {
		s.publish(t, stream.next(fmt.Sprintf("k%d", i%7)), a)
	}
	refused := stream.next("k0") // the last of the first Kafka transaction: the topic's 2000 bytes are too few
	refused.Payload = []byte(`"` + strings.Repeat("x", 3000) + `"`)
	s.publish(t, refused, a)
	rejected := stream.next("k0") // the first of the next one: its headers are no JSON object
	rejected.Headers = []byte("not json")
	s.publish(t, rejected, a)
	eventually(t, 90*time.Second, fmt.Sprintf("every event acknowledged (the last two dead-lettered); %d of %d", a.n.Load(), backlog+2),
		func() bool { return a.n.Load() == backlog+2 })
	s.mustClose(t)
	dead := readCommitted(t, k.Brokers(), 60*time.Second, atLeast(2), cfg.DeadLetterTopic)
	if len(dead) != 2 {
		for _, r := range dead {
			t.Logf("dead letter %s (%s)", r.Header("id"), r.Header("outbox.dlq.reason"))
		}
		t.Errorf("dead-letter topic holds %d records, want the refused and the rejected event", len(dead))
	}
}
