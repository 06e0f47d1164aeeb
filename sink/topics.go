package sink

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// A topic the relay cannot write to (missing while the brokers do not auto-create topics, or not
// authorized) stalls every aggregate, not only its own: events are read in WAL order and the
// in-flight caps are global, so once the events waiting for that topic fill the window, nothing
// else is read. Isolating the topic would need unbounded buffering or breaking the slot's
// all-before-it rule, so the relay waits, and says so loudly: an ERROR log naming the topic and
// what to do, outbox_relay_topic_unavailable{topic}, and Stalled for /readyz.

// topicGrace is how long a topic may be unknown before it is reported: auto-creation and a new
// topic's leader election take well under it.
const topicGrace = 3 * time.Second

// topicReportEvery spaces the ERROR lines about one topic.
const topicReportEvery = 30 * time.Second

// topicWaits tracks the topics the relay waits for.
type topicWaits struct {
	log    *zap.Logger
	gauge  *prometheus.GaugeVec
	labels *topicLabels
	// others counts the reported topics beyond the label cap: their series, otherTopics, holds
	// how many there are rather than 1.
	others int

	n  atomic.Int32 // len(waiting), for the hot path
	mu sync.Mutex
	// waiting holds a topic from its first topic-level refusal until the broker answers for it.
	waiting map[string]*topicWait
}

type topicWait struct {
	since    time.Time
	err      error
	reported time.Time
	label    string // its topic_unavailable series, set once reported
}

// topicLevel reports whether err says the topic itself is unusable for now (rather than the
// broker or the network): it does not exist, or the relay may not write to it.
func topicLevel(err error) bool {
	return errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.TopicAuthorizationFailed)
}

// unavailable records a failed attempt on topic; err must be topicLevel.
func (w *topicWaits) unavailable(topic string, err error) {
	now := time.Now()
	w.mu.Lock()
	tw := w.waiting[topic]
	if tw == nil {
		tw = &topicWait{since: now}
		w.waiting[topic] = tw
		w.n.Add(1)
	}
	tw.err = err
	report := now.Sub(tw.since) >= topicGrace && now.Sub(tw.reported) >= topicReportEvery
	if report {
		tw.reported = now
		// Under mu: available deletes the series under mu too.
		if tw.label == "" {
			tw.label = w.labels.of(topic)
			if tw.label == otherTopics {
				w.others++
			}
		}
		if tw.label == otherTopics {
			w.gauge.WithLabelValues(otherTopics).Set(float64(w.others))
		} else {
			w.gauge.WithLabelValues(tw.label).Set(1)
		}
	}
	since := tw.since
	w.mu.Unlock()
	if !report {
		return
	}
	fields := []zap.Field{zap.String("topic", topic), zap.Duration("waiting_for", now.Sub(since).Round(time.Second)), zap.Error(err)}
	if errors.Is(err, producer.ErrTopicRefused) {
		w.log.Error("not authorized to write to the topic: under exactly-once its events go to the failure policy (dead-letter topic, or halt), "+
			"since every Kafka transaction would wait for them; grant the relay's principal Write and Describe on the topic", fields...)
		return
	}
	if errors.Is(err, kafka.TopicAuthorizationFailed) {
		w.log.Error("not authorized to write to the topic; retrying until the relay's principal may: grant it Write and Describe on the topic. "+
			"Every event waits behind it: order and the in-flight limits are global", fields...)
		return
	}
	w.log.Error("topic does not exist and the brokers do not create it; create it (or, for brokers that allow it, set kafka.auto_create_topics). "+
		"Every event waits behind it: order and the in-flight limits are global", fields...)
}

// available records that the broker answered for topic.
func (w *topicWaits) available(topic string) {
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	tw := w.waiting[topic]
	if tw != nil {
		delete(w.waiting, topic)
		w.n.Add(-1)
		switch {
		case tw.label == otherTopics && w.others > 1:
			w.others--
			w.gauge.WithLabelValues(otherTopics).Set(float64(w.others))
		case tw.label == otherTopics:
			w.others = 0
			w.gauge.DeleteLabelValues(otherTopics)
		case tw.label != "":
			w.gauge.DeleteLabelValues(tw.label)
		}
	}
	w.mu.Unlock()
	if tw == nil {
		return
	}
	if !tw.reported.IsZero() {
		w.log.Info("topic available; events flow again", zap.String("topic", topic),
			zap.Duration("waited", time.Since(tw.since).Round(time.Second)))
	}
}

// stalled names the longest-waiting topic past the grace period, if any.
func (w *topicWaits) stalled() (string, bool) {
	if w.n.Load() == 0 {
		return "", false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var topics []string
	for t, tw := range w.waiting {
		if time.Since(tw.since) >= topicGrace {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		return "", false
	}
	sort.Slice(topics, func(i, j int) bool { return w.waiting[topics[i]].since.Before(w.waiting[topics[j]].since) })
	t := topics[0]
	what := "it does not exist and the brokers do not create topics; every event waits behind it"
	switch err := w.waiting[t].err; {
	case errors.Is(err, producer.ErrTopicRefused):
		what = "the relay is not authorized to write to it; under exactly-once its events go to the failure policy"
	case errors.Is(err, kafka.TopicAuthorizationFailed):
		what = "the relay is not authorized to write to it; every event waits behind it"
	}
	msg := fmt.Sprintf("waiting for Kafka topic %s for %s: %s",
		t, time.Since(w.waiting[t].since).Round(time.Second), what)
	if len(topics) > 1 {
		msg += fmt.Sprintf(" (and %d more topics)", len(topics)-1)
	}
	return msg, true
}
