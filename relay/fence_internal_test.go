package relay

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestAFencedPipelinePublishesNothingMore: once hard has ended (a fence, or shutdown_timeout), the
// messages still waiting in the channel must not reach Kafka, and the sink must not take an event
// under an ended context even while its window has room: the instance taking over publishes them,
// so every one handed over here would be a needless duplicate, sent by an instance that no longer
// leads.
func TestAFencedPipelinePublishesNothingMore(t *testing.T) {
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "fence")
	r, reg := newTestWAL(t, Config{Sink: sink.Config{Brokers: []string{k.Brokers()}}})
	ctx := context.Background()

	// One transaction with live contexts, so the topic is known and the sink has room.
	if err := r.pipeline(ctx, ctx, feed(relationMessage(outboxColumns), beginMessage(100), event(aggType, 0, `{}`), commitMessage(100, 110))); err != nil {
		t.Fatal(err)
	}

	fenced, fence := context.WithCancel(ctx)
	fence()
	buffered := [][]byte{beginMessage(200)}
	for i := 1; i <= 30; i++ {
		buffered = append(buffered, event(aggType, i, `{}`))
	}
	buffered = append(buffered, commitMessage(200, 210))
	if err := r.pipeline(ctx, fenced, feed(buffered...)); err != nil {
		t.Fatalf("pipeline after the fence returned %v", err)
	}
	// Straight to the sink too: the pipeline may have checked just before the fence.
	ev := &decoder.Event{ID: []byte("direct"), AggregateType: []byte(aggType), AggregateID: []byte("agg"), Payload: []byte(`{}`)}
	if err := r.sink.Publish(fenced, ev, &countAcks{}); err == nil {
		t.Error("Publish with an ended context returned nil: it took the event")
	}

	closeCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.sink.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	if got := publishedTotal(t, reg); got != 1 {
		t.Fatalf("%v events reached Kafka, want 1 (the one before the fence): the fenced relay published %v more", got, got-1)
	}
}
