package redrive

import (
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

func TestADeadLetterBecomesTheRecordTheRelayMeantToPublish(t *testing.T) {
	dead := func(reason string, extra ...kafka.Header) kafka.Message {
		return kafka.Message{Topic: "outbox.dead-letter", Key: []byte("o-1"), Value: []byte(`{"big":true}`), Headers: append([]kafka.Header{
			{Key: "id", Value: []byte("e-1")},
			{Key: "event_type", Value: []byte("OrderPlaced")},
			{Key: "aggregate_type", Value: []byte("order")},
			{Key: "aggregate_version", Value: []byte("3")},
			{Key: "tenant", Value: []byte("acme")},
			{Key: sink.HeaderDLQTopic, Value: []byte("outbox.event.order")},
			{Key: sink.HeaderDLQKey, Value: []byte("o-1")},
			{Key: sink.HeaderDLQReason, Value: []byte(reason)},
			{Key: sink.HeaderDLQError, Value: []byte("too large")},
			{Key: sink.HeaderDLQLSN, Value: []byte("0/16B3748")},
		}, extra...)}
	}
	headers := func(m kafka.Message) string {
		var s []string
		for _, h := range m.Headers {
			s = append(s, h.Key+"="+string(h.Value))
		}
		return strings.Join(s, " ")
	}
	cases := []struct {
		name        string
		m           kafka.Message
		cfg         Config
		wantKey     string
		wantHeaders string
		wantErr     string
	}{
		{"key, value and headers are the original's, the dead-letter headers gone", dead(sink.ReasonTooLarge), Config{},
			"o-1", "id=e-1 event_type=OrderPlaced aggregate_type=order aggregate_version=3 tenant=acme outbox.redrive=true", ""},
		{"built-in headers the relay did not send are dropped, the key encoded as the relay does",
			dead(sink.ReasonRejected), Config{BuiltinHeaders: []string{"id"}, KeyEncoding: record.JSONString},
			`"o-1"`, "id=e-1 aggregate_version=3 tenant=acme outbox.redrive=true", ""},
		{"a key with Connect's schema is the relay's key, so it goes back to the same partition",
			dead(sink.ReasonRejected), Config{KeyEncoding: record.JSONWithSchema},
			`{"schema":{"type":"string","optional":false},"payload":"o-1"}`, "id=e-1 event_type=OrderPlaced aggregate_type=order aggregate_version=3 tenant=acme outbox.redrive=true", ""},
		{"a payload reference cannot go back", dead(sink.ReasonTooLarge, kafka.Header{Key: "outbox.dlq.payload_bytes", Value: []byte("9999999")}),
			Config{}, "", "", "replay the event by id"},
		{"malformed headers cannot go back", dead(sink.ReasonBadHeaders), Config{}, "", "", "fix the row's headers"},
		{"an incomplete row cannot go back", dead(sink.ReasonSchemaMismatch), Config{}, "", "", "incomplete"},
		{"an invalid message cannot go back: its value is the message's content, not a payload", dead(sink.ReasonInvalidMessage), Config{}, "", "", "not an outbox event"},
		{"a refused route never goes back", dead(sink.ReasonTopicNotAllowed), Config{}, "", "", "never goes there"},
		{"an event that could not be a CloudEvent cannot go back: its value lacks the envelope", dead(sink.ReasonInvalidCloudEvent), Config{}, "", "", "could not be a CloudEvent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.cfg.BuiltinHeaders == nil {
				c.cfg.BuiltinHeaders = record.BuiltinHeaders
			}
			got, err := original(c.m, c.cfg)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want it to say %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Topic != "outbox.event.order" || string(got.Key) != c.wantKey || string(got.Value) != `{"big":true}` || headers(got) != c.wantHeaders {
				t.Fatalf("got topic %s key %s value %s headers %s; want key %s headers %s", got.Topic, got.Key, got.Value, headers(got), c.wantKey, c.wantHeaders)
			}
		})
	}
}

func TestADeadLetterGoesBackOnlyWhereTheRoutingSendsItNow(t *testing.T) {
	dead := func(topic, aggregateType string) kafka.Message {
		return kafka.Message{Headers: []kafka.Header{{Key: record.HeaderID, Value: []byte("e-1")},
			{Key: record.HeaderAggregateType, Value: []byte(aggregateType)}, {Key: sink.HeaderDLQTopic, Value: []byte(topic)}}}
	}
	routed, err := newTargets(Config{DeadLetterTopic: "dlq", LedgerTopic: "dlq.redriven", PositionsTopic: "relay.positions", Route: &record.Options{}})
	if err != nil {
		t.Fatal(err)
	}
	allowing, err := newTargets(Config{DeadLetterTopic: "dlq", LedgerTopic: "dlq.redriven",
		Route: &record.Options{TopicTemplate: "{aggregate_type}", TopicAllow: []string{"orders.*"}}})
	if err != nil {
		t.Fatal(err)
	}
	bare, err := newTargets(Config{DeadLetterTopic: "dlq", LedgerTopic: "dlq.redriven", PositionsTopic: "relay.positions"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		t       *targets
		m       kafka.Message
		wantErr string
	}{
		{"a dead letter the routing sends to its original topic goes back", routed, dead("outbox.event.order", "order"), ""},
		{"a dead letter the routing sends elsewhere stays", routed, dead("orders.order", "order"), "give redrive the relay's configuration"},
		{"a dead letter the allowlist refuses stays", allowing, dead("connect-configs", "connect-configs"), "no topic outbox rows may reach"},
		{"a dead letter the allowlist allows goes back", allowing, dead("orders.eu", "orders.eu"), ""},
		{"without the routing, the positions topic is refused", bare, dead("relay.positions", "x"), "reserved"},
		{"without the routing, the ledger is refused", bare, dead("dlq.redriven", "x"), "reserved"},
		{"without the routing, an underscore topic is refused", bare, dead("_schemas", "x"), "reserved"},
		{"without the routing, another topic goes back", bare, dead("orders", "x"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic, err := tt.t.of(tt.m, headerValue(tt.m, sink.HeaderDLQTopic))
			if tt.wantErr == "" {
				if err != nil || topic != headerValue(tt.m, sink.HeaderDLQTopic) {
					t.Fatalf("of = %q, %v; want its original topic", topic, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("of = %q, %v; want an error saying %q", topic, err, tt.wantErr)
			}
		})
	}
}
