package poll_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/poll"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestAHaltMarksWhatKafkaAcknowledgedBeforeIt: under on_failure: halt, the sink still sends and
// acknowledges the events handed over before the halted one. A batch must wait for those and mark
// them processed; a batch that stopped waiting at the halt left them pending, and every relay that
// reached them published them again (here: a second relay, which halts on the same dead letter, as
// documented, after publishing the 150 good events a second time).
func TestAHaltMarksWhatKafkaAcknowledgedBeforeIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, ob := pollDB(t)
	brokers := testenv.SharedKafka(t).Brokers()
	good := testenv.UniqueName(t, "good")
	var specs []harness.Spec
	for i := range 150 {
		specs = append(specs, harness.Spec{AggregateType: good, AggregateID: fmt.Sprint("g", i%50), PadBytes: 2000})
	}
	if err := ob.WriteTx(ctx, specs...); err != nil {
		t.Fatal(err)
	}
	goodRows := ob.Written()
	if err := ob.WriteTx(ctx, harness.Spec{AggregateType: "not a topic " + testenv.UniqueName(t, "x"), AggregateID: "p"}); err != nil {
		t.Fatal(err)
	}
	// The last row, in the same batch, is a dead letter already: under halt it halts the sink.
	if _, err := ob.Pool().Exec(ctx, `UPDATE outbox_events SET attempts = 5, retry_after = 'infinity', last_error = 'refused' WHERE seq = (SELECT max(seq) FROM outbox_events)`); err != nil {
		t.Fatal(err)
	}
	pc := poll.Config{BatchSize: 200, Workers: 1, MaxAttempts: 5}
	sc := sink.Config{Policy: sink.Halt}
	halts := func(p *poller) {
		t.Helper()
		await.State(t, settleTimeout, "the poller to halt", func() (bool, string) {
			_, reason, _, h := p.r.Sink().Halted()
			return h, reason
		})
	}
	halts(startPoller(t, dsn, brokers, pc, sc))
	await.State(t, settleTimeout, "the good rows to be marked processed", func() (bool, string) {
		var pending int
		if err := ob.Pool().QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND retry_after IS DISTINCT FROM 'infinity'").Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0, fmt.Sprintf("%d good rows still pending", pending)
	})

	second := startPoller(t, dsn, brokers, pc, sc)
	halts(second)
	// The halted batch ends (commits its marks) only once Kafka has settled every event it handed
	// over: after that, a wrong second publication is in the topic for a read to find.
	await.True(t, settleTimeout, "the second poller's halted batch to end", func() bool { return value(second.m.PollBatchDuration) >= 1 })
	c := harness.NewConsumer(brokers, harness.TopicFor(good))
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, deliverTimeout)
	defer cancel()
	if err := c.ReadUntil(rctx, 0, func(recs []harness.Record) bool { return len(recs) >= len(goodRows) }); err != nil {
		t.Fatal(err)
	}
	if rep := harness.Verify(goodRows, c.Records(), nil); rep.Missing > 0 || rep.Duplicates > 0 || rep.OrderViolations > 0 {
		t.Fatalf("good events: %s (want every one once, in order)", rep)
	}
}
