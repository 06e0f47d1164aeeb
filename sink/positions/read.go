package positions

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/producer"
	"github.com/outbox-relay/outbox-relay/sink/readcommitted"
)

// chunk is how many offsets Read reads at a time, from the end backwards, and
// fetchBytes what one fetch of them asks for. A fetch returns whole batches from its offset
// on, up to its size, whatever offset the chunk ends at: sized for a chunk of position records
// (one small record per Kafka transaction, about a hundred bytes), the read back to a
// partition's start costs about what the partition holds. A full MB per chunk made a relay's first
// start (no position of its own among other relays') read and hold twenty times that.
const (
	chunk      = 512
	fetchBytes = 64 << 10
)

// Read returns the last position committed under key (a transactional id) in topic, read
// read_committed, and where that position's Kafka transaction wrote its records (nil when the
// position does not say); found is false when none was ever committed, or the latest was deleted
// (a tombstone). It creates the topic (compacted) when it is missing. It reads backwards from the
// partition's last stable offset, once that has passed the open transactions (waitStable, at most
// bound), in chunks, so a long-lived partition is not scanned from its start. A value keyed by key
// but written outside a Kafka transaction is not the relay's, and is ignored, loudly.
//
// A relay must read its position only after its producer has fenced earlier producers with the
// transactional id (InitProducerID): a paused old producer could otherwise still commit after the
// read.
func Read(ctx context.Context, client *kafka.Client, topic, key string, bound time.Duration, log *zap.Logger) (Position, map[producer.TopicPartition]producer.Span, bool, error) {
	partition, created, err := Partition(ctx, client, topic, key, log)
	if err != nil || created {
		return Position{}, nil, false, err
	}
	first, stable, err := waitStable(ctx, client, topic, partition, bound, log)
	if err != nil {
		return Position{}, nil, false, err
	}
	var forged *readcommitted.Record // the latest record of the key the relay cannot have written
	defer func() {
		if forged != nil {
			log.Error("exactly-once: ignored a record in the positions topic keyed by this relay's transactional id that was not written in a Kafka transaction, "+
				"so not by the relay (a redriven dead letter, a console producer): it would have made the relay skip events; the relay resumes from the last position it committed itself. "+
				"Find who writes to the positions topic and take that right away (only the relay's principal needs Write on it)",
				zap.String("positions_topic", topic), zap.Int("partition", partition), zap.Int64("offset", forged.Offset),
				zap.Int64("producer_id", forged.ProducerID), zap.String("transactional_id", key))
		}
	}()
	for end := stable; end > first; {
		from := max(first, end-chunk)
		var found *readcommitted.Record
		for at := from; at < end; {
			res, err := readcommitted.Fetch(ctx, client, topic, partition, at, fetchBytes, 100*time.Millisecond)
			if err != nil {
				return Position{}, nil, false, fmt.Errorf("sink: reading positions topic %s: %w", topic, err)
			}
			for i := range res.Records {
				r := &res.Records[i]
				if r.Offset >= end || string(r.Key) != key {
					continue
				}
				// The relay writes its positions inside its Kafka transactions only: a value
				// outside one is somebody else's, and trusted it would skip events for good. A
				// tombstone from anyone is taken (deleting a position skips nothing: the start
				// then checks the slot ledger).
				if r.Value != nil && !r.Transactional {
					if forged == nil || r.Offset > forged.Offset {
						f := *r
						forged = &f
					}
					continue
				}
				found = r
			}
			if res.Next <= at {
				break // nothing more below the last stable offset
			}
			at = res.Next
		}
		if found != nil {
			if found.Value == nil {
				return Position{}, nil, false, nil // a tombstone: the position was deleted on purpose
			}
			pos, written, err := Decode(found.Value)
			if err != nil {
				return Position{}, nil, false, fmt.Errorf("sink: positions topic %s, offset %d: %w", topic, found.Offset, err)
			}
			return pos, written, true, nil
		}
		end = from
	}
	return Position{}, nil, false, nil
}
