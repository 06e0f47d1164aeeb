package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// warmBroker pushes traffic through a throwaway topic before any side is measured. A freshly
// started broker runs its produce and fetch paths in the JVM's interpreter and first-tier compiler
// for tens of seconds; without a warm-up the first side to publish (the relay) pays for that, and
// the Java sides after it do not. The traffic goes through the relay's own sink, so it takes the
// paths every side takes (idempotent batches; Debezium tuned is idempotent too), and, when an
// exactly-once side runs, a share goes in Kafka transactions. It also has the broker hand out its
// first producer ids: a broker's first InitProducerId after it started waits while it fetches a
// block of ids from the controller, and the cluster's first transactional one creates and loads
// __transaction_state, once in a broker's life, which a running cluster has long paid; that fell on
// the first side that asked (the relay: 0.15-0.25 s of its start-up) and on none of the others.
func (b *bench) warmBroker(ctx context.Context, records int) error {
	if err := b.createTopics(ctx, "warmup"); err != nil {
		return err
	}
	start := time.Now()
	cfg := sink.Config{Brokers: []string{b.svc.Kafka.Brokers()}, Record: record.Options{TopicTemplate: b.topicPrefix("warmup") + ".{aggregate_type}"}}
	if err := b.publishBurst(ctx, cfg, records, "warm"); err != nil {
		return fmt.Errorf("warm up the broker: %w", err)
	}
	if slices.Contains(b.cfg.Sides, sideRelayEOS) || slices.Contains(b.cfg.Steady, sideRelayEOS) {
		// The sides' positions topic: created here, not by the first exactly-once round's start.
		cfg.Transactions = &sink.Transactions{ID: b.run + "-warmup", PositionsTopic: b.run + ".positions"}
		if err := b.publishBurst(ctx, cfg, records/4, "warm-eos"); err != nil {
			return fmt.Errorf("warm up the broker's transactions: %w", err)
		}
	}
	b.logf("broker warmed up with %d records in %s", records, time.Since(start).Round(time.Millisecond))
	return b.dropTopics(ctx, "warmup")
}

// publishBurst publishes n events as fast as an in-process sink takes them and waits for Kafka's
// acknowledgements.
func (b *bench) publishBurst(ctx context.Context, cfg sink.Config, n int, prefix string) error {
	s, err := openWarmSink(ctx, cfg)
	if err != nil {
		return err
	}
	for i := range n {
		if err := s.Publish(ctx, warmEvent(prefix, i, i/20), noAck{}); err != nil { // 20 events per commit
			_ = s.Close(ctx)
			return err
		}
	}
	return closeWarmSink(ctx, s)
}

// openWarmSink starts an in-process sink for the warm-ups.
func openWarmSink(ctx context.Context, cfg sink.Config) (*sink.Sink, error) {
	s, err := sink.New(cfg, zap.NewNop(), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		return nil, err
	}
	if err := s.WaitReady(ctx); err != nil {
		_ = s.Close(ctx)
		return nil, err
	}
	return s, nil
}

// closeWarmSink waits (a minute at most) for Kafka to acknowledge what the warm-up published.
func closeWarmSink(ctx context.Context, s *sink.Sink) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return s.Close(cctx)
}

// warmPayload is a warm-up event's payload, about the size of the backlog's.
var warmPayload = []byte(`{"note":"` + strings.Repeat("x", 280) + `"}`)

// warmEvent is the warm-ups' n-th event, of the PostgreSQL transaction tx.
func warmEvent(prefix string, n, tx int) *decoder.Event {
	return &decoder.Event{
		ID: fmt.Appendf(nil, "%s-%d", prefix, n), AggregateType: []byte(aggregateTypes[n%len(aggregateTypes)]),
		AggregateID: fmt.Appendf(nil, "agg-%d", n%1000), EventType: []byte("Warm"), Payload: warmPayload,
		Tx: decoder.TxInfo{CommitLSN: pglogrepl.LSN(tx + 1), CommitTime: time.Now()},
	}
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
		if err == nil {
			err = b.dropTopics(ctx, name)
		}
		if err != nil {
			return fmt.Errorf("warm up the broker's steady state: %w", err)
		}
	}
	b.logf("broker warmed up for the steady state (%s per delivery mode)", d)
	return nil
}

// publishFor publishes events at the steady rate through an in-process sink for d.
func (b *bench) publishFor(ctx context.Context, cfg sink.Config, d time.Duration) error {
	s, err := openWarmSink(ctx, cfg)
	if err != nil {
		return err
	}
	start, n := time.Now(), 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < d && ctx.Err() == nil {
		<-tick.C
		for due := int(time.Since(start).Seconds() * float64(b.cfg.Rate)); n < due; n++ {
			if err := s.Publish(ctx, warmEvent("warm", n, n), noAck{}); err != nil {
				_ = s.Close(ctx)
				return err
			}
		}
	}
	return closeWarmSink(ctx, s)
}

type noAck struct{}

func (noAck) Ack(int) {}
