package relay

import (
	"bytes"
	"context"
	"encoding/hex"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestTheSinkCountsTheRowMemoryEachEventHolds: a decoded event aliases its whole pgoutput message
// until Kafka acknowledges it, so max_in_flight_bytes must count that message (plus any copy made
// on the way), not only the record's key, value and headers. Kafka never acknowledges here (the
// topic wants more in-sync replicas than it has), so what the sink counts stays put.
func TestTheSinkCountsTheRowMemoryEachEventHolds(t *testing.T) {
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "mem")
	createStuckTopic(t, k.Brokers(), "outbox.event."+aggType)
	big := strings.Repeat("x", 256<<10)
	blob := hex.EncodeToString(bytes.Repeat([]byte{0xab}, 256<<10))
	withBlob := append(append([]column{}, outboxColumns...), column{"blob", 25})
	byteaPayload := append([]column{}, outboxColumns...)
	byteaPayload[4].typ = 17

	for _, tc := range []struct {
		name     string
		cols     []column
		insert   []byte
		encoding record.Encoding
		atLeast  func(msg []byte) int64
	}{
		{"a large column the relay does not map", withBlob, event(aggType, 1, `{}`, big), record.Raw,
			func(msg []byte) int64 { return int64(len(msg)) }},
		{"a large payload sent as it is", outboxColumns, event(aggType, 2, `"`+big+`"`), record.Raw,
			func(msg []byte) int64 { return int64(len(msg)) }},
		{"a large payload encoded as a JSON string (a copy)", outboxColumns, event(aggType, 3, `"`+big+`"`), record.JSONString,
			func(msg []byte) int64 { return int64(len(msg)) + int64(len(big)) }},
		{"a bytea payload (hex text, and the decoded copy)", byteaPayload, event(aggType, 4, `\x`+blob), record.Raw,
			func(msg []byte) int64 { return int64(len(msg)) + int64(len(blob)/2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, reg := newTestWAL(t, Config{Sink: sink.Config{Brokers: []string{k.Brokers()}, Record: record.Options{ValueEncoding: tc.encoding}}})
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				r.sink.Close(ctx) // the record is never acknowledged: abandon it
			}()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := r.pipeline(ctx, ctx, feed(relationMessage(tc.cols), beginMessage(100), tc.insert)); err != nil {
				t.Fatal(err)
			}
			events, held := r.sink.InFlight()
			if want := tc.atLeast(tc.insert); events != 1 || held < want {
				t.Fatalf("the sink counts %d events of %d bytes in flight, want 1 event of at least %d bytes", events, held, want)
			}
			// The cap on Kafka's record size still applies to the record itself.
			if failed := metricSum(t, reg, "outbox_relay_events_failed_total"); failed != 0 {
				t.Fatalf("%v events failed; the record itself fits max_message_bytes", failed)
			}
		})
	}
}

// createStuckTopic creates a topic that takes no acks=all write: it wants two in-sync replicas of one.
func createStuckTopic(t *testing.T, brokers, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(brokers, ",")...)}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "min.insync.replicas", ConfigValue: "2"}},
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// TestTransactionsWithoutEventsBehindAnUnacknowledgedEventLeaveTheHeapFlat: PostgreSQL 14 sends a
// Begin and a Commit for every transaction of the database. With one event that is never
// acknowledged (the halt policy stops at it: its topic name is invalid, so no broker is needed)
// and a stream of transactions without events behind it, nothing in the pipeline (decoder,
// checkpoint, metrics) may keep anything per transaction: the heap stays where it was, the
// checkpoint holds the one transaction with the event, and Safe stays before it.
func TestTransactionsWithoutEventsBehindAnUnacknowledgedEventLeaveTheHeapFlat(t *testing.T) {
	const empties = 100_000
	reg := prometheus.NewRegistry()
	r := newWAL(t, Config{Sink: sink.Config{Brokers: []string{"127.0.0.1:1"}, Policy: sink.Halt}}, zap.NewNop(), metrics.New(reg))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		r.sink.Close(ctx) // the halted event is never acknowledged
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Unbuffered: once a send returns, the pipeline has taken every message before it.
	msgs := make(chan replication.Message)
	piped := make(chan error, 1)
	go func() { piped <- r.pipeline(ctx, ctx, msgs) }()
	send := func(b []byte) {
		select {
		case msgs <- dataMessage(b):
		case err := <-piped:
			t.Fatalf("the pipeline ended: %v", err)
		}
	}
	send(relationMessage(outboxColumns))
	send(beginMessage(0x100))
	send(event("bad type!", 1, `{}`))
	send(commitMessage(0x100, 0x130))
	lsn := uint64(0x200)
	sendEmpties := func(n int) {
		for range n {
			send(beginMessage(lsn))
			send(commitMessage(lsn, lsn+0x30))
			lsn += 0x40
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	sendEmpties(1000) // warm up: buffers and caches at their working size
	before := heap()
	sendEmpties(empties)
	send(beginMessage(lsn)) // the last Commit has been taken in
	grew := int64(heap()) - int64(before)
	if _, _, _, halted := r.sink.Halted(); !halted {
		t.Fatal("the sink did not halt at the event with an invalid topic")
	}
	if got := r.tracker.Pending(); got != 2 {
		t.Errorf("the checkpoint holds %d transactions, want 2: the one with the unacknowledged event and the open one", got)
	}
	if safe := r.tracker.Safe(); safe >= 0x130 {
		t.Errorf("Safe() = %s while the event was unacknowledged", safe)
	}
	// A transaction kept in the checkpoint costs ~80 bytes: 8 MB here.
	t.Logf("heap %+d bytes over %d transactions without events", grew, empties)
	if grew > 2<<20 {
		t.Errorf("the heap grew by %d bytes over %d transactions without events behind an unacknowledged event, want it flat", grew, empties)
	}
	close(msgs)
	if err := <-piped; err != nil {
		t.Fatal(err)
	}
}
