package sink_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/record"
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
// connections after the request went out, so the broker writes the records and the sink retries
// them after its write timeout. With idempotence the broker recognises the retries; without, each
// is a duplicate, which shows the test can tell.
func TestIdempotenceKeepsOneCopyOfARequestTheBrokerWroteButNeverAnswered(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	tests := []struct {
		name        string
		idempotence sink.Idempotence
		duplicates  bool
	}{
		{"with idempotence the broker keeps one copy", sink.IdempotenceAuto, false},
		{"without idempotence every stalled request is written again", sink.IdempotenceOff, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			topic := testenv.UniqueName(t, "stall")
			if err := k.CreateTopic(context.Background(), topic, 3); err != nil {
				t.Fatal(err)
			}
			s := newSink(t, k.Brokers(), sink.Config{
				Record: record.Options{TopicTemplate: topic}, DeadLetterTopic: testenv.UniqueName(t, "dlq"),
				WriteTimeout: 2 * time.Second, Idempotence: tt.idempotence,
			})
			d := &stallingDialer{}
			d.stalls.Store(3)
			sink.SetDialer(s.Sink, d.dial)
			log := newSent()
			const n = 300
			for i := range n {
				ev := newEvent(fmt.Sprintf("s-%04d", i), []byte("Order"), fmt.Sprintf("order-%d", i%12), "Changed", fmt.Appendf(nil, `{"i":%d}`, i))
				a := &acker{}
				log.add(ev, a, nil)
				s.publish(t, ev, a)
				if i%50 == 0 {
					time.Sleep(20 * time.Millisecond) // several requests, so later ones follow a stalled one
				}
			}
			eventually(t, 90*time.Second, "every event acknowledged", func() bool {
				events, _ := s.InFlight()
				return events == 0
			})
			s.mustClose(t)
			log.checkAcked(t)
			if got := d.stalled.Load(); got != 3 {
				t.Fatalf("%d produce requests stalled, want 3: the test did not test", got)
			}
			records := readBack(t, k.Brokers(), 60*time.Second, atLeast(n), topic)
			dups := log.verify(t, topic, records)
			t.Logf("%d duplicate deliveries, %v retries", dups, s.metric(t, "outbox_relay_kafka_retries_total"))
			if tt.duplicates && dups == 0 {
				t.Error("no duplicates without idempotence: the stall did not make the broker write a request twice")
			}
			if !tt.duplicates && dups != 0 {
				t.Errorf("%d duplicates with idempotence", dups)
			}
		})
	}
}

// readCommitted reads topics like a read_committed consumer until want holds, then a little
// longer for late duplicates.
func readCommitted(t *testing.T, brokers string, timeout time.Duration, want func([]harness.Record) bool, topics ...string) []harness.Record {
	t.Helper()
	return readWith(t, harness.NewCommittedConsumer(brokers, topics...), timeout, want, topics)
}

// TestABrokerThatDeniesIdempotenceIsAWarningUnlessItIsRequired: kafka.idempotence auto publishes
// without it and says so; on refuses to start, naming the key.
func TestABrokerThatDeniesIdempotenceIsAWarningUnlessItIsRequired(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		offered    bool        // the broker offers InitProducerId
		code       kafka.Error // and answers it with
		mode       sink.Idempotence
		startError bool
	}{
		{"auto, IDEMPOTENT_WRITE denied: published without, with a warning", true, kafka.ClusterAuthorizationFailed, sink.IdempotenceAuto, false},
		{"auto, a broker without InitProducerId: published without, with a warning", false, 0, sink.IdempotenceAuto, false},
		{"on, IDEMPOTENT_WRITE denied: a start error naming kafka.idempotence", true, kafka.ClusterAuthorizationFailed, sink.IdempotenceOn, true},
		{"on, a broker without InitProducerId: a start error", false, 0, sink.IdempotenceOn, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := fakebroker.New(t)
			fb.SetIdempotent(tt.offered, tt.code)
			s := newSink(t, "", sink.Config{Brokers: []string{fb.Addr()}, Record: record.Options{TopicTemplate: "events"}, DeadLetterTopic: "dlq",
				Linger: -1, WriteTimeout: 5 * time.Second, Idempotence: tt.mode})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := s.WaitReady(ctx)
			if tt.startError {
				if err == nil || !strings.Contains(err.Error(), "kafka.idempotence") {
					t.Fatalf("WaitReady = %v, want an error naming kafka.idempotence", err)
				}
				select {
				case <-s.Failed():
				default:
					t.Error("Failed did not close")
				}
				if perr := s.Publish(ctx, newEvent("e0", []byte("Order"), "order-1", "Changed", []byte(`{}`)), &acker{}); perr == nil {
					t.Error("Publish accepted an event after the start error")
				}
				return
			}
			if err != nil {
				t.Fatalf("WaitReady: %v", err)
			}
			if s.logs.FilterMessageSnippet("refuse the idempotent producer").Len() != 1 {
				t.Error("no warning says the producer runs without idempotence")
			}
			a := &acker{}
			s.publish(t, newEvent("e0", []byte("Order"), "order-1", "Changed", []byte(`{}`)), a)
			eventually(t, 30*time.Second, "the event acknowledged", func() bool { return a.n.Load() == 1 })
			s.mustClose(t)
			for _, b := range fb.Batches() {
				if b.ProducerID != -1 || b.Seq != -1 {
					t.Errorf("batch %v carries a producer id", b)
				}
			}
		})
	}
}
