package faults

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

const (
	badAggregateType = "bad type!" // makes the topic name "outbox.event.bad type!", which Kafka refuses
	twoMB            = 2 << 20     // above max_message_bytes (1 MiB) and the broker's message.max.bytes
)

// TestDeadLetterPolicyParksUnpublishableEventsAndKeepsGoing runs the relay with
// on_failure=dead-letter and feeds it a 2 MB payload and an invalid topic name between ordinary
// events, one of them in a transaction with good events. The bad events must land in the
// dead-letter topic with the documented headers, the good ones in their topics, the slot must
// advance past everything, and the relay must keep publishing.
func TestDeadLetterPolicyParksUnpublishableEventsAndKeepsGoing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.SharedKafka(t).Brokers()
	d := newDB(t, testenv.SharedPostgres(t), 1)
	dlq := testenv.UniqueName(t, "dlq")
	r := d.startRelay(brokers, "--on-failure=dead-letter", "--dead-letter-topic="+dlq, "--status-interval=200ms")
	r.waitSessions(1, 90*time.Second)

	typ := d.types[0]
	for _, tx := range [][]harness.Spec{
		{{AggregateType: typ, AggregateID: "a-1"}},
		{{AggregateType: typ, AggregateID: "a-ü", PadBytes: twoMB, Headers: map[string]string{"tenant": "acme"}}},
		{{AggregateType: typ, AggregateID: "a-1"}, {AggregateType: badAggregateType, AggregateID: "b-ü", Headers: map[string]string{"tenant": "acme"}}, {AggregateType: typ, AggregateID: "a-1"}},
	} {
		if err := d.outbox.WriteTx(ctx, tx...); err != nil {
			t.Fatal(err)
		}
	}
	var good []harness.Written
	var tooBig, badTopic harness.Written
	for _, w := range d.outbox.Written() {
		switch {
		case w.AggregateType == badAggregateType:
			badTopic = w
		case len(w.Payload) > twoMB:
			tooBig = w
		default:
			good = append(good, w)
		}
	}
	deliver(t, brokers, good, time.Minute, r)

	c := harness.NewConsumer(brokers, dlq)
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.ReadUntil(rctx, time.Second, func(recs []harness.Record) bool { return len(recs) >= 2 }); err != nil {
		t.Fatalf("dead-letter topic %s: %v", dlq, err)
	}
	byID := make(map[string]harness.Record)
	for _, rec := range c.Records() {
		byID[rec.Header("id")] = rec
	}
	if len(c.Records()) != 2 || len(byID) != 2 {
		t.Fatalf("dead-letter topic holds %d records (%d ids), want the 2 bad events once each", len(c.Records()), len(byID))
	}
	check := func(w harness.Written, reason, topic string, value func(harness.Record) string) {
		rec, ok := byID[w.ID]
		if !ok {
			t.Errorf("event %s (%s) is not in the dead-letter topic", w.ID, reason)
			return
		}
		want := map[string]string{
			"outbox.dlq.original_topic": topic,
			"outbox.dlq.original_key":   w.AggregateID,
			"outbox.dlq.reason":         reason,
			"event_type":                w.EventType,
			"aggregate_type":            w.AggregateType,
			"tenant":                    "acme",
		}
		for k, v := range want {
			if rec.Header(k) != v {
				t.Errorf("%s: header %s = %q, want %q", reason, k, rec.Header(k), v)
			}
		}
		if rec.Header("outbox.dlq.error") == "" {
			t.Errorf("%s: no outbox.dlq.error header", reason)
		}
		if _, err := pglogrepl.ParseLSN(rec.Header("outbox.dlq.lsn")); err != nil {
			t.Errorf("%s: header outbox.dlq.lsn = %q: %v", reason, rec.Header("outbox.dlq.lsn"), err)
		}
		if string(rec.Key) != w.AggregateID {
			t.Errorf("%s: key %q, want %q", reason, rec.Key, w.AggregateID)
		}
		if problem := value(rec); problem != "" {
			t.Errorf("%s: %s", reason, problem)
		}
	}
	check(badTopic, "invalid_topic", harness.TopicFor(badAggregateType), func(rec harness.Record) string {
		if string(rec.Value) != badTopic.Payload {
			return "value is not the event's payload"
		}
		return ""
	})
	check(tooBig, "message_too_large", harness.TopicFor(typ), func(rec harness.Record) string {
		// Too large for the dead-letter topic too: a reference to the outbox row instead.
		var ref struct {
			EventID      string `json:"event_id"`
			PayloadBytes int    `json:"payload_bytes"`
		}
		if err := json.Unmarshal(rec.Value, &ref); err != nil || ref.EventID != tooBig.ID || ref.PayloadBytes != len(tooBig.Payload) {
			return "value is not a reference to the outbox row: " + string(rec.Value)
		}
		if rec.Header("outbox.dlq.payload_bytes") != strconv.Itoa(len(tooBig.Payload)) {
			return "header outbox.dlq.payload_bytes = " + rec.Header("outbox.dlq.payload_bytes")
		}
		return ""
	})

	// Counted, and settled: the slot moves past them and the relay keeps going.
	for reason, want := range map[string]float64{"message_too_large": 1, "invalid_topic": 1} {
		if got := r.mustMetric("events_failed_total", `reason="`+reason+`"`); got != want {
			t.Errorf("events_failed_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	if got := r.mustMetric("events_dead_lettered_total", ""); got != 2 {
		t.Errorf("events_dead_lettered_total = %v, want 2", got)
	}
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: typ, AggregateID: "a-2"}); err != nil {
		t.Fatal(err)
	}
	end := currentLSN(t, d.outbox.Pool())
	written := d.outbox.Written()
	deliver(t, brokers, append(good, written[len(written)-1]), time.Minute, r)
	await.True(t, 30*time.Second, "the slot to be confirmed past the dead-lettered events", func() bool {
		return confirmedLSN(t, d.outbox.Pool(), d.slot) >= end
	})
	if r.Exited() {
		t.Fatal("the relay exited")
	}
}

