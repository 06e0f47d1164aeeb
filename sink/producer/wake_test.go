package producer_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/producer"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestRecordsQueuedBehindALingeringBatchGoWhenTheirTriggerComes: a push wakes the partition's
// goroutine only when its decision changes, so every other way a queued record becomes due must
// still reach the goroutine while it sleeps on a batch's linger (here a minute, far longer than
// the test may take): the batch's count or bytes filled by records queued behind the first, a
// flush or a close reaching them, and records queued behind a batch being retried after a
// retriable error. A lost wake-up shows as a record not answered within 20 s.
func TestRecordsQueuedBehindALingeringBatchGoWhenTheirTriggerComes(t *testing.T) {
	const linger = time.Minute
	size := recordSize("r-00")
	tests := []struct {
		name       string
		maxRecords int
		maxBytes   int
		records    int
		refuse     int // produce requests refused with a retriable error first
		then       func(p *producer.Producer, last uint64)
	}{
		{"records that fill the batch's count go at once", 4, 1 << 20, 8, 0, nil},
		{"records that fill the batch's bytes go at once", 500, 3 * size, 6, 0, nil},
		{"a flush sends the records queued behind the lingering one", 500, 1 << 20, 5, 0,
			func(p *producer.Producer, last uint64) { p.Flush(last) }},
		{"a close sends the records queued behind the lingering one", 500, 1 << 20, 5, 0,
			func(p *producer.Producer, _ uint64) { p.Close() }},
		{"records queued behind a batch being retried go after it once they fill a batch", 3, 1 << 20, 9, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := fakebroker.New(t)
			fb.SetIdempotent(true, 0)
			if tt.refuse > 0 {
				fb.Script(tt.refuse, 0, 0, kafka.NotLeaderForPartition)
			}
			log := zaptest.NewLogger(t)
			client := &kafka.Client{Addr: kafka.TCP(fb.Addr()), Timeout: 20 * time.Second, Transport: &kafka.Transport{}}
			settled := make(chan error, tt.records)
			ctx, cancel := context.WithCancel(context.Background())
			p := producer.New(ctx, producer.Config{
				Client: client, MaxBytes: tt.maxBytes, MaxRecords: tt.maxRecords, Linger: linger, Timeout: 20 * time.Second,
				AutoCreateTopics: true, Identity: producer.NewIdentity(client, log, producer.IdempotenceOn, "", 0), Log: log,
				Done: func(batch []*producer.Record, err error) {
					for range batch {
						settled <- err
					}
				},
				Retrying: func(topic string, _, _ int, err error, _ time.Duration) { t.Logf("retrying %s: %v", topic, err) },
				Sent:     func(int) {},
				StopAt:   func() uint64 { return math.MaxUint64 },
				Failed:   func(err error) { t.Errorf("the producer failed: %v", err) },
			})
			closed := false
			t.Cleanup(func() {
				cancel()
				if !closed {
					p.Close()
				}
			})
			for i := range tt.records {
				rec := &producer.Record{Msg: kafka.Message{Topic: "events", Key: []byte("order-1"), Value: []byte(`{}`),
					Headers: []kafka.Header{{Key: record.HeaderID, Value: fmt.Appendf(nil, "r-%02d", i)}}},
					Partition: -1, Seq: uint64(i + 1), Enqueued: time.Now()}
				rec.Size = int64(producer.RecordSize(&rec.Msg))
				if err := p.Enqueue(ctx, rec); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					// The rest are pushed while the goroutine sleeps on the first one's linger.
					await.State(t, 10*time.Second, "the first record lingers", func() (bool, string) {
						return p.Lingering(producer.TopicPartition{Topic: "events", Partition: 0}), ""
					})
				}
			}
			if tt.then != nil {
				tt.then(p, uint64(tt.records))
				closed = tt.name == "a close sends the records queued behind the lingering one"
			}
			deadline := time.After(20 * time.Second)
			for i := range tt.records {
				select {
				case err := <-settled:
					if err != nil {
						t.Fatalf("record %d refused: %v", i, err)
					}
				case <-deadline:
					t.Fatalf("%d of %d records answered within 20 s, with a linger of %v: a queued record's wake-up was lost", i, tt.records, linger)
				}
			}
		})
	}
}

// recordSize is the size a test record with id counts for in a batch.
func recordSize(id string) int {
	msg := kafka.Message{Topic: "events", Key: []byte("order-1"), Value: []byte(`{}`),
		Headers: []kafka.Header{{Key: record.HeaderID, Value: []byte(id)}}}
	return producer.RecordSize(&msg)
}
