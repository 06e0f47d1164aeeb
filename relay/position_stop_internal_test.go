package relay

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// A graceful stop while a session's start waits for the position (the wait behind another relay's
// open transaction in the positions partition, or TIMELINE_HISTORY retries) ends the wait: nothing
// of the session was handed over. It ran on hard alone, so the stop waited for shutdown_timeout.
func TestAStopDuringThePositionWaitIsNotHeldUntilTheShutdownTimeout(t *testing.T) {
	r, _ := newTestWAL(t, Config{Sink: sink.Config{Brokers: []string{"127.0.0.1:1"}}})
	r.cfg.Sink.Transactions = &sink.Transactions{ID: "review"}
	r.positionChecked = true
	r.positions = func(ctx context.Context) (sink.Position, bool, error) {
		<-ctx.Done() // waitStable behind another producer's open transaction
		return sink.Position{}, false, ctx.Err()
	}
	msgs := make(chan replication.Message, 1)
	msgs <- session(1, 50)
	stop, stopNow := context.WithCancel(context.Background())
	hard, hardNow := context.WithTimeout(context.Background(), 5*time.Second) // ShutdownTimeout stand-in
	defer hardNow()
	done := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		_ = r.pipeline(stop, hard, msgs)
		done <- time.Since(start)
	}()
	time.Sleep(200 * time.Millisecond)
	stopNow()
	took := <-done
	if took > 2*time.Second {
		t.Fatalf("the pipeline returned %v after the start, only when hard ended: a stop during the position wait waits for shutdown_timeout", took)
	}
}
