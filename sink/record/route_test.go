package record

import (
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
)

func TestValidTopic(t *testing.T) {
	tests := []struct {
		name  string
		topic string
		ok    bool
	}{
		{"a plain name is allowed", "orders", true},
		{"letters digits dots underscores and dashes are allowed", "Outbox.event_Order-2", true},
		{"a name of 249 characters is allowed", strings.Repeat("a", 249), true},
		{"a name of 250 characters is rejected", strings.Repeat("a", 250), false},
		{"the empty name is rejected", "", false},
		{"a single dot is rejected", ".", false},
		{"two dots are rejected", "..", false},
		{"three dots are allowed", "...", true},
		{"a name starting with a dot is allowed", ".orders", true},
		{"a space is rejected", "bad type", false},
		{"an exclamation mark is rejected", "bad!", false},
		{"a slash is rejected", "a/b", false},
		{"a colon is rejected", "a:b", false},
		{"a braced placeholder left in the name is rejected", "outbox.{aggregate_type}", false},
		{"non-ASCII letters are rejected", "café", false},
		{"a NUL byte is rejected", "a\x00b", false},
		{"a newline is rejected", "a\nb", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidTopic(tt.topic)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidTopic(%q) = %v, want ok=%v", tt.topic, err, tt.ok)
			}
			if err != nil && err.Error() == "" {
				t.Fatal("empty error message")
			}
		})
	}
}

func TestNewRouterRejectsAnInvalidFixedTopic(t *testing.T) {
	tests := []struct {
		name     string
		template string
		ok       bool
	}{
		{"a valid fixed topic is accepted", "events", true},
		{"an invalid fixed topic is rejected", "bad topic", false},
		{"a template with the aggregate type placeholder is accepted", "outbox.event.{aggregate_type}", true},
		{"a template with only the event type placeholder is accepted", "events.{event_type}", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newRouter(tt.template)
			if (err == nil) != tt.ok {
				t.Fatalf("newRouter(%q) = %v, want ok=%v", tt.template, err, tt.ok)
			}
		})
	}
}

func ev(aggType, eventType []byte) *decoder.Event {
	return &decoder.Event{ID: []byte("id-1"), AggregateType: aggType, AggregateID: []byte("agg-1"), EventType: eventType, Payload: []byte("{}")}
}

func TestRouterTopic(t *testing.T) {
	tests := []struct {
		name      string
		template  string
		events    []*decoder.Event // routed in order through one router; the last one is checked
		want      string
		wantError string // substring; "" means success
	}{
		{"the default template puts the aggregate type after the prefix", "outbox.event.{aggregate_type}",
			[]*decoder.Event{ev([]byte("Order"), []byte("Created"))}, "outbox.event.Order", ""},
		{"the event type placeholder is replaced", "events.{event_type}",
			[]*decoder.Event{ev([]byte("Order"), []byte("Created"))}, "events.Created", ""},
		{"both placeholders are replaced", "{aggregate_type}.{event_type}",
			[]*decoder.Event{ev([]byte("Order"), []byte("Created"))}, "Order.Created", ""},
		{"a placeholder used twice is replaced twice", "{aggregate_type}.{aggregate_type}",
			[]*decoder.Event{ev([]byte("Order"), []byte("Created"))}, "Order.Order", ""},
		{"a template without placeholders is used as it is", "all-events",
			[]*decoder.Event{ev([]byte("Order"), []byte("Created"))}, "all-events", ""},
		{"a NULL aggregate type is fine when the template does not use it", "events.{event_type}",
			[]*decoder.Event{ev(nil, []byte("Created"))}, "events.Created", ""},
		{"a NULL aggregate type is fine for a fixed topic", "all-events",
			[]*decoder.Event{ev(nil, []byte("Created"))}, "all-events", ""},
		{"a NULL aggregate type is an error when the template uses it", "outbox.event.{aggregate_type}",
			[]*decoder.Event{ev(nil, []byte("Created"))}, "", "NULL aggregate type"},
		{"a NULL aggregate type is an error even after an empty one was cached", "outbox.event.{aggregate_type}",
			[]*decoder.Event{ev([]byte{}, []byte("Created")), ev(nil, []byte("Created"))}, "", "NULL aggregate type"},
		{"an empty aggregate type leaves the prefix", "outbox.event.{aggregate_type}",
			[]*decoder.Event{ev([]byte{}, []byte("Created"))}, "outbox.event.", ""},
		{"an aggregate type with a space makes an invalid topic", "outbox.event.{aggregate_type}",
			[]*decoder.Event{ev([]byte("bad type!"), []byte("Created"))}, "", "bad type!"},
		{"an event type with a slash makes an invalid topic", "events.{event_type}",
			[]*decoder.Event{ev([]byte("Order"), []byte("a/b"))}, "", "a/b"},
		{"an aggregate type that is itself a placeholder is not expanded again", "outbox.{aggregate_type}",
			[]*decoder.Event{ev([]byte("{event_type}"), []byte("Created"))}, "", "{event_type}"},
		{"an aggregate type that is itself a placeholder is not expanded again with both placeholders", "{aggregate_type}.{event_type}",
			[]*decoder.Event{ev([]byte("{event_type}"), []byte("Created"))}, "", "{event_type}"},
		{"a too long aggregate type makes an invalid topic", "outbox.event.{aggregate_type}",
			[]*decoder.Event{ev([]byte(strings.Repeat("x", 240)), []byte("Created"))}, "", "249"},
		{"the cache by aggregate type is not used when the event type varies", "{aggregate_type}.{event_type}",
			[]*decoder.Event{ev([]byte("Order"), []byte("Created")), ev([]byte("Order"), []byte("Paid"))}, "Order.Paid", ""},
		{"a cached aggregate type routes the same way again", "outbox.event.{aggregate_type}",
			[]*decoder.Event{ev([]byte("Order"), []byte("Created")), ev([]byte("Order"), []byte("Paid"))}, "outbox.event.Order", ""},
		{"an invalid aggregate type is rejected every time", "outbox.event.{aggregate_type}",
			[]*decoder.Event{ev([]byte("bad type"), []byte("Created")), ev([]byte("bad type"), []byte("Created"))}, "", "bad type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := newRouter(tt.template)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, e := range tt.events {
				got, err = r.topic(e)
			}
			if tt.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantError) {
					t.Fatalf("topic = %q, %v; want an error containing %q", got, err, tt.wantError)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("topic = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestRouterCacheIsBounded(t *testing.T) {
	r, err := newRouter("t.{aggregate_type}")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10050; i++ {
		typ := []byte("type" + strconv.Itoa(i))
		if _, err := r.topic(ev(typ, []byte("e"))); err != nil {
			t.Fatal(err)
		}
	}
	if len(r.cache) > 10000 {
		t.Fatalf("cache holds %d topics, want at most 10000", len(r.cache))
	}
}
