package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Each measurement runs on topics of its own, created just before it and deleted once it is
// measured (unless Config.KeepTopics), so every side and round meets a broker holding the same
// topics: the warm-up's positions topic and nothing else of the run. Without this a run's topics
// and partitions piled up over its course (a full run created several hundred partitions), and
// the sides measured late met a broker with more logs, indexes and metadata than the early ones.

// dropTopics deletes name's topics.
func (b *bench) dropTopics(ctx context.Context, name string) error {
	return b.deleteTopics(ctx, b.topics(name)...)
}

// dropConnectTopics deletes the internal topics (configs, offsets, status) of the distributed
// Connect worker that ran as name, if any (only Debezium with Connect's exactly-once runs one).
func (b *bench) dropConnectTopics(ctx context.Context, side, name string) error {
	if side != sideDbzEOS {
		return nil
	}
	prefix := connectName(b.run, b.connectDir(name))
	return b.deleteTopics(ctx, prefix+".connect-configs", prefix+".connect-offsets", prefix+".connect-status")
}

// deleteTopics deletes topics (a topic that does not exist is no error: a side that failed before
// it created one). The broker answers once its controller has deleted them (the request carries
// the time it may take), so nothing is polled after: kafka-go answers Metadata requests from a
// cache it refreshes every 6 s, and polling it only waited for that refresh (2-3 s a deletion).
func (b *bench) deleteTopics(ctx context.Context, topics ...string) error {
	if b.cfg.KeepTopics || len(topics) == 0 {
		return nil
	}
	// Its own bound: deleting topics is quick, and a measurement's context may already be done.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	began := time.Now()
	resp, err := b.kafka.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("delete the measured topics %v: %w", topics, err)
	}
	for t, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
			return fmt.Errorf("delete the measured topic %s: %w", t, err)
		}
	}
	b.logf("deleted %d measured topics in %s", len(topics), time.Since(began).Round(time.Millisecond))
	return nil
}
