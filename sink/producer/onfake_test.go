package producer_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/producer"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// onFake is an idempotent producer on a fake broker, with the answers it gave and the topics it
// retried.
type onFake struct {
	p   *producer.Producer
	seq uint64

	mu      sync.Mutex
	answers map[string]error // by record id: nil acknowledged, else the refusal
	retried map[string]bool  // topics
	settled chan struct{}    // a token per record answered
}

// newOnFake returns a producer on fb whose batches wait linger for more records (-1: none), and
// whose requests time out after timeout.
func newOnFake(t *testing.T, fb *fakebroker.Broker, linger, timeout time.Duration) *onFake {
	t.Helper()
	return newOnFakeVia(t, fb, linger, timeout, &kafka.Transport{}, producer.IdempotenceOn, zaptest.NewLogger(t))
}

// newOnFakeVia is newOnFake whose client goes through transport (SASL, for one), with
// idempotence as given, logging to log.
func newOnFakeVia(t *testing.T, fb *fakebroker.Broker, linger, timeout time.Duration, transport *kafka.Transport, idempotence producer.Idempotence, log *zap.Logger) *onFake {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(fb.Addr()), Timeout: timeout, Transport: transport}
	f := &onFake{answers: map[string]error{}, retried: map[string]bool{}, settled: make(chan struct{}, 100)}
	ctx, cancel := context.WithCancel(context.Background())
	f.p = producer.New(ctx, producer.Config{
		Client: client, MaxBytes: 1 << 20, MaxRecords: 500, Linger: linger, Timeout: timeout, AutoCreateTopics: true,
		Identity: producer.NewIdentity(client, log, idempotence, "", 0), Log: log,
		Done: func(batch []*producer.Record, err error) {
			f.mu.Lock()
			for _, rec := range batch {
				f.answers[string(rec.Msg.Headers[0].Value)] = err
			}
			f.mu.Unlock()
			for range batch {
				f.settled <- struct{}{}
			}
		},
		Retrying: func(topic string, _, _ int, _ error, _ time.Duration) {
			f.mu.Lock()
			f.retried[topic] = true
			f.mu.Unlock()
		},
		Sent:   func(int) {},
		StopAt: func() uint64 { return math.MaxUint64 },
		Failed: func(err error) { t.Errorf("the producer failed: %v", err) },
	})
	t.Cleanup(func() {
		cancel() // a record never acknowledged would keep Close waiting
		f.p.Close()
	})
	return f
}

// enqueue hands over the record id of key order-1 to topic.
func (f *onFake) enqueue(t *testing.T, topic, id string) {
	t.Helper()
	f.seq++
	rec := &producer.Record{Msg: kafka.Message{Topic: topic, Key: []byte("order-1"), Value: []byte(`{}`),
		Headers: []kafka.Header{{Key: record.HeaderID, Value: []byte(id)}}}, Partition: -1, Seq: f.seq, Enqueued: time.Now()}
	rec.Size = int64(producer.RecordSize(&rec.Msg))
	if err := f.p.Enqueue(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

// wait waits until n more records are answered.
func (f *onFake) wait(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for range n {
		select {
		case <-f.settled:
		case <-deadline:
			t.Fatalf("a record was not answered within 30 s")
		}
	}
}

// sawFor is what the broker was sent for topic, batch by batch.
func sawFor(fb *fakebroker.Broker, topic string) []string {
	var got []string
	for _, b := range fb.Batches() {
		if b.Topic == topic {
			got = append(got, b.String())
		}
	}
	return got
}

// stored waits until the broker stored every one of ids ("topic/id").
func stored(t *testing.T, fb *fakebroker.Broker, ids ...string) {
	t.Helper()
	await.State(t, 30*time.Second, fmt.Sprintf("the broker stored %v", ids), func() (bool, string) {
		got, _ := fb.State()
		return !slices.ContainsFunc(ids, func(id string) bool { return !slices.Contains(got, id) }), fmt.Sprint(got)
	})
}

// retriedTopic reports whether a batch of topic was retried.
func (f *onFake) retriedTopic(topic string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.retried[topic]
}
