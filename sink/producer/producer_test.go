package producer_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// TestRecordsReachKafkaOnceAndInOrder uses the producer on its own against the real broker, as a
// project other than the relay would: records of twelve keys on each of four topics of three
// partitions (every partition gets some) are handed over in rounds, with a linger long enough for
// each round's batches to share requests; every one is acknowledged once, a reader finds each
// key's records once, in one partition, in the order they were handed over, and the requests
// prove the batches travelled together. Transactional: the same through a Committer whose owner
// adds nothing to its transactions, read as read_committed, every batch handed back only once its
// transaction committed.
func TestRecordsReachKafkaOnceAndInOrder(t *testing.T) {
	t.Parallel()
	for _, transactional := range []bool{false, true} {
		name := "idempotent"
		if transactional {
			name = "transactional"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := testenv.SharedKafka(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			prefix := testenv.UniqueName(t, "p")
			topics := []string{prefix + ".a", prefix + ".b", prefix + ".c", prefix + ".d"}
			for _, topic := range topics {
				if err := k.CreateTopic(ctx, topic, 3); err != nil {
					t.Fatal(err)
				}
			}
			client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second}
			log := zaptest.NewLogger(t)
			var txnID string
			if transactional {
				txnID = testenv.UniqueName(t, "txn")
			}
			ident := producer.NewIdentity(client, log, producer.IdempotenceOn, txnID, time.Minute)

			var mu sync.Mutex
			acked := map[string]int{}
			var failed atomic.Value
			var requests, sent atomic.Int64
			done := func(batch []*producer.Record, err error) {
				if err != nil {
					failed.Store(fmt.Errorf("a batch of %s was refused: %w", batch[0].Msg.Topic, err))
					return
				}
				mu.Lock()
				for _, rec := range batch {
					acked[string(rec.Msg.Value)]++
				}
				mu.Unlock()
			}
			cfg := producer.Config{
				Client: client, MaxBytes: 1 << 20, MaxRecords: 50, Linger: 50 * time.Millisecond, Timeout: 10 * time.Second,
				Identity: ident, Log: log, Done: done,
				Retrying: func(string, int, int, error, time.Duration) {},
				Sent:     func(records int) { requests.Add(1); sent.Add(int64(records)) },
				StopAt:   func() uint64 { return math.MaxUint64 },
				Failed:   func(err error) { failed.Store(err) },
			}
			pctx, stop := context.WithCancel(context.Background())
			defer stop()
			var c *producer.Committer
			if transactional {
				o := &owner{}
				c = producer.NewCommitter(producer.CommitterConfig{
					Client: client, ID: txnID, Identity: ident, Timeout: 10 * time.Second,
					MaxRecords: 200, Linger: 200 * time.Millisecond, Owner: o, Log: log,
				})
				cfg.Transactions, cfg.TransactionalID = c, txnID
				committed := func(batch []*producer.Record) { done(batch, nil) }
				cfg.Done = func(batch []*producer.Record, err error) {
					if err != nil {
						done(batch, err)
						return
					}
					c.Written(batch, committed)
				}
				defer func() {
					if err := o.stopped.Load(); err != nil {
						t.Errorf("the committer stopped: %v", err)
					}
				}()
			}
			p := producer.New(pctx, cfg)
			if c != nil {
				c.Producers(p)
				go c.Run(pctx)
			}

			const keys, rounds = 4 * 12, 25 // twelve a topic
			var seq uint64
			for round := range rounds {
				for key := range keys {
					seq++
					rec := &producer.Record{
						Msg: kafka.Message{Topic: topics[key%4], Key: fmt.Appendf(nil, "k%02d", key),
							Value: fmt.Appendf(nil, "k%02d-%03d", key, round), Time: time.Now()},
						Partition: -1, Seq: seq, Enqueued: time.Now(),
					}
					rec.Size = int64(producer.RecordSize(&rec.Msg))
					if c != nil {
						c.Join(rec)
					}
					if err := p.Enqueue(ctx, rec); err != nil {
						t.Fatal(err)
					}
				}
				// The round is sent before the next begins: rounds in batches and transactions of
				// their own.
				await.True(t, time.Minute, "the round sent", func() bool { return sent.Load() >= int64(seq) })
			}
			if c != nil {
				if err := c.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for {
				mu.Lock()
				n := len(acked)
				mu.Unlock()
				if err, _ := failed.Load().(error); err != nil {
					t.Fatal(err)
				}
				if n == keys*rounds {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("%d of %d records acknowledged", n, keys*rounds)
				case <-time.After(20 * time.Millisecond):
				}
			}
			p.Close()
			stop()
			if c != nil {
				<-c.Done()
			}
			for value, n := range acked {
				if n != 1 {
					t.Errorf("%s acknowledged %d times", value, n)
				}
			}
			// Each round fills twelve partitions of one broker; one request per partition would be
			// at least twelve requests a round.
			if limit := int64(rounds * 12 * 3 / 4); requests.Load() > limit {
				t.Errorf("%d produce requests for %d rounds of twelve partitions: more than %d, so batches did not share requests", requests.Load(), rounds, limit)
			}
			t.Logf("%d produce requests for %d rounds of twelve partitions", requests.Load(), rounds)

			consumer := harness.NewConsumer(k.Brokers(), topics...)
			if transactional {
				consumer = harness.NewCommittedConsumer(k.Brokers(), topics...)
			}
			defer consumer.Close()
			if err := consumer.ReadUntil(ctx, 300*time.Millisecond, func(rs []harness.Record) bool { return len(rs) >= keys*rounds }); err != nil {
				t.Fatal(err)
			}
			next := map[string]int{}      // by key: the round read next
			partition := map[string]int{} // by key
			for _, r := range consumer.Records() {
				key := string(r.Key)
				if p, ok := partition[key]; ok && p != r.Partition {
					t.Errorf("%s in partitions %d and %d", key, p, r.Partition)
				}
				partition[key] = r.Partition
				if want := fmt.Appendf(nil, "%s-%03d", key, next[key]); !bytes.Equal(r.Value, want) {
					t.Fatalf("%s/%d offset %d holds %s, want %s: a record lost, repeated or out of order", r.Topic, r.Partition, r.Offset, r.Value, want)
				}
				next[key]++
			}
			for key := range keys {
				if n := next[fmt.Sprintf("k%02d", key)]; n != rounds {
					t.Errorf("k%02d: %d records read, want %d", key, n, rounds)
				}
			}
		})
	}
}

// owner is a Committer's owner that adds nothing to the transactions and never halts.
type owner struct{ stopped atomic.Value }

func (*owner) Halted() (uint64, bool)                     { return 0, false }
func (*owner) Companion() (producer.TopicPartition, bool) { return producer.TopicPartition{}, false }
func (*owner) Committed(*producer.Record)                 {}
func (*owner) Count(string)                               {}
func (o *owner) Stopped(err error, _ bool)                { o.stopped.Store(err) }
func (*owner) BeforeCommit(context.Context, *producer.Record, map[producer.TopicPartition]producer.Span) (producer.TopicPartition, int64, error) {
	return producer.TopicPartition{}, -1, nil
}
