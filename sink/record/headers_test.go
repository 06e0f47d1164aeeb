package record

import (
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
)

func TestHeaders(t *testing.T) {
	base := func() *decoder.Event {
		return &decoder.Event{ID: []byte("e1"), AggregateType: []byte("Order"), AggregateID: []byte("o1"),
			EventType: []byte("Created"), Payload: []byte(`{"x":1}`)}
	}
	with := func(f func(*decoder.Event)) *decoder.Event { e := base(); f(e); return e }
	fixed := []string{"id=e1", "event_type=Created", "aggregate_type=Order"}
	tests := []struct {
		name      string
		ev        *decoder.Event
		extra     []string
		want      []string // "key=value", in order
		wantError string
	}{
		{"id, event type and aggregate type come first", base(), nil, fixed, ""},
		{"a NULL event type and aggregate type still give the three headers, empty",
			with(func(e *decoder.Event) { e.EventType, e.AggregateType = nil, nil }), nil,
			[]string{"id=e1", "event_type=", "aggregate_type="}, ""},
		{"extra columns follow in configured order",
			with(func(e *decoder.Event) { e.Extra = [][]byte{[]byte("t-1"), []byte("u-9")} }), []string{"trace_id", "user"},
			append(fixed, "trace_id=t-1", "user=u-9"), ""},
		{"a NULL extra column is left out",
			with(func(e *decoder.Event) { e.Extra = [][]byte{nil, []byte("u-9")} }), []string{"trace_id", "user"},
			append(fixed, "user=u-9"), ""},
		{"an empty extra column is kept as an empty header",
			with(func(e *decoder.Event) { e.Extra = [][]byte{{}} }), []string{"trace_id"},
			append(fixed, "trace_id="), ""},
		{"the aggregate version follows the built-in headers, before extra columns and the JSON headers",
			with(func(e *decoder.Event) {
				e.AggregateVersion = []byte("42")
				e.Extra = [][]byte{[]byte("t-1")}
				e.Headers = []byte(`{"k":"v"}`)
			}), []string{"trace_id"},
			append(fixed, "aggregate_version=42", "trace_id=t-1", "k=v"), ""},
		{"a NULL aggregate version is left out",
			with(func(e *decoder.Event) { e.AggregateVersion = nil }), nil, fixed, ""},
		{"an aggregate version that is not an integer is an error",
			with(func(e *decoder.Event) { e.AggregateVersion = []byte("4.5") }), nil, nil, "columns.aggregate_version"},
		{"JSON object members become headers in document order",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"z":"last-letter","a":"first-letter","m":"middle"}`) }), nil,
			append(fixed, "z=last-letter", "a=first-letter", "m=middle"), ""},
		{"extra columns come before the JSON headers",
			with(func(e *decoder.Event) {
				e.Extra = [][]byte{[]byte("t-1")}
				e.Headers = []byte(`{"k":"v"}`)
			}), []string{"trace_id"},
			append(fixed, "trace_id=t-1", "k=v"), ""},
		{"JSON strings are unquoted and unescaped",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"s":"a \"quoted\" \u00e9 line\nnext","u":"日本"}`) }), nil,
			append(fixed, "s=a \"quoted\" é line\nnext", "u=日本"), ""},
		{"numbers, booleans, objects and arrays keep their JSON text",
			with(func(e *decoder.Event) {
				e.Headers = []byte(`{"n": 12.50, "big": 12345678901234567890, "b": true, "o": {"x": [1, 2]}, "arr": ["a", null]}`)
			}), nil,
			append(fixed, "n=12.50", "big=12345678901234567890", "b=true", `o={"x": [1, 2]}`, `arr=["a", null]`), ""},
		{"null members are left out",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"a":null,"b":"x","c":null}`) }), nil,
			append(fixed, "b=x"), ""},
		{"an empty string member is kept as an empty header",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"a":""}`) }), nil,
			append(fixed, "a="), ""},
		{"an empty object adds nothing",
			with(func(e *decoder.Event) { e.Headers = []byte(`{}`) }), nil, fixed, ""},
		{"JSON null adds no headers",
			with(func(e *decoder.Event) { e.Headers = []byte(`null`) }), nil, fixed, ""},
		{"JSON null with whitespace adds no headers",
			with(func(e *decoder.Event) { e.Headers = []byte(" null ") }), nil, fixed, ""},
		{"a NULL headers column adds no headers",
			with(func(e *decoder.Event) { e.Headers = nil }), nil, fixed, ""},
		{"a JSON array is an error",
			with(func(e *decoder.Event) { e.Headers = []byte(`["a","b"]`) }), nil, nil, "JSON object"},
		{"a JSON string is an error",
			with(func(e *decoder.Event) { e.Headers = []byte(`"a"`) }), nil, nil, "JSON object"},
		{"a JSON number is an error",
			with(func(e *decoder.Event) { e.Headers = []byte(`42`) }), nil, nil, "JSON object"},
		{"malformed JSON is an error",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"a":}`) }), nil, nil, "headers column"},
		{"a truncated JSON object is an error",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"a":"x"`) }), nil, nil, "headers column"},
		{"text after the JSON object is an error",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"a":"x"} junk`) }), nil, nil, "junk"},
		{"a second JSON object is an error",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"a":"x"}{"b":"y"}`) }), nil, nil, "one JSON object"},
		{"whitespace around the JSON object is fine",
			with(func(e *decoder.Event) { e.Headers = []byte(" \n{\"a\":\"x\"}\n ") }), nil, append(fixed, "a=x"), ""},
		{"a member with the dead-letter headers' prefix is an error: redrive trusts those",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"outbox.dlq.original_topic":"_schemas"}`) }), nil, nil, "outbox.dlq."},
		{"a member named like replay's mark is an error: the record would pass for one the operator published again",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"outbox.replay":"true"}`) }), nil, nil, "outbox.replay"},
		{"a member named like redrive's mark is an error",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"outbox.redrive":"true"}`) }), nil, nil, "outbox.redrive"},
		{"a member that only resembles the prefix is fine",
			with(func(e *decoder.Event) { e.Headers = []byte(`{"outbox.dlqx":"y"}`) }), nil, append(fixed, "outbox.dlqx=y"), ""},
		{"an empty headers value is an error",
			with(func(e *decoder.Event) { e.Headers = []byte{} }), nil, nil, "JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hs, err := headers(tt.ev, tt.extra)
			if tt.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantError) {
					t.Fatalf("headers = %v, %v; want an error containing %q", hs, err, tt.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := headerList(hs); strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Fatalf("headers\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func headerList(hs []kafka.Header) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Key + "=" + string(h.Value)
	}
	return out
}

// TestHeadersHoldLittleMoreThanTheyUse: the headers are allocated at once at the size the headers
// column suggests, and they are kept until Kafka acknowledges the event, outside what the in-flight
// window counts: colons in the values must not make that size grow beyond a few spare slots.
func TestHeadersHoldLittleMoreThanTheyUse(t *testing.T) {
	tests := []struct {
		name    string
		headers string
	}{
		{"jsonb's own format", `{"a": "1", "b": "2", "c": "3"}`},
		{"colons in a value", `{"url": "` + strings.Repeat("a:b:", 500) + `"}`},
		{"escaped quotes and colons in a value", `{"v": "` + strings.Repeat(`\":`, 500) + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := &decoder.Event{ID: []byte("e1"), Headers: []byte(tt.headers)}
			hs, err := buildHeaders(ev, []string{HeaderID}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if spare := cap(hs) - len(hs); spare > 16 {
				t.Fatalf("%d headers in a slice of %d: %d slots spare", len(hs), cap(hs), spare)
			}
		})
	}
}
