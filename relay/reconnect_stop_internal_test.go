package relay

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// A session lost inside a transaction leaves it open in the tracker (to be resumed); the next
// session's Session message sets the pipeline's tx to nil. A stop that arrives before the replay
// reaches that transaction's Begin ended the pipeline at once (tx == nil) without aborting the
// tracker's open transaction: Drained never closed, so Run waited for the shutdown timeout.
func TestAStopRightAfterAReconnectMidTransactionLeavesTheCheckpointDrained(t *testing.T) {
	r := newWAL(t, Config{Sink: sink.Config{Brokers: []string{"127.0.0.1:1"}}}, zap.NewNop(), metrics.New(prometheus.NewRegistry()))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		r.sink.Close(ctx)
	}()
	stop, cancelStop := context.WithCancel(context.Background())
	hard, cancelHard := context.WithTimeout(context.Background(), time.Minute)
	defer cancelHard()
	msgs := make(chan replication.Message)
	piped := make(chan error, 1)
	go func() { piped <- r.pipeline(stop, hard, msgs) }()
	session := replication.Message{Kind: replication.Session, Timeline: 1, SystemID: "1", WALEnd: 0x10}
	msgs <- session
	msgs <- dataMessage(relationMessage(outboxColumns))
	msgs <- dataMessage(beginMessage(0x100)) // the session is lost before this transaction's Commit
	msgs <- session                          // reconnected; the replay has not reached 0x100 yet
	cancelStop()                             // SIGTERM
	select {
	case err := <-piped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pipeline did not end")
	}
	select {
	case <-r.tracker.Drained():
	case <-time.After(2 * time.Second):
		t.Fatalf("the checkpoint never drains after the pipeline ended (Pending %d): Run waits on it until shutdown_timeout", r.tracker.Pending())
	}
}
