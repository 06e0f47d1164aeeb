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
