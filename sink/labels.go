package sink

import (
	"sync"

	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Topics come from the outbox rows (topic_template over aggregate_type and event_type), so a
// producer writing bad rows could mint a new topic per event, and each topic label value is a
// time series the relay and Prometheus keep for ever. The topic label of the relay's metrics is
// bounded: the first maxTopicLabels topics (in order of first use since the start) keep their
// name, later ones are counted together under otherTopics, and a name Kafka would not accept
// (an event dead-lettered for it) is never a label value.
const maxTopicLabels = 100

// Label values that cannot be topic names (Kafka allows no parentheses), so they never clash.
const (
	otherTopics  = "(other)"
	invalidTopic = "(invalid)"
)

// topicLabels hands out the topic label values. It is shared by the partition goroutines.
type topicLabels struct {
	mu    sync.Mutex
	known map[string]bool
}

func newTopicLabels() *topicLabels { return &topicLabels{known: make(map[string]bool)} }

// of returns the label value for topic.
func (l *topicLabels) of(topic string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.known[topic] {
		return topic
	}
	if record.ValidTopic(topic) != nil {
		return invalidTopic
	}
	if len(l.known) < maxTopicLabels {
		l.known[topic] = true
		return topic
	}
	return otherTopics
}
