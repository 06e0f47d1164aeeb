package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/credentials/oauthbearer"
	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// rolloverWindow is how long WaitReady tries again a token the broker refused as invalid before
// it calls the token wrong: Kafka's validator fetches the identity provider's keys when a token
// names one it has not seen (local work of a second or less) and refuses that token meanwhile.
const rolloverWindow = 5 * time.Second

// WaitReady blocks until the Kafka cluster answers a metadata request, logging each failed attempt
// with the next retry delay: a broker that is down at start is waited for, not a reason to exit. It
// returns an error only for a problem retrying cannot fix (failed authentication, a certificate the
// relay does not trust or the broker refused) or when ctx ends.
// It also lowers the record size limit to the broker's message.max.bytes when that is smaller.
// After Prestart, its first attempt is the one Prestart made.
func (s *Sink) WaitReady(ctx context.Context) error {
	s.starting.Store(true)
	defer s.starting.Store(false)
	var rollover time.Time // when an OAUTHBEARER token was first refused as invalid
	for attempt := 0; ; attempt++ {
		var err error
		if e := s.early; attempt == 0 && e != nil {
			select {
			case <-e.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if err = e.err; err != nil && (e.stopped || time.Since(e.ended) > earlyFresh) {
				// Prestart's context ended (that was no attempt), or its failure is old news (a
				// session that failed on PostgreSQL's side is retried after a while).
				err = s.reach(ctx)
			}
		} else {
			err = s.reach(ctx)
		}
		if err == nil {
			if attempt > 0 {
				s.log.Info("kafka reachable", zap.Strings("brokers", s.cfg.Brokers))
			}
			return s.startProducer(ctx)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var kerr kafka.Error
		if errors.As(err, &kerr) && (kerr == kafka.SASLAuthenticationFailed || kerr == kafka.UnsupportedSASLMechanism ||
			kerr == kafka.IllegalSASLState || kerr == kafka.ClusterAuthorizationFailed) {
			if oauthbearer.KeyRollover(err) && (rollover.IsZero() || time.Since(rollover) < rolloverWindow) {
				// The broker may be fetching its identity provider's new keys (a token signed by
				// a key it has not seen is refused meanwhile): a few more tries before calling the
				// token wrong.
				if rollover.IsZero() {
					rollover = time.Now()
				}
				s.log.Warn("kafka refused the OAUTHBEARER token; trying again for a few seconds in case the broker is fetching new signing keys",
					zap.Strings("brokers", s.cfg.Brokers), zap.Error(err))
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
					return ctx.Err()
				}
				continue
			}
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

// reach asks the brokers for their metadata once, and on an answer adopts their record size limit.
func (s *Sink) reach(ctx context.Context) error {
	// A fresh transport per attempt: a pooled one would answer from state cached while the
	// brokers were down.
	client, probe := NewClient(s.cfg, 10*time.Second)
	defer probe.CloseIdleConnections()
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
	if err != nil {
		return err
	}
	if len(md.Brokers) == 0 {
		return errors.New("metadata lists no brokers")
	}
	s.answered()
	s.adoptBrokerLimit(ctx, client, md.Brokers[0].ID)
	return nil
}

// earlyStart is WaitReady's first attempt, made by Prestart.
type earlyStart struct {
	done    chan struct{}
	err     error     // of the metadata request; nil: the brokers answered
	stopped bool      // Prestart's context had ended
	ended   time.Time // when the attempt ended
}

// earlyFresh is how long Prestart's failure stands for WaitReady's first attempt.
const earlyFresh = time.Second

// Prestart makes WaitReady's first attempt in the background: the brokers' metadata and record
// size limit, then, at least once, the idempotent producer's id. The relay calls it once it leads,
// so these round trips overlap its PostgreSQL checks instead of following them. What it meets is
// WaitReady's to report: a broker that is down is logged, and a refusal ends the start, where
// they were before (after the slot exists, so a first start during a Kafka outage misses nothing);
// the producer id is cached, refusal included. A transactional producer's id is left to
// WaitReady: InitProducerId with the transactional id fences every other producer with it, and
// must wait until the checks have found the slot this relay's (not streamed by another relay with
// the same transactional id). Call it at most once, before WaitReady, with a ctx that ends when
// the relay stops; Close waits for it.
func (s *Sink) Prestart(ctx context.Context) {
	e := &earlyStart{done: make(chan struct{})}
	s.early = e
	go func() {
		defer close(e.done)
		e.err = s.reach(ctx)
		e.stopped, e.ended = ctx.Err() != nil, time.Now()
		if e.err == nil && s.txn == nil {
			_, _ = s.ident.Get(ctx) // kept for WaitReady, a refusal too
		}
	}()
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
		if err := s.txn.positions.Resolve(ctx); err != nil {
			return err
		}
	}
	return nil
}