// TestHaltPolicyStopsAtTheEventAndKeepsTheProcessUp runs the relay with on_failure=halt. After an
// event that cannot be published, the process must stay up and not ready, log the event's id and
// the reason, never confirm the slot past that event, and publish nothing after it.
func TestHaltPolicyStopsAtTheEventAndKeepsTheProcessUp(t *testing.T) {
	t.Parallel()
	brokers := testenv.SharedKafka(t).Brokers()
	spec := func(f func(d *db) harness.Spec) func(d *db) (marked, string) {
		return func(d *db) (marked, string) {
			m := d.writeMarked(f(d))
			return m, m.IDs[0]
		}
	}
	for _, tc := range []struct {
		name, reason string
		messages     bool // the table-free outbox (outbox_shape messages)
		bad          func(d *db) (m marked, id string)
	}{
		{"a 2 MB payload", "message_too_large", false, spec(func(d *db) harness.Spec {
			return harness.Spec{AggregateType: d.types[0], AggregateID: "groß", PadBytes: twoMB}
		})},
		{"an invalid topic name", "invalid_topic", false, spec(func(d *db) harness.Spec {
			return harness.Spec{AggregateType: badAggregateType, AggregateID: "b-1"}
		})},
		{"a logical decoding message without an aggregate id", "invalid_message", true, func(d *db) (marked, string) {
			const id = "3f2b8c1e-6a4d-4e5f-8b9a-0c1d2e3f4a5b"
			return d.writeMarkedWith(func(ctx context.Context, tx pgx.Tx) (func(), error) {
				_, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", "outbox."+d.slot,
					`{"id": "`+id+`", "aggregate_type": "`+d.types[0]+`", "payload": {"a": 1}}`)
				return nil, err
			}), id
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			every := 0
			if tc.messages {
				every = 1
			}
			d := newDBOf(t, testenv.SharedPostgres(t), 1, every)
			r := d.startRelay(brokers, "--on-failure=halt", "--status-interval=200ms")
			r.waitSessions(1, 90*time.Second)
			if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "a-1"}); err != nil {
				t.Fatal(err)
			}
			deliver(t, brokers, d.outbox.Written(), time.Minute, r)

			bad, badID := tc.bad(d)
			if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "a-1"}); err != nil {
				t.Fatal(err)
			}
			written := d.outbox.Written()
			after := written[len(written)-1]

			if _, ok := r.waitLog(0, `"event_id":"`+badID+`"`, 30*time.Second); !ok {
				t.Fatalf("the relay did not log the event id %s", badID)
			}
			var line string
			for _, l := range strings.Split(r.Output(), "\n") {
				if strings.Contains(l, badID) {
					line = l
					break
				}
			}
			if !strings.Contains(line, `"reason":"`+tc.reason+`"`) || !strings.Contains(line, "halt") {
				t.Errorf("the log line about the event does not say halted and %q: %s", tc.reason, line)
			}

			// Halted: up, not ready, the slot at most at the bad event's commit, nothing later published.
			for range 15 {
				if got := confirmedLSN(t, d.outbox.Pool(), d.slot); got > bad.CommitStart {
					t.Fatalf("confirmed_flush_lsn %s passed the halted event's transaction (commit at %s)", lsnString(got), lsnString(bad.CommitStart))
				}
				if r.Exited() {
					t.Fatal("the relay exited; halt must keep the process up for an operator")
				}
				time.Sleep(200 * time.Millisecond)
			}
			if got := r.mustMetric("halted", ""); got != 1 {
				t.Errorf("halted gauge = %v, want 1", got)
			}
			if got := r.mustMetric("events_failed_total", `reason="`+tc.reason+`"`); got != 1 {
				t.Errorf("events_failed_total{reason=%q} = %v, want 1", tc.reason, got)
			}
			if code := httpStatus(t, "http://"+r.metrics+"/readyz"); code != http.StatusServiceUnavailable {
				t.Errorf("/readyz answered %d while halted, want %d", code, http.StatusServiceUnavailable)
			}
			c := harness.NewConsumer(brokers, harness.TopicFor(d.types[0]))
			defer c.Close()
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			err := c.ReadUntil(rctx, 0, func(recs []harness.Record) bool {
				for _, rec := range recs {
					if rec.Header("id") == after.ID {
						return true
					}
				}
				return false
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the event committed after the halted one was published (read: %v)", err)
			}
		})
	}
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	res, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	res.Body.Close()
	return res.StatusCode
}
