package producer

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
)

func TestTheMarkerCheckAsksEachLeaderOnceAndAnyBrokerForTheRest(t *testing.T) {
	cluster := protocol.Cluster{
		Brokers: map[int32]protocol.Broker{1: {ID: 1}, 2: {ID: 2}},
		Topics: map[string]protocol.Topic{
			"a": {Name: "a", Partitions: map[int32]protocol.Partition{0: {ID: 0, Leader: 1}, 1: {ID: 1, Leader: 2}, 2: {ID: 2, Leader: 1}}},
			"b": {Name: "b", Partitions: map[int32]protocol.Partition{0: {ID: 0, Leader: 2}, 1: {ID: 1, Leader: -1}}},
		},
	}
	req := newStableOffsetsRequest([]TopicPartition{{"a", 0}, {"a", 1}, {"a", 2}, {"b", 0}, {"b", 1}, {"gone", 0}})
	msgs, _, err := req.Split(cluster)
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[int32][]string)
	for _, m := range msgs {
		r := m.(*stableOffsetsRequest)
		b, _ := r.Broker(cluster)
		if b.ID != r.leader {
			t.Errorf("a request for leader %d goes to broker %d", r.leader, b.ID)
		}
		if r.IsolationLevel != 1 || r.ReplicaID != -1 {
			t.Errorf("request for %d: isolation %d, replica %d; want read_committed (1) from a consumer (-1)", r.leader, r.IsolationLevel, r.ReplicaID)
		}
		for _, tp := range r.Topics {
			for _, p := range tp.Partitions {
				if p.Timestamp != -1 || p.CurrentLeaderEpoch != -1 {
					t.Errorf("%s/%d asks timestamp %d, leader epoch %d; want the end (-1), unchecked (-1)", tp.Topic, p.Partition, p.Timestamp, p.CurrentLeaderEpoch)
				}
				got[r.leader] = append(got[r.leader], TopicPartition{tp.Topic, int(p.Partition)}.String())
			}
		}
	}
	want := map[int32][]string{1: {"a/0", "a/2"}, 2: {"a/1", "b/0"}, -1: {"b/1", "gone/0"}}
	if len(msgs) != len(want) {
		t.Errorf("%d requests, want %d (one per leader, one for the partitions without a known one)", len(msgs), len(want))
	}
	for leader, tps := range want {
		if !slices.Equal(got[leader], tps) {
			t.Errorf("the request for leader %d holds %v, want %v", leader, got[leader], tps)
		}
	}
}

func TestTheMarkerCheckKeepsWhatAnsweredWhenABrokerDoesNot(t *testing.T) {
	down := errors.New("connection refused")
	answer := &listoffsets.Response{Topics: []listoffsets.ResponseTopic{{Topic: "a", Partitions: []listoffsets.ResponsePartition{{Partition: 0, Offset: 7}}}}}
	tests := []struct {
		name    string
		results []any
		topics  int
		err     error
	}{
		{"one broker of two answers: its partitions are kept", []any{answer, down}, 1, nil},
		{"no broker answers: the first error", []any{down, errors.New("timeout")}, 0, down},
		{"nothing was asked: an empty answer", nil, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := stableOffsetsMerger{}.Merge(nil, tt.results)
			if !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
				t.Fatalf("Merge: %v, want %v", err, tt.err)
			}
			if err == nil && len(m.(*listoffsets.Response).Topics) != tt.topics {
				t.Errorf("%d topics answered, want %d", len(m.(*listoffsets.Response).Topics), tt.topics)
			}
		})
	}
}

func TestTheFirstMarkerCheckWaitsAboutTheMarkersUsualLatency(t *testing.T) {
	tests := []struct {
		name   string
		landed func(i int) bool // whether the first check of the i-th transaction found the markers landed
		lo, hi time.Duration
	}{
		{"markers always there at the first check: the wait shrinks to its floor", func(int) bool { return true }, firstCheckMin, firstCheckMin},
		{"markers never there: the wait grows to its ceiling", func(int) bool { return false }, firstCheckMax, firstCheckMax},
		// A marker that lands 3 ms after the answer: the wait settles just above 3 ms.
		{"markers after 3 ms: the wait settles just above them", nil, 3 * time.Millisecond, 4 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d markerDelay
			misses := 0
			for i := range 1000 {
				landed := d.get() >= 3*time.Millisecond
				if tt.landed != nil {
					landed = tt.landed(i)
				}
				if !landed && i >= 500 {
					misses++
				}
				d.learn(landed)
			}
			if got := d.get(); got < tt.lo || got > tt.hi {
				t.Errorf("after 1000 transactions the first check waits %v, want within [%v, %v]", got, tt.lo, tt.hi)
			}
			if tt.landed == nil && misses > 500/12 {
				t.Errorf("%d of the last 500 first checks came too soon, want at most 1 in 12", misses)
			}
		})
	}
}
