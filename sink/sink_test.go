package sink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// javaPartitions runs testdata/Murmur2.java against the Kafka client jars: the partition the Java
// producer's default partitioner picks for each key.
func javaPartitions(t *testing.T, keys []string, partitions int) []int {
	t.Helper()
	for _, k := range keys {
		if strings.ContainsAny(k, "\r\n") {
			t.Fatalf("key %q cannot travel as a line", k)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "java", "-cp", filepath.Join(devenv.DefaultKafkaLib(), "*"),
		filepath.Join("testdata", "Murmur2.java"), strconv.Itoa(partitions))
	cmd.Stdin = strings.NewReader(strings.Join(keys, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("java Murmur2: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(keys) {
		t.Fatalf("java Murmur2 printed %d partitions for %d keys", len(lines), len(keys))
	}
	ps := make([]int, len(lines))
	for i, l := range lines {
		if ps[i], err = strconv.Atoi(l); err != nil {
			t.Fatalf("java Murmur2 line %d: %v", i, err)
		}
	}
	return ps
}

func TestSinkPartitionsKeysLikeTheJavaClient(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	const partitions = 6
	groups := []struct {
		name string
		keys []string
	}{
		{"ASCII keys", func() (ks []string) {
			for i := range 80 {
				ks = append(ks, fmt.Sprintf("order-%d", i))
			}
			return append(ks, "a", "Z", "0", " ", "~!@#$%^&*()", "550e8400-e29b-41d4-a716-446655440000", strings.Repeat("k", 300))
		}()},
		{"non-ASCII UTF-8 keys", func() (ks []string) {
			for i := range 25 {
				ks = append(ks, fmt.Sprintf("заказ-%d", i), fmt.Sprintf("注文-%d", i), fmt.Sprintf("Ünïcødé-%dß", i), fmt.Sprintf("🙂-%d", i))
			}
			return append(ks, "é", "日本語", "\u00a0", "𝄞")
		}()},
		{"the empty key", []string{""}},
	}
	var keys []string
	for _, g := range groups {
		keys = append(keys, g.keys...)
	}
	want := javaPartitions(t, keys, partitions)
	used := make(map[int]bool)
	for _, p := range want {
		used[p] = true
	}
	if len(used) != partitions {
		t.Fatalf("the keys cover only partitions %v; the test would not tell much", used)
	}

	topic := testenv.UniqueName(t, "murmur")
	if err := k.CreateTopic(context.Background(), topic, partitions); err != nil {
		t.Fatal(err)
	}
	s := readySink(t, k.Brokers(), sink.Config{Record: record.Options{TopicTemplate: topic}, DeadLetterTopic: testenv.UniqueName(t, "dlq")})
	var acked atomic.Int64
	for i, key := range keys {
		aggID := key
		ev := newEvent(fmt.Sprintf("e%03d", i), []byte("Key"), aggID, "Tested", []byte(`{}`))
		if key == "" {
			ev.AggregateID = []byte{} // an empty value, not NULL
		}
		s.publish(t, ev, &acker{total: &acked})
	}
	s.mustClose(t)
	if acked.Load() != int64(len(keys)) {
		t.Fatalf("%d acks for %d events", acked.Load(), len(keys))
	}
	got := make(map[int]int) // event index -> partition
	for _, r := range readBack(t, k.Brokers(), 30*time.Second, atLeast(len(keys)), topic) {
		i, err := strconv.Atoi(strings.TrimPrefix(r.Header("id"), "e"))
		if err != nil || string(r.Key) != keys[i] {
			t.Fatalf("record %s/%d@%d: id %q, key %q", r.Topic, r.Partition, r.Offset, r.Header("id"), r.Key)
		}
		got[i] = r.Partition
	}
	i := 0
	for _, g := range groups {
		t.Run(g.name+" land on the Java partition", func(t *testing.T) {
			for _, key := range g.keys {
				if p, ok := got[i]; !ok || p != want[i] {
					t.Errorf("key %q: partition %d (read back: %v), Java picks %d", key, p, ok, want[i])
				}
				i++
			}
		})
	}
}

// payload makes a JSON payload of about n bytes with multi-byte characters.
func payload(rng *rand.Rand, key string, seq, n int) []byte {
	pad := make([]rune, 0, n)
	alphabet := []rune("abcdefghijklmnopqrstuvwxyz0123456789 éßü日本🙂")
	for len(pad) < n {
		pad = append(pad, alphabet[rng.IntN(len(alphabet))])
	}
	b, _ := json.Marshal(map[string]any{"key": key, "seq": seq, "pad": string(pad)})
	return b
}

func TestSinkDeliversEveryEventOnceAckedInKeyOrder(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "agg")
	topic := "outbox.event." + aggType // auto-created: 3 partitions
	s := readySink(t, k.Brokers(), sink.Config{
		Record:          record.Options{ExtraHeaders: []string{"tenant"}},
		DeadLetterTopic: testenv.UniqueName(t, "dlq"),
		BatchSize:       100,
		MaxInFlight:     1000, // the limiter must recycle capacity
	})
	rng := rand.New(rand.NewPCG(1, 2))
	const events, keys = 3000, 40
	log := newSent()
	for i := 0; i < events; {
		a := &acker{} // one "transaction" of 1 to 7 events
		for n := 1 + rng.IntN(7); n > 0 && i < events; n-- {
			key := fmt.Sprintf("aggregate-%02d", rng.IntN(keys))
			ev := newEvent(fmt.Sprintf("%s-%05d", aggType, i), []byte(aggType), key, "Changed", nil)
			ev.Payload = payload(rng, key, i, rng.IntN(2000))
			ev.Headers = fmt.Appendf(nil, `{"trace_id":"t-%d","n":%d,"skip":null}`, i, i)
			ev.Extra = [][]byte{[]byte("tenant-" + strconv.Itoa(i%3))}
			log.add(ev, a, map[string]string{"tenant": "tenant-" + strconv.Itoa(i%3), "trace_id": "t-" + strconv.Itoa(i), "n": strconv.Itoa(i)})
			s.publish(t, ev, a)
			i++
		}
	}
	s.mustClose(t)
	log.checkAcked(t)
	if n, b := s.InFlight(); n != 0 || b != 0 {
		t.Fatalf("in flight after Close: %d events, %d bytes", n, b)
	}
	if got := s.metric(t, "outbox_relay_events_published_total", "topic", topic); got != events {
		t.Fatalf("events_published_total = %v, want %d", got, events)
	}
	if got := s.metric(t, "outbox_relay_in_flight_events"); got != 0 {
		t.Fatalf("in_flight_events = %v after Close", got)
	}
	records := readBack(t, k.Brokers(), 60*time.Second, atLeast(events), topic)
	if dups := log.verify(t, topic, records); dups > 0 {
		t.Logf("%d duplicate deliveries", dups)
	}
}

// dlqRecord finds the dead-lettered record of an event.
func dlqRecord(t *testing.T, records []harness.Record, id string) harness.Record {
	t.Helper()
	for _, r := range records {
		if r.Header("id") == id {
			return r
		}
	}
	t.Fatalf("event %s is not on the dead-letter topic", id)
	return harness.Record{}
}

func TestSinkDeadLettersWhatCannotBePublished(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "agg")
	topic := "outbox.event." + aggType
	dlq := testenv.UniqueName(t, "dlq")
	if err := k.CreateTopic(context.Background(), topic, 3); err != nil {
		t.Fatal(err)
	}
	s := readySink(t, k.Brokers(), sink.Config{DeadLetterTopic: dlq}) // default policy and 1 MiB limit

	huge := bytes.Repeat([]byte("x"), 2<<20)
	huge[0], huge[len(huge)-1] = '"', '"'
	failing := []struct {
		name       string
		ev         *decoder.Event
		reason     string
		origTopic  string
		errText    string
		keepsValue bool
	}{
		{"a 2 MB payload over max_message_bytes", newEvent("too-large", []byte(aggType), "order-1", "Big", huge),
			sink.ReasonTooLarge, topic, "max_message_bytes", false},
		{"an aggregate type that makes an invalid topic name", newEvent("bad-topic", []byte("bad type!"), "order-2", "Odd", []byte(`{"n":2}`)),
			sink.ReasonInvalidTopic, "outbox.event.bad type!", "bad type!", true},
		{"a headers column that is not a JSON object", func() *decoder.Event {
			ev := newEvent("bad-headers", []byte(aggType), "order-3", "Odd", []byte(`{"n":3}`))
			ev.Headers = []byte(`["not","an","object"]`)
			return ev
		}(), sink.ReasonBadHeaders, topic, "JSON object", true},
		{"a headers member named like the event id header", func() *decoder.Event {
			ev := newEvent("id-in-headers", []byte(aggType), "order-3", "Odd", []byte(`{"n":4}`))
			ev.Headers = []byte(`{"trace":"t-1","id":"correlation-42"}`)
			return ev
		}(), sink.ReasonBadHeaders, topic, "rename the member", true},
	}

	log := newSent()
	seq := 0
	good := func(n int) {
		for range n {
			key := fmt.Sprintf("order-%d", seq%4)
			ev := newEvent(fmt.Sprintf("good-%03d", seq), []byte(aggType), key, "Fine", fmt.Appendf(nil, `{"seq":%d}`, seq))
			a := &acker{}
			log.add(ev, a, nil)
			s.publish(t, ev, a)
			seq++
		}
	}
	failedAckers := make([]*acker, len(failing))
	good(10)
	for i, f := range failing {
		failedAckers[i] = &acker{}
		s.publish(t, f.ev, failedAckers[i])
		good(10)
	}
	s.mustClose(t)
	log.checkAcked(t)

	dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(len(failing)), dlq)
	if len(dead) != len(failing) {
		t.Errorf("%d records on the dead-letter topic, want %d", len(dead), len(failing))
	}
	for i, f := range failing {
		t.Run(f.name+" is dead-lettered with headers that say why", func(t *testing.T) {
			if n := failedAckers[i].n.Load(); n != 1 {
				t.Errorf("acked %d times, want once", n)
			}
			r := dlqRecord(t, dead, string(f.ev.ID))
			if string(r.Key) != string(f.ev.AggregateID) {
				t.Errorf("key %q, want %q", r.Key, f.ev.AggregateID)
			}
			want := map[string]string{
				sink.HeaderDLQTopic:  f.origTopic,
				sink.HeaderDLQKey:    string(f.ev.AggregateID),
				sink.HeaderDLQReason: f.reason,
				sink.HeaderDLQLSN:    f.ev.LSN.String(),
				"id":                 string(f.ev.ID),
				"event_type":         string(f.ev.EventType),
				"aggregate_type":     string(f.ev.AggregateType),
			}
			for h, v := range want {
				if got, ok := r.Headers[h]; !ok || got != v {
					t.Errorf("header %s = %q (present %v), want %q", h, got, ok, v)
				}
			}
			if e := r.Header(sink.HeaderDLQError); !strings.Contains(e, f.errText) {
				t.Errorf("header %s = %q, want it to mention %q", sink.HeaderDLQError, e, f.errText)
			}
			if f.keepsValue {
				if !bytes.Equal(r.Value, f.ev.Payload) {
					t.Errorf("value %q, want the payload %q", r.Value, f.ev.Payload)
				}
				return
			}
			var ref struct {
				EventID      string `json:"event_id"`
				AggregateID  string `json:"aggregate_id"`
				LSN          string `json:"lsn"`
				PayloadBytes int    `json:"payload_bytes"`
			}
			if err := json.Unmarshal(r.Value, &ref); err != nil || len(r.Value) > 4096 {
				t.Fatalf("value is not a small JSON reference (%d bytes): %v", len(r.Value), err)
			}
			if ref.EventID != string(f.ev.ID) || ref.AggregateID != string(f.ev.AggregateID) ||
				ref.LSN != f.ev.LSN.String() || ref.PayloadBytes != len(f.ev.Payload) {
				t.Errorf("reference %s does not name the event", r.Value)
			}
		})
	}
	t.Run("the events around them are delivered normally", func(t *testing.T) {
		records := readBack(t, k.Brokers(), 30*time.Second, atLeast(seq), topic)
		log.verify(t, topic, records)
	})
	t.Run("the failed and dead-lettered counters moved", func(t *testing.T) {
		want := map[string]float64{}
		for _, f := range failing {
			want[f.reason]++
		}
		for reason, n := range want {
			if got := s.metric(t, "outbox_relay_events_failed_total", "reason", reason); got != n {
				t.Errorf("events_failed_total{reason=%q} = %v, want %v", reason, got, n)
			}
		}
		if got := s.metric(t, "outbox_relay_events_dead_lettered_total"); got != float64(len(failing)) {
			t.Errorf("events_dead_lettered_total = %v, want %d", got, len(failing))
		}
		if got := s.metric(t, "outbox_relay_events_dead_lettered_total", "topic", topic); got != 3 {
			t.Errorf("events_dead_lettered_total{topic=%q} = %v, want 3", topic, got)
		}
		if got := s.metric(t, "outbox_relay_events_published_total", "topic", topic); got != float64(seq) {
			t.Errorf("events_published_total = %v, want %d", got, seq)
		}
		if got := s.metric(t, "outbox_relay_halted"); got != 0 {
			t.Errorf("halted = %v, want 0", got)
		}
	})
}

