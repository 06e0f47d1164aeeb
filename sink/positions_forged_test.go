package sink_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestAPositionNotWrittenInAKafkaTransactionIsIgnored is the forged position of issue 46: a
// record keyed by the relay's transactional id, written to the positions topic by another,
// non-transactional producer (a redrive of a dead letter routed there, a console producer), with
// a commit LSN far ahead. Trusted, it would make the next start skip every event for good; the
// relay takes the last position it committed itself, and says so in one line.
func TestAPositionNotWrittenInAKafkaTransactionIsIgnored(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, 50*time.Millisecond, 100)
	s := readySink(t, k.Brokers(), cfg)
	stream := newPGStream(5)
	acks := &acker{}
	for i := range 20 {
		s.publish(t, stream.next(fmt.Sprintf("order-%d", i%3)), acks)
	}
	eventually(t, time.Minute, "the events committed", func() bool { return acks.n.Load() == 20 })
	committed, ok := s.Committed()
	if !ok || committed != stream.position() {
		t.Fatalf("committed %v %v, want %v", committed, ok, stream.position())
	}
	s.mustClose(t)

	w := &kafka.Writer{Addr: kafka.TCP(k.Brokers()), Balancer: &kafka.Murmur2Balancer{Consistent: true}, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var werr error
	eventually(t, 30*time.Second, "the forged position written", func() bool {
		werr = w.WriteMessages(ctx, kafka.Message{Topic: cfg.Transactions.PositionsTopic, Key: []byte(cfg.Transactions.ID),
			Value: []byte(`{"v":1,"commit_lsn":"FFFFFFFF/0","events":0}`)})
		return werr == nil
	})

	restarted := readySink(t, k.Brokers(), cfg)
	pos, found, err := restarted.ReadPosition(ctx)
	if err != nil || !found || pos != committed {
		t.Fatalf("ReadPosition after the forged record = %v %v %v, want the committed %v", pos, found, err, committed)
	}
	if n := restarted.logs.FilterMessageSnippet("not written in a Kafka transaction").Len(); n != 1 {
		t.Errorf("%d log lines about the forged record, want one", n)
	}
	restarted.mustClose(t)
}
