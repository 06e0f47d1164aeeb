package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
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

// warmSteady runs the steady state's kind of traffic through throwaway topics before the first
// steady side: small produce requests a few milliseconds apart, each read as it arrives by a
// read_committed reader per partition, without and (when an exactly-once side is measured) with
// Kafka transactions. The broker compiles those paths (delayed fetches, small appends, transaction
// markers) for tens of seconds the first time they run; without this the first steady side, the
// relay, paid for it in broker CPU (the compiler threads took half of the broker's CPU in its
// window) and the Java side measured last did not.
func (b *bench) warmSteady(ctx context.Context, d time.Duration) error {
	for _, exactlyOnce := range []bool{false, true} {
		if exactlyOnce && !slices.Contains(b.cfg.Steady, sideRelayEOS) {
			continue
		}
		name := "warmsteady"
		if exactlyOnce {
			name += "-eos"
		}
		if err := b.createTopics(ctx, name); err != nil {
			return err
		}
		lat := newLatencyReader(b.svc.Kafka.Brokers(), b.topics(name), b.cfg.Partitions)
		cfg := sink.Config{Brokers: []string{b.svc.Kafka.Brokers()}, Record: record.Options{TopicTemplate: b.topicPrefix(name) + ".{aggregate_type}"}}
		if exactlyOnce {
			cfg.Transactions = &sink.Transactions{ID: b.run + "-" + name, PositionsTopic: b.run + ".positions"}
		}
		err := b.publishFor(ctx, cfg, d)
		lat.close()
		if err != nil {
			return fmt.Errorf("warm up the broker's steady state: %w", err)
		}
	}
	b.logf("broker warmed up for the steady state (%s per delivery mode)", d)
	return nil
}

// publishFor publishes events at the steady rate through an in-process sink for d.
func (b *bench) publishFor(ctx context.Context, cfg sink.Config, d time.Duration) error {
	s, err := sink.New(cfg, zap.NewNop(), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		return err
	}
	if err := s.WaitReady(ctx); err != nil {
		_ = s.Close(ctx)
		return err
	}
	payload := []byte(`{"note":"` + strings.Repeat("x", 280) + `"}`)
	start, n := time.Now(), 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < d && ctx.Err() == nil {
		<-tick.C
		for due := int(time.Since(start).Seconds() * float64(b.cfg.Rate)); n < due; n++ {
			typ := aggregateTypes[n%len(aggregateTypes)]
			ev := &decoder.Event{
				ID: fmt.Appendf(nil, "warm-%d", n), AggregateType: []byte(typ), AggregateID: fmt.Appendf(nil, "agg-%d", n%1000),
				EventType: []byte("Warm"), Payload: payload,
				Tx: decoder.TxInfo{CommitLSN: pglogrepl.LSN(n + 1), CommitTime: time.Now()},
			}
			if err := s.Publish(ctx, ev, noAck{}); err != nil {
				_ = s.Close(ctx)
				return err
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return s.Close(cctx)
}

type noAck struct{}

func (noAck) Ack(int) {}
