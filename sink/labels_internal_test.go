package sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

func TestTopicLabelsKeepTheFirstTopicsAndCountTheRestTogether(t *testing.T) {
	l := newTopicLabels()
	for i := range maxTopicLabels {
		if got := l.of(fmt.Sprintf("t%d", i)); got != fmt.Sprintf("t%d", i) {
			t.Fatalf("topic %d labelled %q", i, got)
		}
	}
	for _, tc := range []struct{ topic, want string }{
		{"t0", "t0"},
		{"one-too-many", otherTopics},
		{"one too many", invalidTopic},
		{"", invalidTopic},
		{"t99", "t99"},
	} {
		if got := l.of(tc.topic); got != tc.want {
			t.Errorf("%q labelled %q, want %q", tc.topic, got, tc.want)
		}
	}
}

func TestTopicUnavailableCountsTheTopicsBeyondTheCapInOneSeries(t *testing.T) {
	vec := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "topic_unavailable"}, []string{"topic"})
	l := newTopicLabels()
	for i := range maxTopicLabels {
		l.of(fmt.Sprintf("t%d", i))
	}
	w := &topicWaits{log: zap.NewNop(), gauge: vec, labels: l, waiting: make(map[string]*topicWait)}
	waitLong := func(topic string) {
		w.waiting[topic] = &topicWait{since: time.Now().Add(-time.Minute)}
		w.n.Add(1)
		w.unavailable(topic, kafka.UnknownTopicOrPartition)
	}
	waitLong("t7")
	waitLong("x1")
	waitLong("x2")
	if got := series(t, vec); len(got) != 2 || got["t7"] != 1 || got[otherTopics] != 2 {
		t.Fatalf("series %v, want t7 1 and (other) 2", got)
	}
	w.available("x1")
	w.available("t7")
	if got := series(t, vec); len(got) != 1 || got[otherTopics] != 1 {
		t.Fatalf("after two topics came: series %v, want (other) 1", got)
	}
	w.available("x2")
	if got := series(t, vec); len(got) != 0 {
		t.Fatalf("series %v left once every topic came", got)
	}
}

// series reads a gauge vector's series: label value -> value.
func series(t *testing.T, vec *prometheus.GaugeVec) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	vec.Collect(ch)
	close(ch)
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		out[d.GetLabel()[0].GetValue()] = d.GetGauge().GetValue()
	}
	return out
}
