package positions

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// StableWait is how long a read of the position waits for other producers' transactions open in
// the positions partition (waitStable) before it says so: relays sharing the topic normally share
// the transaction timeout, and the coordinator aborts a transaction older than it at its next sweep
// (transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by default); the rest is
// margin for a loaded broker.
func StableWait(timeout time.Duration) time.Duration { return timeout + 30*time.Second }

// waitStable returns the partition's first offset and a last stable offset that has reached the
// high watermark the partition had when it was called: everything written before then is decided
// (committed or aborted), so the backward read from it sees the last position this transactional
// id committed.
//
// Every relay shares the positions topic (one partition by default), and a read_committed read
// ends at the last stable offset: the first offset of the oldest transaction still open in the
// partition, whoever's it is. Fencing (InitProducerID) ends only this transactional id's own
// transaction; another relay killed or paused between writing its position and committing leaves
// its transaction open until the coordinator aborts it, and the positions this relay committed
// above it stay hidden meanwhile: reading then would return an older position (its events would be
// published again, duplicates a read_committed consumer sees) or none (a refused start). So the
// read waits for the transactions open at its start to end, which takes at most the other
// producer's transaction.timeout.ms. Reading above the last stable offset instead (read_uncommitted,
// deciding each record by its producer's commit or abort marker) would not wait, but it would
// redo the broker's read_committed bookkeeping here, where a mistake repeats or skips events; a
// wait that only a dead relay's open transaction makes long is the safer trade.
//
// The high watermark is taken once: live relays keep opening transactions, so the last stable
// offset may never catch up with a moving high watermark, but it always passes a fixed one. Past
// bound the read fails with an error that names the partition and the likely cause; the relay
// says so and tries again.
func waitStable(ctx context.Context, client *kafka.Client, topic string, partition int, bound time.Duration, log *zap.Logger) (first, stable int64, err error) {
	var high int64
	for attempt := 0; ; attempt++ {
		if high, err = producer.HighWatermark(ctx, client, topic, partition); err == nil {
			break
		}
		if werr := producer.Wait(ctx, attempt, log, "retrying reading the positions topic", err); werr != nil {
			return 0, 0, fmt.Errorf("sink: positions topic %s: %w", topic, werr)
		}
	}
	start := time.Now()
	delay := 50 * time.Millisecond
	logged := false
	for attempt := 0; ; attempt++ {
		first, stable, err = producer.Offsets(ctx, client, topic, partition)
		switch {
		case err != nil:
			if werr := producer.Wait(ctx, attempt, log, "retrying reading the positions topic", err); werr != nil {
				return 0, 0, fmt.Errorf("sink: positions topic %s: %w", topic, werr)
			}
			continue
		case stable >= high:
			return first, stable, nil
		case time.Since(start) >= bound:
			return 0, 0, fmt.Errorf("sink: positions topic %s partition %d: its last stable offset stayed at %d, below the high watermark %d, for %s: another producer's open transaction in the partition holds it down (most likely another relay sharing the positions topic, killed or paused between writing its position and committing; Kafka aborts it once it is older than that producer's transaction.timeout.ms, 60 s for a relay). The position this relay committed may lie above it, so it is not read until that transaction ends; if it never does, look for a paused relay, or give each relay its own positions_topic",
				topic, partition, stable, high, bound.Round(time.Second))
		}
		if !logged {
			logged = true
			log.Info("waiting for a transaction open in the positions partition to end before reading the committed position (another relay's, until its transaction timeout at most)",
				zap.String("positions_topic", topic), zap.Int("partition", partition), zap.Int64("last_stable_offset", stable), zap.Int64("high_watermark", high))
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("sink: positions topic %s partition %d: waiting for another producer's open transaction to end (last stable offset %d, high watermark %d) before reading the position: %w",
				topic, partition, stable, high, ctx.Err())
		}
		delay = min(2*delay, time.Second)
	}
}
