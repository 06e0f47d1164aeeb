package producer

import (
	"errors"

	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
)

// kafka-go's ListOffsets sends one request per partition (listoffsets.Request.Split), so checking
// the markers of a transaction that wrote n partitions cost n requests per check. The request
// below is the same message (identical fields and versions) split by partition leader instead:
// one request per broker for all the partitions it leads, and one more, to any broker, for the
// partitions whose leader kafka-go's transport does not know (the broker answers their error:
// NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION for a deleted topic). Kafka refuses only a
// partition named twice in one request, which a set of partitions never does.

const stableOffsetsOverride protocol.OverrideTypeKey = 0x4f54

func init() {
	protocol.RegisterOverride(&stableOffsetsRequest{}, &listoffsets.Response{}, stableOffsetsOverride)
}

// stableOffsetsRequest is listoffsets.Request sent to the leader of its partitions.
type stableOffsetsRequest struct {
	ReplicaID      int32                      `kafka:"min=v1,max=v5"`
	IsolationLevel int8                       `kafka:"min=v2,max=v5"`
	Topics         []listoffsets.RequestTopic `kafka:"min=v1,max=v5"`

	leader int32 // -1: any broker
}

func (r *stableOffsetsRequest) ApiKey() protocol.ApiKey           { return protocol.ListOffsets }
func (r *stableOffsetsRequest) TypeKey() protocol.OverrideTypeKey { return stableOffsetsOverride }

func (r *stableOffsetsRequest) Broker(c protocol.Cluster) (protocol.Broker, error) {
	if b, ok := c.Brokers[r.leader]; ok {
		return b, nil
	}
	return protocol.Broker{ID: -1}, nil
}

// newStableOffsetsRequest asks for the last stable offset (read_committed end) of tps.
func newStableOffsetsRequest(tps []TopicPartition) *stableOffsetsRequest {
	req := &stableOffsetsRequest{ReplicaID: -1, IsolationLevel: 1, leader: -1} // read_committed
	byTopic := make(map[string]int)
	for _, tp := range tps {
		i, ok := byTopic[tp.Topic]
		if !ok {
			i = len(req.Topics)
			byTopic[tp.Topic] = i
			req.Topics = append(req.Topics, listoffsets.RequestTopic{Topic: tp.Topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, listoffsets.RequestPartition{
			Partition:          int32(tp.Partition),
			CurrentLeaderEpoch: -1, // not checked
			Timestamp:          -1, // the end of the partition
		})
	}
	return req
}

// Split groups the partitions by the leader kafka-go's transport knows for each.
func (r *stableOffsetsRequest) Split(c protocol.Cluster) ([]protocol.Message, protocol.Merger, error) {
	byLeader := make(map[int32][]TopicPartition)
	var order []int32
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			leader := int32(-1)
			if part, ok := c.Topics[t.Topic].Partitions[p.Partition]; ok {
				if _, known := c.Brokers[part.Leader]; known {
					leader = part.Leader
				}
			}
			if _, ok := byLeader[leader]; !ok {
				order = append(order, leader)
			}
			byLeader[leader] = append(byLeader[leader], TopicPartition{Topic: t.Topic, Partition: int(p.Partition)})
		}
	}
	msgs := make([]protocol.Message, 0, len(order))
	for _, leader := range order {
		req := newStableOffsetsRequest(byLeader[leader])
		req.ReplicaID, req.IsolationLevel, req.leader = r.ReplicaID, r.IsolationLevel, leader
		msgs = append(msgs, req)
	}
	return msgs, stableOffsetsMerger{}, nil
}

type stableOffsetsMerger struct{}

// Merge puts the answers together; the partitions of a request that failed (its broker did not
// answer) are left out, as if they had no leader. It fails only when every request failed.
func (stableOffsetsMerger) Merge(_ []protocol.Message, results []any) (protocol.Message, error) {
	merged := &listoffsets.Response{}
	var first error
	for _, res := range results {
		m, err := protocol.Result(res)
		if err != nil {
			first = cmpOr(first, err)
			continue
		}
		r, ok := m.(*listoffsets.Response)
		if !ok {
			first = cmpOr(first, errors.New("list offsets: an answer of another kind"))
			continue
		}
		merged.ThrottleTimeMs = max(merged.ThrottleTimeMs, r.ThrottleTimeMs)
		merged.Topics = append(merged.Topics, r.Topics...)
	}
	if len(merged.Topics) == 0 && first != nil {
		return nil, first
	}
	return merged, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
