package main

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// warmBroker pushes traffic through a throwaway topic before any side is measured. A freshly
// started broker runs its produce and fetch paths in the JVM's interpreter and first-tier compiler
// for tens of seconds; without a warm-up the first side to publish (the relay) pays for that, and
// the Java sides after it do not.
func (b *bench) warmBroker(ctx context.Context, records int) error {
	topic := b.run + ".warmup"
	if err := b.svc.Kafka.CreateTopic(ctx, topic, b.cfg.Partitions); err != nil {
		return err
	}
	w := &kafka.Writer{
		Addr: kafka.TCP(b.svc.Kafka.Brokers()), Topic: topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 200, BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	payload := make([]byte, 300)
	msgs := make([]kafka.Message, 1000)
	start := time.Now()
	for sent := 0; sent < records; sent += len(msgs) {
		for i := range msgs {
			msgs[i] = kafka.Message{Key: []byte(fmt.Sprint(sent + i)), Value: payload}
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return fmt.Errorf("warm up the broker: %w", err)
		}
	}
	if _, err := b.onKafka(ctx, []string{topic}); err != nil {
		return err
	}
	b.logf("broker warmed up with %d records in %s", records, time.Since(start).Round(time.Millisecond))
	return nil
}
