package producer_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"slices"
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

// stallingDialer dials Kafka directly, but the first `stalls` connections that carry a produce
// request go silent once the request is out: the broker gets it and writes the records, the
// answer never arrives, and the client's request times out. That is the request the idempotent
// producer must not write twice when it retries.
type stallingDialer struct {
	stalls  atomic.Int32 // produce requests still to stall
	stalled atomic.Int32 // produce requests stalled
}

func (d *stallingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &stallingConn{Conn: c, d: d}, nil
}

type stallingConn struct {
	net.Conn
	d *stallingDialer

	mu    sync.Mutex
	left  int // bytes of the current request frame still to come
	stall bool
}

// Write follows the request frames (size, then api key) and stalls the connection after the
// first produce request it is chosen for.
func (c *stallingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	for rest := b; len(rest) > 0; {
		if c.left == 0 {
			if len(rest) < 6 {
				break // kafka-go writes a request's head in one piece
			}
			c.left = 4 + int(binary.BigEndian.Uint32(rest))
			if apiKey := binary.BigEndian.Uint16(rest[4:]); apiKey == 0 && !c.stall && c.d.stalls.Add(-1) >= 0 {
				c.stall = true
				c.d.stalled.Add(1)
			}
		}
		n := min(c.left, len(rest))
		c.left -= n
		rest = rest[n:]
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// Read drops everything the broker answers on a stalled connection, until the client's deadline
// ends the read.
func (c *stallingConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		c.mu.Lock()
		stall := c.stall
		c.mu.Unlock()
		if !stall || err != nil {
			return n, err
		}
	}
}

// TestIdempotenceKeepsOneCopyOfARequestTheBrokerWroteButNeverAnswered stalls produce
// connections after the request went out, so the broker writes the records and the producer
// retries them after its request timeout. With idempotence the broker recognises the retries;
// without, each is a duplicate, which shows the test can tell. Either way every record is
// acknowledged once, and each key's records first appear in Kafka in the order handed over.
func TestIdempotenceKeepsOneCopyOfARequestTheBrokerWroteButNeverAnswered(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	tests := []struct {
		name        string
		idempotence producer.Idempotence
		duplicates  bool
	}{
		{"with idempotence the broker keeps one copy", producer.IdempotenceAuto, false},
		{"without idempotence every stalled request is written again", producer.IdempotenceOff, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			topic := testenv.UniqueName(t, "stall")
			if err := k.CreateTopic(context.Background(), topic, 3); err != nil {
				t.Fatal(err)
			}
			d := &stallingDialer{}
			d.stalls.Store(3)
			const timeout = 2 * time.Second
			client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: timeout, Transport: &kafka.Transport{Dial: d.dial}}
			t.Cleanup(client.Transport.(*kafka.Transport).CloseIdleConnections)
			log := zaptest.NewLogger(t)
			var mu sync.Mutex
			acked := map[string]int{}
			var refused atomic.Value
			var sent atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			p := producer.New(ctx, producer.Config{
				Client: client, MaxBytes: 1 << 20, MaxRecords: 500, Linger: 15 * time.Millisecond, Timeout: timeout,
				Identity: producer.NewIdentity(client, log, tt.idempotence, "", 0), Log: log,
				Done: func(batch []*producer.Record, err error) {
					if err != nil {
						refused.Store(fmt.Errorf("a batch of %s was refused: %w", batch[0].Msg.Topic, err))
						return
					}
					mu.Lock()
					for _, rec := range batch {
						acked[string(rec.Msg.Value)]++
					}
					mu.Unlock()
				},
				Retrying: func(string, int, int, error, time.Duration) {},
				Sent:     func(records int) { sent.Add(int64(records)) },
				StopAt:   func() uint64 { return math.MaxUint64 },
				Failed:   func(err error) { t.Errorf("the producer failed: %v", err) },
			})
			t.Cleanup(func() { cancel(); p.Close() })

			const n, keys = 300, 12
			want := map[string][]string{} // by key, the values in the order handed over
			for i := range n {
				key := fmt.Sprintf("order-%d", i%keys)
				value := fmt.Sprintf("s-%04d", i)
				want[key] = append(want[key], value)
				rec := &producer.Record{Msg: kafka.Message{Topic: topic, Key: []byte(key), Value: []byte(value), Time: time.Now()},
					Partition: -1, Seq: uint64(i + 1), Enqueued: time.Now()}
				rec.Size = int64(producer.RecordSize(&rec.Msg))
				if err := p.Enqueue(ctx, rec); err != nil {
					t.Fatal(err)
				}
				if i%50 == 0 {
					// Several requests, so later ones follow a stalled one: what was handed over
					// goes out before more follows.
					await.True(t, 30*time.Second, "the records handed over sent", func() bool { return sent.Load() >= int64(i+1) })
				}
			}
			await.State(t, 90*time.Second, "every record acknowledged", func() (bool, string) {
				if err, _ := refused.Load().(error); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				defer mu.Unlock()
				return len(acked) == n, fmt.Sprintf("%d of %d", len(acked), n)
			})
			p.Close()
			for value, times := range acked {
				if times != 1 {
					t.Errorf("%s acknowledged %d times", value, times)
				}
			}
			if got := d.stalled.Load(); got != 3 {
				t.Fatalf("%d produce requests stalled, want 3: the test did not test", got)
			}
			consumer := harness.NewConsumer(k.Brokers(), topic)
			defer consumer.Close()
			rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer rcancel()
			if err := consumer.ReadUntil(rctx, 300*time.Millisecond, func(rs []harness.Record) bool { return len(rs) >= n }); err != nil {
				t.Fatal(err)
			}
			dups := firstCopiesInOrder(t, consumer.Records(), want)
			t.Logf("%d duplicate deliveries", dups)
			if tt.duplicates && dups == 0 {
				t.Error("no duplicates without idempotence: the stall did not make the broker write a request twice")
			}
			if !tt.duplicates && dups != 0 {
				t.Errorf("%d duplicates with idempotence", dups)
			}
		})
	}
}

// firstCopiesInOrder checks that records (in topic, partition, offset order) hold every value of
// want at least once, each key in one partition, and that each key's values first appear in the
// order of want; it returns the number of duplicate deliveries.
func firstCopiesInOrder(t *testing.T, records []harness.Record, want map[string][]string) (duplicates int) {
	t.Helper()
	next := map[string]int{}      // by key: how many of its values appeared
	partition := map[string]int{} // by key
	for _, r := range records {
		key, value := string(r.Key), string(r.Value)
		if p, ok := partition[key]; ok && p != r.Partition {
			t.Errorf("%s in partitions %d and %d", key, p, r.Partition)
		}
		partition[key] = r.Partition
		values := want[key]
		switch i := next[key]; {
		case i < len(values) && values[i] == value:
			next[key]++
		case slices.Contains(values[:i], value):
			duplicates++
		default:
			t.Fatalf("%s/%d offset %d holds %s of %s, want %s next: a record lost, unknown or out of order",
				r.Topic, r.Partition, r.Offset, value, key, nextOf(values, i))
		}
	}
	for key, values := range want {
		if next[key] != len(values) {
			t.Errorf("%s: %d of its %d records read", key, next[key], len(values))
		}
	}
	return duplicates
}

func nextOf(values []string, i int) string {
	if i < len(values) {
		return values[i]
	}
	return "nothing more"
}
