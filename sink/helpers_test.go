package sink_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// acker counts the events acknowledged to it, like a checkpoint transaction.
type acker struct {
	n     atomic.Int64
	total *atomic.Int64 // also counts here when set
}

func (a *acker) Ack(n int) {
	a.n.Add(int64(n))
	if a.total != nil {
		a.total.Add(int64(n))
	}
}

var lsn atomic.Uint64

// newEvent makes an event with a fresh LSN; a nil aggType makes a NULL aggregate type.
func newEvent(id string, aggType []byte, aggID, eventType string, payload []byte) *decoder.Event {
	return &decoder.Event{
		ID: []byte(id), AggregateType: aggType, AggregateID: []byte(aggID), EventType: []byte(eventType),
		Payload: payload, LSN: pglogrepl.LSN(0x16B0000 + lsn.Add(0x100)),
		Tx: decoder.TxInfo{Xid: 1, CommitLSN: pglogrepl.LSN(lsn.Load()), CommitTime: time.Now()},
	}
}

// testSink is a Sink with its registry and logs, closed at cleanup if the test did not.
type testSink struct {
	*sink.Sink
	reg       *prometheus.Registry
	logs      *observer.ObservedLogs
	closeOnce sync.Once
	closeErr  error
}

// newSink builds a Sink from cfg (Brokers filled in when empty). It does not call WaitReady.
func newSink(t *testing.T, brokers string, cfg sink.Config) *testSink {
	t.Helper()
	if len(cfg.Brokers) == 0 {
		cfg.Brokers = strings.Split(brokers, ",")
	}
	obs, logs := observer.New(zap.DebugLevel)
	log := zaptest.NewLogger(t).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, obs) }))
	reg := prometheus.NewRegistry()
	s, err := sink.New(cfg, log, metrics.New(reg))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testSink{Sink: s, reg: reg, logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = ts.close(ctx)
	})
	return ts
}

// readySink is newSink followed by WaitReady.
func readySink(t *testing.T, brokers string, cfg sink.Config) *testSink {
	t.Helper()
	s := newSink(t, brokers, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	return s
}

func (s *testSink) close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.Sink.Close(ctx) })
	return s.closeErr
}

// mustClose closes the sink and fails the test if anything was left unacknowledged.
func (s *testSink) mustClose(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func (s *testSink) publish(t *testing.T, ev *decoder.Event, a sink.Acker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Publish(ctx, ev, a); err != nil {
		t.Fatalf("Publish %s: %v", ev.ID, err)
	}
}

// metric sums the samples of a counter or gauge whose labels include the given ones.
func (s *testSink) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	families, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	samples:
		for _, m := range f.GetMetric() {
			have := make(map[string]string)
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue samples
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

// eventually waits until cond holds (internal/await), failing t after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	await.True(t, timeout, what, cond)
}

// readBack reads topics until want(records) holds, then a little longer for late duplicates.
func readBack(t *testing.T, brokers string, timeout time.Duration, want func([]harness.Record) bool, topics ...string) []harness.Record {
	t.Helper()
	return readWith(t, harness.NewConsumer(brokers, topics...), timeout, want, topics)
}

func readWith(t *testing.T, c *harness.Consumer, timeout time.Duration, want func([]harness.Record) bool, topics []string) []harness.Record {
	t.Helper()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.ReadUntil(ctx, 300*time.Millisecond, want); err != nil {
		t.Fatalf("reading %v back: %v", topics, err)
	}
	return c.Records()
}

func atLeast(n int) func([]harness.Record) bool {
	return func(rs []harness.Record) bool { return len(rs) >= n }
}

// createTopic creates a topic with the given configs and waits until every partition has a leader.
func createTopic(t *testing.T, brokers, topic string, partitions int, configs ...kafka.ConfigEntry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(brokers, ",")...)}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: configs,
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			led := true
			for _, p := range md.Topics[0].Partitions {
				led = led && p.Leader.Host != ""
			}
			if led {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s: partitions without leader: %v", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sent is what a test published, to compare with what Kafka holds.
type sent struct {
	mu     sync.Mutex
	events map[string]*sentEvent // by event id
	next   map[string]int        // next seq, by key
}

type sentEvent struct {
	ev      *decoder.Event
	seq     int // position among the events of its key
	acker   *acker
	headers map[string]string // expected on the record, beyond the fixed ones
}

func newSent() *sent { return &sent{events: make(map[string]*sentEvent), next: make(map[string]int)} }

// add records ev as published with the given acker; seq counts per key.
func (s *sent) add(ev *decoder.Event, a *acker, headers map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq := s.next[string(ev.AggregateID)]
	s.next[string(ev.AggregateID)]++
	s.events[string(ev.ID)] = &sentEvent{ev: ev, seq: seq, acker: a, headers: headers}
}

// remove forgets an event that was never handed to the sink; it must be the last one of its key.
func (s *sent) remove(ev *decoder.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.events, string(ev.ID))
	s.next[string(ev.AggregateID)]--
}

