package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// WaitReady blocks until the Kafka cluster answers a metadata request, logging each failed attempt
// with the next retry delay: a broker that is down at start is waited for, not a reason to exit. It
// returns an error only for a problem retrying cannot fix (failed authentication, a certificate the
// relay does not trust or the broker refused) or when ctx ends.
// It also lowers the record size limit to the broker's message.max.bytes when that is smaller.
func (s *Sink) WaitReady(ctx context.Context) error {
	s.starting.Store(true)
	defer s.starting.Store(false)
	for attempt := 0; ; attempt++ {
		// A fresh transport per attempt: a pooled one would answer from state cached while the
		// brokers were down.
		probe := s.newTransport()
		client := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Transport: probe, Timeout: 10 * time.Second}
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
		if err == nil && len(md.Brokers) > 0 {
			s.answered()
			s.adoptBrokerLimit(ctx, client, md.Brokers[0].ID)
			probe.CloseIdleConnections()
			if attempt > 0 {
				s.log.Info("kafka reachable", zap.Strings("brokers", s.cfg.Brokers))
			}
			return s.startProducer(ctx)
		}
		probe.CloseIdleConnections()
		if err == nil {
			err = errors.New("metadata lists no brokers")
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var kerr kafka.Error
		if errors.As(err, &kerr) && (kerr == kafka.SASLAuthenticationFailed || kerr == kafka.UnsupportedSASLMechanism ||
			kerr == kafka.IllegalSASLState || kerr == kafka.ClusterAuthorizationFailed) {
			return fmt.Errorf("kafka at %v refused the relay's credentials: %w (check kafka.sasl.* settings)", s.cfg.Brokers, err)
		}
		if line, ok := tlsProblem(err); ok {
			return fmt.Errorf("kafka at %v: %s", s.cfg.Brokers, line)
		}
		delay := producer.Backoff(attempt)
		s.log.Warn("kafka unreachable; the relay waits for it before streaming",
			zap.Strings("brokers", s.cfg.Brokers), zap.Int("attempt", attempt+1),
			zap.Duration("retry_in", delay), zap.Error(err))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// adoptBrokerLimit reads the broker's message.max.bytes so oversize records are caught before they
// enter the writer rather than rejected batch by batch. Failure to read it is not fatal: the broker
// still rejects oversize records and the failure policy handles them.
func (s *Sink) adoptBrokerLimit(ctx context.Context, client *kafka.Client, brokerID int) {
	res, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{
		Resources: []kafka.DescribeConfigRequestResource{{
			ResourceType: kafka.ResourceTypeBroker,
			ResourceName: strconv.Itoa(brokerID),
			ConfigNames:  []string{"message.max.bytes"},
		}},
	})
	if err != nil || len(res.Resources) == 0 || res.Resources[0].Error != nil {
		s.log.Debug("cannot read the broker's message.max.bytes", zap.Error(err))
		return
	}
	for _, e := range res.Resources[0].ConfigEntries {
		if e.ConfigName != "message.max.bytes" {
			continue
		}
		limit, err := strconv.Atoi(e.ConfigValue)
		if err == nil && limit > 0 && limit < s.cfg.MaxMessageBytes {
			s.log.Info("using the broker's smaller record size limit",
				zap.Int("message.max.bytes", limit), zap.Int("max_message_bytes", s.cfg.MaxMessageBytes))
			s.cfg.MaxMessageBytes = limit
			s.main.SetMaxBytes(limit)
			s.dead.SetMaxBytes(limit)
		}
	}
}

// startProducer asks for the producer id (idempotence; with exactly-once, InitProducerID with the
// transactional id, which fences every earlier producer with it) and makes sure the positions
// topic exists, so that what cannot work fails the start with an error naming the setting.
func (s *Sink) startProducer(ctx context.Context) error {
	if _, err := s.ident.Get(ctx); err != nil {
		if ctx.Err() == nil {
			s.fatal(err)
		}
		return err
	}
	if s.txn != nil {
		if err := s.txn.positions.resolve(ctx); err != nil {
			return err
		}
	}
	return nil
}
