package record

import (
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// Placeholders a topic template may use.
const (
	placeholderAggregateType = "{aggregate_type}"
	placeholderEventType     = "{event_type}"
)

// router turns events into topic names. Aggregate and event types are few, so names are cached and
// the hot path does not allocate.
type router struct {
	template string
	byEvent  bool         // the template uses {event_type}, so the cache key must include it
	regex    *regexRouter // routes instead of the template when set (route.topic.regex)
	allow    *topicAllow  // the topics a row may reach
	cache    map[string]string
}

func newRouter(template string) (*router, error) {
	if !strings.Contains(template, placeholderAggregateType) && !strings.Contains(template, placeholderEventType) {
		if err := ValidTopic(template); err != nil {
			return nil, err
		}
	}
	return &router{
		template: template,
		byEvent:  strings.Contains(template, placeholderEventType),
		cache:    make(map[string]string),
	}, nil
}

func (r *router) topic(ev *decoder.Event) (string, error) {
	// Before the cache: a NULL and an empty aggregate type share the cache key "".
	if ev.AggregateType == nil && (r.regex != nil || strings.Contains(r.template, placeholderAggregateType)) {
		return "", fmt.Errorf("event %s has a NULL aggregate type, so topic template %q has no value for %s",
			ev.ID, r.template, placeholderAggregateType)
	}
	if !r.byEvent {
		if t, ok := r.cache[string(ev.AggregateType)]; ok {
			return t, nil
		}
	}
	var t string
	if r.regex != nil {
		var ok bool
		if t, ok = r.regex.route(string(ev.AggregateType)); !ok {
			return t, fmt.Errorf("event %s: aggregate type %q does not match topic_regex, and topic_regex_passthrough is off: %w",
				ev.ID, ev.AggregateType, ErrTopicNotAllowed)
		}
	} else {
		// One pass, so a type that spells a placeholder ("{event_type}") is not expanded again.
		t = strings.NewReplacer(placeholderAggregateType, string(ev.AggregateType),
			placeholderEventType, string(ev.EventType)).Replace(r.template)
	}
	if err := ValidTopic(t); err != nil {
		// The name still goes back with the error: the dead-letter record and the halt log report
		// it as the event's original topic.
		return t, err
	}
	if err := r.allow.check(t); err != nil {
		return t, fmt.Errorf("event %s routes to %w", ev.ID, err)
	}
	// Cache only by aggregate type, and only so many: a bad producer could invent a type per event.
	if !r.byEvent && len(r.cache) < 10000 {
		r.cache[string(ev.AggregateType)] = t
	}
	return t, nil
}

// ValidTopic applies Kafka's rules for topic names, so a bad aggregate type is caught before it
// reaches the producer.
func ValidTopic(t string) error {
	if t == "" || t == "." || t == ".." {
		return fmt.Errorf("topic name %q is not allowed", t)
	}
	if len(t) > 249 {
		return fmt.Errorf("topic name %.40q... is %d characters, Kafka allows 249", t, len(t))
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q contains %q; Kafka allows only letters, digits, '.', '_' and '-'", t, c)
		}
	}
	return nil
}
