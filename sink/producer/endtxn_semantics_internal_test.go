package producer

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestACommitWithNoTransactionInProgressIsAnsweredWithSuccess pins down the broker behaviour that
// makes the exactly-once losses the nemesis found possible (docs/guarantees.md, "The nemesis"): once the coordinator has
// completed a commit, an EndTxn(commit) with the same producer id and epoch is taken for a retry of
// it and answered with success, whether or not the producer meant another transaction. So an
// EndTxn answered NONE proves that the transaction the sink meant committed only if the
// coordinator had that transaction in progress: a transaction whose partitions never reached it
// (their AddPartitionsToTxn taken into the transaction before) is "committed" without a marker,
// its records stay dangling, and the sink acknowledges them.
func TestACommitWithNoTransactionInProgressIsAnsweredWithSuccess(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.UniqueName(t, "endtxn")
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	id := testenv.UniqueName(t, "txn")
	ident := &Identity{client: client, log: zap.NewNop(), mode: IdempotenceOn, txnID: id, txnTimeout: time.Minute}
	pid, epoch, err := ident.InitProducerID(ctx, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	ps := State{ID: pid, Epoch: epoch, Transactional: true}
	c := NewCoordinator(client, id)
	retry := func(what string, f func() error) {
		t.Helper()
		for attempt := 0; ; attempt++ {
			err := f()
			if err == nil {
				return
			}
			if attempt == 50 || !RetriableCoordinatorError(err) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	retry("add the partition", func() error { return c.AddPartitions(ctx, ps, map[TopicPartition]bool{{topic, 0}: true}) })
	retry("commit the transaction", func() error { return c.EndTxn(ctx, ps, true) })
	// Nothing added since: no transaction is in progress, and a commit is still answered NONE
	// (once the markers of the one before are written; CONCURRENT_TRANSACTIONS until then).
	retry("commit with no transaction in progress", func() error { return c.EndTxn(ctx, ps, true) })
}
