package record

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
)

func TestARowReachesOnlyTheTopicsTheAllowlistAllows(t *testing.T) {
	regex := Options{TopicRegex: `(?<routedByValue>order|customer)`}
	passthrough := Options{TopicRegex: `(?<routedByValue>order|customer)`, TopicRegexPassthrough: true}
	bare := Options{TopicTemplate: "{aggregate_type}", TopicAllow: []string{"orders.*", "customers"}}
	tests := []struct {
		name          string
		o             Options
		aggregateType string
		want          string // "" when refused
	}{
		{"the default template reaches its own prefix", Options{}, "Order", "outbox.event.Order"},
		{"the default template never reaches a name starting with an underscore", Options{TopicTemplate: "{aggregate_type}", TopicAllow: []string{"*"}}, "_schemas", ""},
		{"a denied topic is refused even where * allows everything", Options{TopicTemplate: "{aggregate_type}", TopicAllow: []string{"*"}, TopicDeny: []string{"connect-configs"}}, "connect-configs", ""},
		{"a denied pattern is refused like a denied name", Options{TopicTemplate: "{aggregate_type}", TopicAllow: []string{"*"}, TopicDeny: []string{"connect-*"}}, "connect-cluster-configs", ""},
		{"a denied pattern leaves other names alone", Options{TopicTemplate: "{aggregate_type}", TopicAllow: []string{"*"}, TopicDeny: []string{"connect-*"}}, "orders", "orders"},
		{"a bare aggregate type template reaches an allowed pattern", bare, "orders.eu", "orders.eu"},
		{"a bare aggregate type template reaches an allowed name", bare, "customers", "customers"},
		{"a bare aggregate type template does not reach Kafka Connect's config topic", bare, "connect-configs", ""},
		{"a bare aggregate type template does not reach a schema registry's topic", bare, "_schemas", ""},
		{"a regex route that matches reaches the replacement", regex, "order", "outbox.event.order"},
		{"a regex that does not match refuses the event", regex, "connect-configs", ""},
		{"a regex that does not match refuses an underscore name too", regex, "_schemas", ""},
		{"a passthrough regex still keeps to the replacement's prefix", passthrough, "connect-configs", ""},
		{"a passthrough regex lets an allowed raw value through", passthrough, "outbox.event.legacy", "outbox.event.legacy"},
		{"a fixed template allows only itself", Options{TopicTemplate: "events"}, "x", "events"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBuilder(t, tt.o)
			for range 2 { // the second time from the cache, where there is one
				r := b.Build(&decoder.Event{ID: []byte("e1"), AggregateType: []byte(tt.aggregateType), AggregateID: []byte("a")}, time.Now())
				if tt.want == "" {
					if !errors.Is(r.TopicErr, ErrTopicNotAllowed) {
						t.Fatalf("topic %q, error %v: want the route refused (ErrTopicNotAllowed)", r.Msg.Topic, r.TopicErr)
					}
					continue
				}
				if r.TopicErr != nil || r.Msg.Topic != tt.want {
					t.Fatalf("topic %q (%v), want %q", r.Msg.Topic, r.TopicErr, tt.want)
				}
			}
		})
	}
}

func TestDefaultTopicAllowIsTheRoutingsLiteralPrefix(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"the default template", Options{}, "outbox.event.*"},
		{"a template with two placeholders", Options{TopicTemplate: "svc.{event_type}.{aggregate_type}"}, "svc.*"},
		{"a fixed template", Options{TopicTemplate: "events"}, "events"},
		{"a template that starts with a placeholder", Options{TopicTemplate: "{aggregate_type}.events"}, "*"},
		{"the default replacement", Options{TopicRegex: "(?<routedByValue>.*)"}, "outbox.event.*"},
		{"a fixed replacement", Options{TopicRegex: ".*", TopicReplacement: "domain.events"}, "domain.events"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DefaultTopicAllow(tt.o); len(got) != 1 || got[0] != tt.want {
				t.Fatalf("DefaultTopicAllow = %v, want [%s]", got, tt.want)
			}
		})
	}
}

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"*", "anything", true},
		{"orders.*", "orders.", true},
		{"orders.*", "orders.eu", true},
		{"orders.*", "orders", false},
		{"orders.*", "xorders.eu", false},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
		{"*.events", "eu.orders.events", true},
		{"exact", "exact", true},
		{"exact", "exactly", false},
	}
	for _, tt := range tests {
		if got := globMatch(tt.pattern, tt.name); got != tt.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}

// TestAnExtraHeaderCannotTakeTheDeadLetterPrefix: rows may not add outbox.dlq.* headers through
// their headers column, and not through a column placed as a header under such an alias either
// (redrive acts on outbox.dlq.partition, which the relay leaves out when it chose none).
func TestAnExtraHeaderCannotTakeTheDeadLetterPrefix(t *testing.T) {
	for _, o := range []Options{
		{ExtraHeaders: []string{"outbox.dlq.partition"}},
		{ExtraHeaders: []string{"shard", "outbox.dlq.reason"}, ExtraPlacement: []Placement{PlaceEnvelope, PlaceHeader}},
	} {
		if _, err := NewBuilder(o); err == nil || !strings.Contains(err.Error(), DeadLetterHeaderPrefix) {
			t.Errorf("NewBuilder with extra headers %v: %v, want an error naming the prefix %s", o.ExtraHeaders, err, DeadLetterHeaderPrefix)
		}
	}
	if _, err := NewBuilder(Options{ExtraHeaders: []string{"outbox.dlq.reason"}, ExtraPlacement: []Placement{PlaceEnvelope}}); err != nil {
		t.Errorf("a column placed in the envelope under that name is no header: %v", err)
	}
}
