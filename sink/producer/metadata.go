package producer

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
)

// topicInfo is what the producer knows of a topic: how many partitions it has, and which broker
// leads each (for grouping batches into requests, coalesce.go).
type topicInfo struct {
	partitions int
	fetched    time.Time
	leaders    []int32 // by partition: the broker that leads it
	ledAt      time.Time
}

// metadataTTL is how long a topic's partition count is trusted. Partitions are rarely added, and
// when they are, keys move to other partitions exactly as with the Java client.
const metadataTTL = time.Minute

// leadersTTL is how long a topic's partition leaders are trusted for grouping batches into
// requests: kafka-go's transport refreshes its own view about as often (its MetadataTTL), and a
// request it finds mixing leaders is split (coalesce.go), so a stale view costs a request, not a
// batch.
const leadersTTL = 5 * time.Second

// partitions returns the topic's partition count, asking the brokers (and, with AutoCreateTopics,
// letting them auto-create the topic) when it is not known or stale.
func (p *Producer) partitions(ctx context.Context, topic string, now time.Time) (int, error) {
	p.mu.Lock()
	info, ok := p.topics[topic]
	p.mu.Unlock()
	if ok && now.Sub(info.fetched) < metadataTTL {
		return info.partitions, nil
	}
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	res, err := p.client.Transport.RoundTrip(rctx, p.client.Addr, &metadataAPI.Request{
		TopicNames:             []string{topic},
		AllowAutoTopicCreation: p.autoCreate,
	})
	if err != nil {
		if ok {
			return info.partitions, nil // keep using what we knew while the brokers are away
		}
		return 0, err
	}
	for _, t := range res.(*metadataAPI.Response).Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return 0, kafka.Error(t.ErrorCode)
		}
		if len(t.Partitions) == 0 {
			return 0, kafka.LeaderNotAvailable
		}
		p.mu.Lock()
		p.topics[topic] = topicInfo{partitions: len(t.Partitions), fetched: time.Now(), leaders: leaders(t.Partitions), ledAt: time.Now()}
		p.mu.Unlock()
		return len(t.Partitions), nil
	}
	return 0, kafka.UnknownTopicOrPartition
}

func leaders(partitions []metadataAPI.ResponsePartition) []int32 {
	out := make([]int32, len(partitions))
	for i := range out {
		out[i] = noLeader
	}
	for _, p := range partitions {
		if p.PartitionIndex >= 0 && int(p.PartitionIndex) < len(out) {
			out[p.PartitionIndex] = p.LeaderID
		}
	}
	return out
}

// leader returns the broker that leads tp, as kafka-go's transport last learned it (its cached
// metadata: no request goes out), or noLeader when it does not know.
func (p *Producer) leader(tp TopicPartition) int32 {
	p.mu.Lock()
	info, ok := p.topics[tp.Topic]
	p.mu.Unlock()
	if !ok || time.Since(info.ledAt) >= leadersTTL || tp.Partition >= len(info.leaders) {
		ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
		defer cancel()
		res, err := p.client.Transport.RoundTrip(ctx, p.client.Addr, &metadataAPI.Request{TopicNames: []string{tp.Topic}})
		if err != nil {
			return noLeader
		}
		for _, t := range res.(*metadataAPI.Response).Topics {
			if t.Name != tp.Topic || t.ErrorCode != 0 || len(t.Partitions) == 0 {
				continue
			}
			info.leaders, info.ledAt = leaders(t.Partitions), time.Now()
			p.mu.Lock()
			if cur, ok := p.topics[tp.Topic]; ok {
				cur.leaders, cur.ledAt = info.leaders, info.ledAt
				p.topics[tp.Topic] = cur
			} else {
				// A partition only ever sent to with Produce, never through Enqueue.
				p.topics[tp.Topic] = topicInfo{leaders: info.leaders, ledAt: info.ledAt}
			}
			p.mu.Unlock()
		}
	}
	if tp.Partition >= len(info.leaders) {
		return noLeader
	}
	return info.leaders[tp.Partition]
}

// forgetLeaders makes the next leader lookup of topic ask kafka-go's transport again.
func (p *Producer) forgetLeaders(topic string) {
	p.mu.Lock()
	if info, ok := p.topics[topic]; ok {
		info.ledAt = time.Time{}
		p.topics[topic] = info
	}
	p.mu.Unlock()
}