func TestSinkHaltPolicyStopsAtTheFirstFailure(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	tests := []struct {
		name    string
		aggType func(ok string) []byte
		payload []byte
		reason  string
	}{
		{"a 2 MB payload halts the sink", func(ok string) []byte { return []byte(ok) }, bytes.Repeat([]byte("y"), 2<<20), sink.ReasonTooLarge},
		{"an aggregate type that makes an invalid topic halts the sink", func(string) []byte { return []byte("bad type!") }, []byte(`{}`), sink.ReasonInvalidTopic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			aggType := testenv.UniqueName(t, "agg")
			topic := "outbox.event." + aggType
			dlq := testenv.UniqueName(t, "dlq")
			if err := k.CreateTopic(context.Background(), topic, 3); err != nil {
				t.Fatal(err)
			}
			s := readySink(t, k.Brokers(), sink.Config{Policy: sink.Halt, DeadLetterTopic: dlq})
			before := &acker{}
			for i := range 5 {
				s.publish(t, newEvent(fmt.Sprintf("before-%d", i), []byte(aggType), "order-1", "Fine", []byte(`{}`)), before)
			}
			// Let them reach Kafka first: under halt, what was not yet handed to the writer waits.
			eventually(t, 30*time.Second, "events before the failure acked", func() bool { return before.n.Load() == 5 })
			if _, _, _, halted := s.Halted(); halted {
				t.Fatal("halted before the failure")
			}

			bad := &acker{}
			s.publish(t, newEvent("the-bad-one", tt.aggType(aggType), "order-1", "Bad", tt.payload), bad)
			id, reason, err, halted := s.Halted()
			if !halted || id != "the-bad-one" || reason != tt.reason || err == nil {
				t.Fatalf("Halted() = %q, %q, %v, %v; want the-bad-one, %s, an error, true", id, reason, err, halted, tt.reason)
			}

			later := &acker{}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			start := time.Now()
			perr := s.Publish(ctx, newEvent("later", []byte(aggType), "order-2", "Fine", []byte(`{}`)), later)
			cancel()
			if !errors.Is(perr, context.DeadlineExceeded) || time.Since(start) < 450*time.Millisecond {
				t.Fatalf("Publish after the halt returned %v after %v; want it to block until the context ends", perr, time.Since(start))
			}
			if got := s.metric(t, "outbox_relay_halted"); got != 1 {
				t.Errorf("halted gauge = %v, want 1", got)
			}
			if got := s.metric(t, "outbox_relay_events_failed_total", "reason", tt.reason); got != 1 {
				t.Errorf("events_failed_total{reason=%q} = %v, want 1", tt.reason, got)
			}
			s.mustClose(t) // the producers have stopped: an acknowledgement after the halt would have come
			if bad.n.Load() != 0 || later.n.Load() != 0 {
				t.Fatalf("acked after the halt or at Close: failed event %d, later event %d", bad.n.Load(), later.n.Load())
			}
			if got := s.metric(t, "outbox_relay_events_dead_lettered_total"); got != 0 {
				t.Errorf("events_dead_lettered_total = %v under the halt policy", got)
			}
			records := readBack(t, k.Brokers(), 30*time.Second, atLeast(5), topic, dlq)
			for _, r := range records {
				if r.Topic != topic || !strings.HasPrefix(r.Header("id"), "before-") {
					t.Errorf("unexpected record %s id %s", r.Topic, r.Header("id"))
				}
			}
		})
	}
}

