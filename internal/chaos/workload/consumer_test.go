package workload_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// producer writes records the way the relay does: key = aggregate id, header id = event id, a
// JSON payload with seq. Its record timestamps are from 2001, so a read that reports them instead
// of the broker's append time shows.
type producer struct {
	w    *kafka.Writer
	n    int
	sent map[string]sent // by event id
}

type sent struct {
	topic, key string
	seq        int
}

var producerTime = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)

func newProducer(t *testing.T, brokers string) *producer {
	w := &kafka.Writer{Addr: kafka.TCP(brokers), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, MaxAttempts: 20}
	t.Cleanup(func() { w.Close() })
	return &producer{w: w, sent: make(map[string]sent)}
}

func (p *producer) produce(ctx context.Context, t *testing.T, topics []string, n int) {
	t.Helper()
	var msgs []kafka.Message
	for range n {
		p.n++
		s := sent{topic: topics[p.n%len(topics)], key: fmt.Sprintf("заказ-%d", p.n%7), seq: p.n}
		id := fmt.Sprintf("event-%d", p.n)
		p.sent[id] = s
		msgs = append(msgs, kafka.Message{Topic: s.topic, Key: []byte(s.key), Time: producerTime,
			Value:   fmt.Appendf(nil, `{"aggregate": %q, "seq": %d}`, s.key, s.seq),
			Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}})
	}
	if err := p.w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func (p *producer) ids() map[string]bool {
	out := make(map[string]bool, len(p.sent))
	for id := range p.sent {
		out[id] = true
	}
	return out
}

// check compares reads with what p sent: every record once, as sent, with the broker's append
// time, and each partition's offsets read in order without a hole.
func (p *producer) check(t *testing.T, reads []history.Read, since time.Time) {
	t.Helper()
	seen := make(map[string]bool)
	next := make(map[string]int64)
	for _, r := range reads {
		s, ok := p.sent[r.EventID]
		switch {
		case !ok:
			t.Errorf("read %q, which was not sent", r.EventID)
		case seen[r.EventID]:
			t.Errorf("read %s twice", r.EventID)
		case r.Topic != s.topic || r.Key != s.key || r.Seq != s.seq:
			t.Errorf("read %s as %s/%q seq %d, sent %s/%q seq %d", r.EventID, r.Topic, r.Key, r.Seq, s.topic, s.key, s.seq)
		case r.Appended.Before(since) || r.Appended.After(time.Now()):
			t.Errorf("read %s appended at %v, want the broker's append time (after %v)", r.EventID, r.Appended, since)
		}
		seen[r.EventID] = true
		tp := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
		if r.Offset != next[tp] {
			t.Errorf("%s: read offset %d, want %d", tp, r.Offset, next[tp])
		}
		next[tp] = r.Offset + 1
	}
	if len(seen) != len(p.sent) {
		t.Errorf("read %d distinct events, sent %d", len(seen), len(p.sent))
	}
}

// TestConsumerReadsEveryRecordOnce starts consumers of both isolation levels before their topics
// exist, and checks that they read every record once, with the broker's append time.
func TestConsumerReadsEveryRecordOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := testenv.SharedKafka(t)
	topics := []string{testenv.UniqueName(t, "a"), testenv.UniqueName(t, "b")}
	since := time.Now().Add(-time.Second)
	var consumers []*workload.Consumer
	for _, iso := range []string{history.ReadCommitted, history.ReadUncommitted} {
		consumers = append(consumers, workload.StartConsumer(ctx, iso, k.Brokers(), iso, topics))
	}
	time.Sleep(300 * time.Millisecond) // the topics are missing for a while
	if err := workload.CreateTopics(ctx, k.Brokers(), topics, 2); err != nil {
		t.Fatal(err)
	}
	if err := workload.CreateTopics(ctx, k.Brokers(), topics, 2); err != nil {
		t.Fatalf("creating existing topics again: %v", err)
	}
	p := newProducer(t, k.Brokers())
	p.produce(ctx, t, topics, 200)
	p.produce(ctx, t, topics, 50)
	for _, c := range consumers {
		if err := c.Drain(ctx, p.ids(), 200*time.Millisecond, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		// An id that never comes: the drain gives up once nothing new was read for the stall
		// bound, long before ctx ends.
		never := map[string]bool{"never-written": true}
		started := time.Now()
		if err := c.Drain(ctx, never, 0, 500*time.Millisecond); err == nil || !strings.Contains(err.Error(), "nothing new for 500ms") {
			t.Errorf("Drain of an id never written = %v, want the stall error", err)
		} else if took := time.Since(started); took > 5*time.Second {
			t.Errorf("the stalled drain took %s", took)
		}
		if c.Delivered() != 250 {
			t.Errorf("Delivered() = %d, want 250", c.Delivered())
		}
		reads := c.Stop()
		if reads[0].Isolation == "" || reads[0].Consumer == "" {
			t.Errorf("read without consumer or isolation: %+v", reads[0])
		}
		p.check(t, reads, since)
	}
}

// TestConsumerSurvivesBrokerStopAndFreeze stops the broker under a reading consumer, then
// freezes it: the consumer resumes each partition where it was, reading nothing twice and
// skipping nothing.
func TestConsumerSurvivesBrokerStopAndFreeze(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := testenv.Kafka(t, devenv.KafkaOptions{})
	topics := []string{"outbox.event.a", "outbox.event.b"}
	if err := workload.CreateTopics(ctx, k.Brokers(), topics, 3); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Second)
	c := workload.StartConsumer(ctx, "c", k.Brokers(), history.ReadCommitted, topics)
	p := newProducer(t, k.Brokers())
	p.produce(ctx, t, topics, 100)
	if err := c.WaitFor(ctx, p.ids(), 0); err != nil {
		t.Fatal(err)
	}

	// failed waits until the consumer has failed n more times than before.
	failed := func(before, n int, what string) {
		t.Helper()
		await.State(t, time.Minute, what, func() (bool, string) {
			now, err := c.Failures()
			return now >= before+n, fmt.Sprintf("%d failures since, the last: %v", now-before, err)
		})
	}

	before, _ := c.Failures()
	if err := k.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	failed(before, 2, "the consumer to fail, and fail again on retrying, while the broker is down")
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	p.produce(ctx, t, topics, 100)
	if err := c.WaitFor(ctx, p.ids(), 0); err != nil {
		t.Fatal(err)
	}

	before, _ = c.Failures()
	if err := k.Pause(); err != nil {
		t.Fatal(err)
	}
	// The frozen broker answers nothing: the consumer must give its connection up (after
	// fetchIOSlack) rather than wait on it for ever.
	failed(before, 1, "the consumer to give up its connection to the frozen broker")
	if err := k.Resume(); err != nil {
		t.Fatal(err)
	}
	p.produce(ctx, t, topics, 100)
	if err := c.WaitFor(ctx, p.ids(), 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	p.check(t, c.Stop(), since)
}
