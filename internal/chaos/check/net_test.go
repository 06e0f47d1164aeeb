package check

import (
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// The network faults on a relay's path to Kafka: a one-way cut (a produce appended, its
// acknowledgement lost) and a cut healed with the connections kept. While either lasts the relay
// gets no acknowledgement, so the slot's position stands still as when the broker is away: a kill
// after it replays from before it, and that replay is excused as one that waited for Kafka. Under
// exactly-once a repeat that a read_committed consumer reads is a duplicate whatever the fault.
func TestAOneWayCutOfKafkaKeepsAReplayWaitingAndExcusesNoExactlyOnceDuplicate(t *testing.T) {
	tests := []struct {
		name     string
		delivery string
		kind     string
		from, to float64 // the network fault on r1
		again    float64 // when e1 (first at 1.2 s) is appended again; a kill9 of r1, the leader, at 62 s
		want     bool    // a duplicate violation
	}{
		{"a kill after a one-way cut of Kafka replays from before the cut", history.AtLeastOnce, "net-oneway-kafka", 5, 50, 80, false},
		{"a kill after a cut healed open replays from before the cut", history.AtLeastOnce, "cut-heal-open", 5, 50, 80, false},
		{"a replay past the window after the kill is still a duplicate", history.AtLeastOnce, "net-oneway-kafka", 5, 50, 90, true},
		{"exactly-once, a repeat read_committed reads is a duplicate", history.ExactlyOnce, "net-oneway-kafka", 5, 50, 80, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := clean(tt.delivery)
			b.fault(tt.kind, "r1", tt.from, tt.to)
			b.fault("kill9", "r1", 62, 62) // r1 leads again from 41 on
			b.publish(tt.again, "e1")
			h := b.done(bothConsumers)
			vs := Check(h)
			got := slices.ContainsFunc(vs, func(v Violation) bool { return v.Rule == RuleDuplicate })
			if got != tt.want {
				t.Errorf("duplicate violation: %v; want %v\n%s", got, tt.want, Format(h, vs, 0))
			}
		})
	}
}
