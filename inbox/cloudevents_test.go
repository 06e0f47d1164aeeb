package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// The relay writes CloudEvents in both content modes without its own id and event_type headers
// (builtin_headers empty), so only the envelope tells the inbox consumer which event it is: each
// deposit is applied once, and a second delivery of every record is told a duplicate by the
// CloudEvent's id.
func TestTheInboxConsumerAppliesTheRelaysCloudEventsInBothContentModes(t *testing.T) {
	kafkaSvc := testenv.SharedKafka(t)
	brokers := kafkaSvc.Brokers()
	for _, tt := range []struct {
		mode     string
		encoding record.Encoding
	}{
		{record.CloudEventsStructured, record.JSONExpanded},
		{record.CloudEventsBinary, record.Raw},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			dsn, pool := newDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			aggType := testenv.UniqueName(t, "account")
			if err := kafkaSvc.CreateTopic(ctx, harness.TopicFor(aggType), 1); err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
				t.Fatal(err)
			}
			conn.Close(ctx)
			startRelay(t, dsn, brokers, pool, func(c *relay.Config) {
				c.Sink.Record = record.Options{BuiltinHeaders: []string{}, ValueEncoding: tt.encoding,
					CloudEvents: &record.CloudEvents{Mode: tt.mode, Subject: "{aggregate_id}"}}
			})

			const events = 6
			want := map[string]int{}
			for i := range events {
				d := depositEvent{Account: fmt.Sprintf("acc-%d", i%2), Amount: i + 1}
				want[d.Account] += d.Amount
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: aggType, AggregateID: d.Account, EventType: "Deposited", Payload: d})
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}

			store, err := inbox.New(inbox.Config{Consumer: "balances"})
			if err != nil {
				t.Fatal(err)
			}
			c := &inbox.Consumer{DB: pool, Store: store, Registry: inbox.NewRegistry().Handle("Deposited", 1, func(ctx context.Context, e *inbox.Event) error {
				var d depositEvent
				if err := json.Unmarshal(e.Payload, &d); err != nil {
					return fmt.Errorf("payload %q: %w", e.Payload, err)
				}
				return depositor(d.Account, d.Amount)(ctx, e.Tx)
			})}
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{brokers}, Topic: harness.TopicFor(aggType), MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 200 * time.Millisecond})
			defer r.Close()
			for range events {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				for _, h := range m.Headers {
					if h.Key == inbox.HeaderID || h.Key == inbox.HeaderEventType {
						t.Fatalf("the record carries the relay's %s header, so the test would not prove the envelope is read", h.Key)
					}
				}
				d, err := inbox.ParseDelivery(m)
				if err != nil {
					t.Fatal(err)
				}
				if ce := d.CloudEvent; ce == nil || ce.Mode != tt.mode || ce.Source != "/outbox-relay/"+aggType || ce.Subject != string(m.Key) || ce.Time.IsZero() {
					t.Errorf("CloudEvent %+v: want %s mode, source /outbox-relay/%s, subject %s and a time", ce, tt.mode, aggType, m.Key)
				}
				for attempt, want := range []inbox.Outcome{inbox.Applied, inbox.Duplicate} {
					got, err := c.Handle(ctx, m)
					if err != nil || got != want {
						t.Fatalf("delivery %d of %s: %v, %v; want %v", attempt+1, d.ID, got, err, want)
					}
				}
			}
			for account, amount := range want {
				if got := balance(t, pool, account); got != amount {
					t.Errorf("%s balance = %d, want %d", account, got, amount)
				}
			}
		})
	}
}

// The toolkit reads what the relay's record builder writes, and refuses what is not a CloudEvent
// it can read with an error naming the cause.
func TestParseCloudEventReadsBothModesAndRefusesBrokenEnvelopes(t *testing.T) {
	ev := &decoder.Event{ID: []byte("e-1"), AggregateType: []byte("order"), AggregateID: []byte("o-1"), EventType: []byte("Placed"), Payload: []byte(`{"n": 1}`)}
	ev.Tx.CommitTime = time.Date(2026, 2, 3, 4, 5, 6, 7_000_000, time.UTC)
	build := func(o record.Options) kafka.Message {
		b, err := record.NewBuilder(o)
		if err != nil {
			t.Fatal(err)
		}
		r := b.Build(ev, time.Now())
		if r.EnvelopeErr != nil {
			t.Fatal(r.EnvelopeErr)
		}
		return r.Msg
	}
	structured := build(record.Options{BuiltinHeaders: []string{}, CloudEvents: &record.CloudEvents{Type: "com.example.{event_type}"}})
	binary := build(record.Options{BuiltinHeaders: []string{}, CloudEvents: &record.CloudEvents{Mode: record.CloudEventsBinary}})
	base64Data := build(record.Options{BuiltinHeaders: []string{}, CloudEvents: &record.CloudEvents{DataContentType: "application/octet-stream"}})
	with := func(m kafka.Message, value string, headers ...string) kafka.Message {
		m.Value = []byte(value)
		m.Headers = nil
		for i := 0; i+1 < len(headers); i += 2 {
			m.Headers = append(m.Headers, kafka.Header{Key: headers[i], Value: []byte(headers[i+1])})
		}
		return m
	}
	tests := []struct {
		name                string
		m                   kafka.Message
		mode, typ, data, id string
		err                 string
	}{
		{"structured: the JSON event's data is the payload", structured, inbox.CloudEventsStructured, "com.example.Placed", `{"n": 1}`, "e-1", ""},
		{"binary: the value is the payload, the attributes headers", binary, inbox.CloudEventsBinary, "Placed", `{"n": 1}`, "e-1", ""},
		{"structured with data_base64: the data decoded", base64Data, inbox.CloudEventsStructured, "Placed", `{"n": 1}`, "e-1", ""},
		{"a record that is no CloudEvent has none, and no id either", with(structured, `{}`), "", "", "", "", "no CloudEvent"},
		{"a structured format other than JSON", with(structured, `x`, "content-type", "application/cloudevents+avro"), "", "", "", "", "other than JSON"},
		{"a structured event without a type", with(structured, `{"id":"a","source":"/s","specversion":"1.0"}`, "content-type", "application/cloudevents+json"), "", "", "", "", "without its id, source or type"},
		{"a binary event of another spec version", with(binary, `1`, "ce_specversion", "0.3", "ce_id", "a", "ce_source", "/s", "ce_type", "t"), "", "", "", "", "specversion"},
		{"a binary event with a time that is not RFC 3339", with(binary, `1`, "ce_specversion", "1.0", "ce_id", "a", "ce_source", "/s", "ce_type", "t", "ce_time", "yesterday"), "", "", "", "", "RFC 3339"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := inbox.ParseDelivery(tt.m)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseDelivery: %+v, %v; want an error saying %q", d, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.CloudEvent == nil || d.CloudEvent.Mode != tt.mode || d.EventType != tt.typ || string(d.Payload) != tt.data || d.ID != tt.id ||
				!d.CloudEvent.Time.Equal(ev.Tx.CommitTime.Truncate(time.Millisecond)) || d.CloudEvent.Source != "/outbox-relay/order" {
				t.Errorf("delivery %+v, CloudEvent %+v; want mode %s, type %s, payload %s, id %s", d, d.CloudEvent, tt.mode, tt.typ, tt.data, tt.id)
			}
		})
	}
}