func TestSinkRoutesABrokerSizeRejectionToThePolicy(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	aggType := testenv.UniqueName(t, "agg")
	topic := "outbox.event." + aggType
	dlq := testenv.UniqueName(t, "dlq")
	// The topic takes less than the relay's 1 MiB limit, which only the broker knows about.
	createTopic(t, k.Brokers(), topic, 3, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "10000"})
	s := readySink(t, k.Brokers(), sink.Config{DeadLetterTopic: dlq, Linger: 20 * time.Millisecond})

	log := newSent()
	var acked atomic.Int64
	publishGood := func(from, to int) {
		for i := from; i < to; i++ {
			key := fmt.Sprintf("order-%d", i%5)
			ev := newEvent(fmt.Sprintf("n-%04d", i), []byte(aggType), key, "Fine", fmt.Appendf(nil, `{"seq":%d,"pad":"%s"}`, i, strings.Repeat("p", 250)))
			a := &acker{total: &acked}
			log.add(ev, a, nil)
			s.publish(t, ev, a)
		}
	}
	start := time.Now()
	publishGood(0, 150)
	big := newEvent("big", []byte(aggType), "order-0", "Big", []byte(`"`+strings.Repeat("b", 50_000)+`"`))
	bigAck := &acker{total: &acked}
	s.publish(t, big, bigAck)
	publishGood(150, 300)

	eventually(t, 60*time.Second, "every event acked", func() bool { return acked.Load() == 301 })
	t.Logf("all acked after %v", time.Since(start))
	s.mustClose(t)
	log.checkAcked(t)
	if bigAck.n.Load() != 1 {
		t.Fatalf("the big event was acked %d times", bigAck.n.Load())
	}
	t.Run("the oversize record is dead-lettered as too large", func(t *testing.T) {
		if got := s.metric(t, "outbox_relay_events_failed_total", "reason", sink.ReasonTooLarge); got != 1 {
			t.Errorf("events_failed_total{reason=message_too_large} = %v, want 1", got)
		}
		dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), dlq)
		if len(dead) != 1 || dead[0].Header("id") != "big" || dead[0].Header(sink.HeaderDLQReason) != sink.ReasonTooLarge {
			var ids []string
			for _, r := range dead {
				ids = append(ids, r.Header("id")+"/"+r.Header(sink.HeaderDLQReason))
			}
			t.Fatalf("dead-letter topic holds %v, want only big/message_too_large", ids)
		}
		if !bytes.Equal(dead[0].Value, big.Payload) {
			t.Errorf("dead-lettered value differs from the payload")
		}
	})
	t.Run("the neighbours are delivered to their topic in key order", func(t *testing.T) {
		records := readBack(t, k.Brokers(), 30*time.Second, atLeast(300), topic)
		log.verify(t, topic, records)
	})
}
