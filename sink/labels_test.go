package sink_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestTheTopicLabelIsBoundedHoweverManyTopicsTheRowsMint: topics come from the rows, so bad rows
// could mint a label value, and a time series, per event. Here 130 events, each routed to a topic
// of its own and each too large, are dead-lettered: the first 100 topics keep their names, the
// other 30 are counted under "(other)"; 20 events whose aggregate type makes no valid topic name
// are counted under "(invalid)", never under the name.
func TestTheTopicLabelIsBoundedHoweverManyTopicsTheRowsMint(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	dlq := testenv.UniqueName(t, "dlq")
	prefix := testenv.UniqueName(t, "agg")
	s := readySink(t, k.Brokers(), sink.Config{DeadLetterTopic: dlq, MaxMessageBytes: 2000})
	a := &acker{}
	big := []byte(`"` + strings.Repeat("x", 3000) + `"`)
	for i := range 130 {
		s.publish(t, newEvent(fmt.Sprintf("big-%d", i), []byte(fmt.Sprintf("%s_%03d", prefix, i)), "K", "Big", big), a)
	}
	for i := range 20 {
		s.publish(t, newEvent(fmt.Sprintf("bad-%d", i), []byte(fmt.Sprintf("not a topic #%d", i)), "K", "Bad", []byte(`{}`)), a)
	}
	eventually(t, 60*time.Second, "every event dead-lettered", func() bool { return a.n.Load() == 150 })

	families, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "outbox_relay_events_dead_lettered_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "topic" {
					values[l.GetValue()] = m.Counter.GetValue()
				}
			}
		}
	}
	if len(values) != 102 {
		t.Errorf("%d topic label values, want 102 (100 topics, (other), (invalid))", len(values))
	}
	if values["(other)"] != 30 || values["(invalid)"] != 20 {
		t.Errorf("(other) %v and (invalid) %v, want 30 and 20", values["(other)"], values["(invalid)"])
	}
	for v := range values {
		if strings.Contains(v, " ") {
			t.Errorf("label value %q is not a topic name", v)
		}
	}
	if got := s.metric(t, "outbox_relay_events_dead_lettered_total"); got != 150 {
		t.Errorf("dead-lettered %v in all, want 150", got)
	}
	s.mustClose(t)
}
