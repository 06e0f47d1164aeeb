package workload

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// EndOffsets reads every partition's last stable offset and high watermark of topics (topics that
// do not exist are left out), by topic and partition.
func EndOffsets(ctx context.Context, brokers string, topics []string) ([]history.EndOffset, error) {
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(brokers, ",")...), Timeout: 10 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, fmt.Errorf("workload: end offsets: metadata: %w", err)
	}
	req := map[string][]kafka.OffsetRequest{}
	for _, t := range md.Topics {
		if t.Error != nil {
			continue // never created (a mode without exactly-once has no positions topic)
		}
		for _, p := range t.Partitions {
			req[t.Name] = append(req[t.Name], kafka.LastOffsetOf(p.ID))
		}
	}
	read := func(iso kafka.IsolationLevel) (map[string][]kafka.PartitionOffsets, error) {
		res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: req, IsolationLevel: iso})
		if err != nil {
			return nil, err
		}
		for t, ps := range res.Topics {
			for _, p := range ps {
				if p.Error != nil {
					return nil, fmt.Errorf("%s/%d: %w", t, p.Partition, p.Error)
				}
			}
		}
		return res.Topics, nil
	}
	// The high watermark first: a transaction that ends between the two reads then shows as
	// ended, never the other way round.
	hw, err := read(kafka.ReadUncommitted)
	if err != nil {
		return nil, fmt.Errorf("workload: end offsets: high watermarks: %w", err)
	}
	lso, err := read(kafka.ReadCommitted)
	if err != nil {
		return nil, fmt.Errorf("workload: end offsets: last stable offsets: %w", err)
	}
	var out []history.EndOffset
	for t, ps := range hw {
		for _, p := range ps {
			i := slices.IndexFunc(lso[t], func(q kafka.PartitionOffsets) bool { return q.Partition == p.Partition })
			if i < 0 {
				return nil, fmt.Errorf("workload: end offsets: %s/%d has no last stable offset", t, p.Partition)
			}
			out = append(out, history.EndOffset{Topic: t, Partition: p.Partition, LastStable: lso[t][i].LastOffset, HighWatermark: p.LastOffset})
		}
	}
	slices.SortFunc(out, func(a, b history.EndOffset) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return a.Partition - b.Partition
	})
	return out, nil
}

// SettledEndOffsets reads EndOffsets until no partition holds an open transaction, or until limit
// passes (an open transaction ends at the latest when its producer's transaction timeout has
// passed and the coordinator aborted it); it returns the last read.
func SettledEndOffsets(ctx context.Context, brokers string, topics []string, limit time.Duration) ([]history.EndOffset, error) {
	deadline := time.Now().Add(limit)
	for {
		offs, err := EndOffsets(ctx, brokers, topics)
		open := err != nil || slices.ContainsFunc(offs, func(o history.EndOffset) bool { return o.LastStable < o.HighWatermark })
		if !open || time.Now().After(deadline) {
			return offs, err
		}
		if sleep(ctx, 500*time.Millisecond) != nil {
			return offs, fmt.Errorf("workload: end offsets: %w", ctx.Err())
		}
	}
}
