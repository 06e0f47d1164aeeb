package sink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink/positions"
	"github.com/outbox-relay/outbox-relay/sink/readcommitted"
)

// countingConn counts the bytes read from the broker.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestReadingAnAbsentPositionReadsThePartitionOnce: a relay's first start looks for a key that is
// not there, so it reads the positions partition back to its start. Other relays' positions fill
// it (one record per Kafka transaction, compacted only once a segment closes): that read must cost
// about what the partition holds, not a full fetch per backward chunk (which made a first start
// read, and hold, hundreds of MB).
func TestReadingAnAbsentPositionReadsThePartitionOnce(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.UniqueName(t, "positions")
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second}
	if _, _, err := positions.Partition(ctx, client, topic, "x", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	w := &kafka.Writer{Addr: kafka.TCP(k.Brokers()), Topic: topic, BatchSize: 20, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "other-relay-%d", i%7), Value: fmt.Appendf(nil, `{"v":1,"commit_lsn":"0/%X","events":%d}`, 1<<24+i, i%100)}
	}
	// The topic was created moments ago: its partition may not have a leader yet.
	await.NoError(t, 30*time.Second, "the other relays' positions written", func() error { return w.WriteMessages(ctx, msgs...) })
	w.Close()

	var read atomic.Int64
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	counting := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second, Transport: &kafka.Transport{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{Conn: c, n: &read}, nil
		},
	}}
	// What the partition holds: read forwards once.
	for at := int64(0); at < n; {
		res, err := readcommitted.Fetch(ctx, counting, topic, 0, at, 1<<20, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		at = res.Next
	}
	size := read.Swap(0)

	start := time.Now()
	if pos, _, ok, err := positions.Read(ctx, counting, topic, "a-new-relay", time.Minute, zap.NewNop()); ok || err != nil {
		t.Fatalf("positions.Read of a key never written = %v %v %v", pos, ok, err)
	}
	t.Logf("read %d KB in %s for a partition of %d records, about %d KB", read.Load()>>10, time.Since(start).Round(time.Millisecond), n, size>>10)
	if read.Load() > 3*size {
		t.Errorf("reading the partition back to its start took %d KB from the broker; it holds about %d KB", read.Load()>>10, size>>10)
	}
}

// failingCreates fails the first writes of CreateTopics requests (API key 19), as a broker
// connection lost or a request timed out while the topic was being created would.
type failingCreates struct {
	net.Conn
	left *atomic.Int32
}

func (c failingCreates) Write(p []byte) (int, error) {
	if len(p) >= 6 && binary.BigEndian.Uint16(p[4:6]) == 19 && c.left.Add(-1) >= 0 {
		c.Conn.Close()
		return 0, errors.New("injected: connection lost while creating the topic")
	}
	return c.Conn.Write(p)
}

// TestACreationOfThePositionsTopicThatFailsForNowIsRetried: an exactly-once start creates the
// positions topic when it is missing. A creation that fails for a reason that passes (the
// connection, a timeout, the controller moving) is tried again; it used to end the start with
// "creating it failed", as if an operator had to act. Refusals that need one (ACLs, policies) stay
// final (positions.TestOnlyACreationThatMayWorkLaterIsRetried).
func TestACreationOfThePositionsTopicThatFailsForNowIsRetried(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := testenv.UniqueName(t, "positions")
	var left atomic.Int32
	left.Store(2)
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second, Transport: &kafka.Transport{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return failingCreates{Conn: c, left: &left}, nil
		},
	}}
	if _, created, err := positions.Partition(ctx, client, topic, "x", zap.NewNop()); err != nil || !created {
		t.Fatalf("positions.Partition = created %v, %v; want the topic created after the failures", created, err)
	}
	if left.Load() >= 0 {
		t.Fatalf("%d injected failures left: the creation was never refused", left.Load()+1)
	}
}
