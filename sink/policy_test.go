package sink_test

import (
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestSinkHaltOnASplitBatchSendsNothingBehindTheHaltedRecord: the topic takes 2,000-byte records
// while the relay allows 1 MiB, so only the broker refuses the 5 KB event. It shares a request with
// the next event of its key; the refused request is split and re-sent record by record, and once
// the first record halts the sink the second must not follow it into the topic: that would put
// e(n+1) of the key in Kafka without e(n).
func TestSinkHaltOnASplitBatchSendsNothingBehindTheHaltedRecord(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "agg")
	topic := "outbox.event." + aggType
	dlq := testenv.UniqueName(t, "dlq")
	createTopic(t, k.Brokers(), topic, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "2000"})
	// A long linger puts both events of the transaction into one request.
	s := readySink(t, k.Brokers(), sink.Config{Policy: sink.Halt, DeadLetterTopic: dlq, Linger: 300 * time.Millisecond})

	first := &acker{}
	s.publish(t, newEvent("first", []byte(aggType), "K", "Fine", []byte(`{}`)), first)
	eventually(t, 30*time.Second, "the first event acked", func() bool { return first.n.Load() == 1 })

	tx := &acker{}
	big := newEvent("big", []byte(aggType), "K", "Big", []byte(`"`+strings.Repeat("b", 5000)+`"`))
	small := newEvent("small", []byte(aggType), "K", "Small", []byte(`{}`))
	small.Tx = big.Tx
	s.publish(t, big, tx)
	s.publish(t, small, tx)
	eventually(t, 30*time.Second, "the sink halted", func() bool { _, _, _, halted := s.Halted(); return halted })
	if id, reason, _, _ := s.Halted(); id != "big" || reason != sink.ReasonTooLarge {
		t.Fatalf("halted on %q (%s), want big (%s)", id, reason, sink.ReasonTooLarge)
	}
	// Close returns once the producers have stopped: what the split would still send is sent by
	// then, and acknowledged if it was wrongly let through.
	s.mustClose(t)
	if n := tx.n.Load(); n != 0 {
		t.Errorf("the halted transaction got %d acks, want none", n)
	}

	records := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), topic)
	var ids []string
	for _, r := range records {
		ids = append(ids, r.Header("id"))
	}
	if strings.Join(ids, ",") != "first" {
		t.Fatalf("the topic holds %v, want only [first]: nothing behind the halted event may be sent", ids)
	}
}