// verify checks that records (in topic, partition, offset order) hold every sent event at least
// once on topic, byte for byte, and that each key's events first appear in publish order. It
// returns the number of duplicate deliveries.
func (s *sent) verify(t *testing.T, topic string, records []harness.Record) (duplicates int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string]int)
	lastSeq := make(map[string]int) // by key
	keyPartition := make(map[string]int)
	var problems []string
	note := func(format string, args ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	for _, r := range records {
		id := r.Header("id")
		e, ok := s.events[id]
		if !ok {
			note("record %s/%d@%d has unknown id %q", r.Topic, r.Partition, r.Offset, id)
			continue
		}
		seen[id]++
		if seen[id] > 1 {
			duplicates++
			continue
		}
		key := string(e.ev.AggregateID)
		if r.Topic != topic {
			note("event %s on topic %s, want %s", id, r.Topic, topic)
		}
		if string(r.Key) != key {
			note("event %s has key %q, want %q", id, r.Key, key)
		}
		if string(r.Value) != string(e.ev.Payload) {
			note("event %s: value differs (%d bytes, want %d)", id, len(r.Value), len(e.ev.Payload))
		}
		want := map[string]string{"id": id, "event_type": string(e.ev.EventType), "aggregate_type": string(e.ev.AggregateType)}
		for k, v := range e.headers {
			want[k] = v
		}
		for k, v := range want {
			if got, ok := r.Headers[k]; !ok || got != v {
				note("event %s: header %s = %q (present %v), want %q", id, k, got, ok, v)
			}
		}
		if len(r.Headers) != len(want) {
			note("event %s: headers %v, want %v", id, r.Headers, want)
		}
		if p, ok := keyPartition[key]; ok && p != r.Partition {
			note("key %q on partitions %d and %d", key, p, r.Partition)
		}
		keyPartition[key] = r.Partition
		if last, ok := lastSeq[key]; ok && e.seq <= last {
			note("key %q: event seq %d (%s) after seq %d", key, e.seq, id, last)
		} else if !ok && e.seq != 0 {
			note("key %q: first record is seq %d (%s)", key, e.seq, id)
		}
		lastSeq[key] = e.seq
	}
	var missing []string
	for id := range s.events {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		note("%d events missing, e.g. %v", len(missing), missing[:min(5, len(missing))])
	}
	if len(problems) > 0 {
		t.Fatalf("%d records for %d events:\n  %s", len(records), len(s.events), strings.Join(problems, "\n  "))
	}
	return duplicates
}

// checkAcked fails unless every sent event's acker got exactly its events.
func (s *sent) checkAcked(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	want := make(map[*acker]int64)
	for _, e := range s.events {
		want[e.acker]++
	}
	bad := 0
	for a, n := range want {
		if got := a.n.Load(); got != n {
			if bad++; bad <= 5 {
				t.Errorf("an acker got %d acks for %d events", got, n)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d ackers got the wrong count", bad, len(want))
	}
}
