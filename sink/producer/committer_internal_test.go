package producer

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

// TestACommitterOnAClientWithoutATransportReadsThroughTheDefaultOne: a kafka.Client may leave its
// Transport nil (kafka-go's methods then use the default one). The Committer reads with the
// transport directly when it checks that a repaired transaction's records are readable, so it must
// fill it in as the Producer and the Coordinator do: it used to dereference nil there (the
// producer's TestRecordsReachKafkaOnceAndInOrder crashed so on a loaded machine, whose marker
// waits timed out into a repair).
func TestACommitterOnAClientWithoutATransportReadsThroughTheDefaultOne(t *testing.T) {
	client := &kafka.Client{Addr: kafka.TCP("127.0.0.1:1"), Timeout: time.Second} // nobody listens
	tm := NewCommitter(CommitterConfig{Client: client, ID: "t", Identity: NewIdentity(client, zap.NewNop(), IdempotenceOn, "t", time.Minute),
		Timeout: time.Second, MaxRecords: 1, Log: zap.NewNop()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := tm.readable(ctx, map[TopicPartition]Span{{Topic: "events", Partition: 0}: {First: 0, Last: 0}})
	if err == nil {
		t.Fatal("readable found a record on a broker that is not there")
	}
}
