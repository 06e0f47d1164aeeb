package leadership

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/health"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
)

// runTerm runs relays until ctx ends or, with a term, until the term is lost: then the relay is
// fenced, stopping at once without the graceful drain. Relays are single-use: one that asks to
// start afresh (relay.ErrRestart: an aborted Kafka transaction) is replaced by a new one.
//
// A relay that Kafka fenced (relay.ErrSuperseded: another producer took its transactional id) has
// stopped publishing already. Its term decides what follows: a zombie (a leader paused past its
// lease, whose lock is gone and whose standby took over) finds its term lost within a check or
// two, and stands by like any fenced leader; a relay that still holds its lock was fenced by
// something outside the election (two slots configured with one transactional_id, or a relay with
// leader_election off), and ends with an error rather than fence that one in turn.
func runTerm(ctx context.Context, term *leader.Term, cfg Config, log *zap.Logger, m *metrics.Metrics, state *health.State) error {
	restarts := 0
	for {
		started := time.Now()
		err := runRelayOnce(ctx, term, cfg, log, m, state)
		switch {
		case errors.Is(err, relay.ErrRestart) && ctx.Err() == nil:
			if time.Since(started) > time.Minute {
				restarts = 0 // it ran a while: a new failure, not the same one again
			}
			delay := min(restartDelay<<min(restarts, 5), 30*time.Second)
			restarts++
			log.Warn("exactly-once: a Kafka transaction was aborted; starting afresh from the position committed in Kafka (what the aborted transaction held is published again, in a new transaction)",
				zap.Error(err), zap.Duration("retry_in", delay))
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			if term != nil && term.Err() != nil {
				// Lost meanwhile: a fresh relay's producer would fence the new leader's.
				return relay.ErrFenced
			}
			continue
		case errors.Is(err, relay.ErrSuperseded) && term != nil:
			return supersededTerm(ctx, term, err, log)
		case errors.Is(err, relay.ErrSuperseded):
			return fmt.Errorf("%w; with leader_election off, stop the other relay that uses this transactional_id (or give each slot its own)", err)
		}
		return err
	}
}

// restartDelay is the first pause before a relay starts afresh after an aborted Kafka transaction;
// it doubles, up to 30s, while the fresh relays keep failing within a minute, so a broker that
// keeps aborting them is not hammered.
const restartDelay = time.Second

// supersededGrace is how long a relay fenced by Kafka waits for its term to be found lost: the
// term checks its lock connection every second, and a check gets leader_check_timeout (5s by
// default) at most; a resumed zombie fails its first check at once, its lease being long past.
const supersededGrace = 10 * time.Second

// supersededTerm decides what a relay that Kafka fenced does next (see runTerm): stand by when its
// term is lost too, end with an error when it still holds the lock.
func supersededTerm(ctx context.Context, term *leader.Term, err error, log *zap.Logger) error {
	select {
	case <-term.Lost():
		log.Error("fenced by Kafka and lost the leader lock: another instance leads now (this one was paused past its lease); it published nothing more, and nothing of its open Kafka transaction is visible to read_committed consumers. Standing by",
			zap.Error(err), zap.NamedError("lock", term.Err()))
		return relay.ErrFenced
	case <-time.After(supersededGrace):
	case <-ctx.Done():
		return nil
	}
	return fmt.Errorf("%w, while this instance still holds the leader lock of its slot: a producer outside the leader election uses the same transactional_id (two slots configured with one transactional_id, or a relay with leader_election off). Give each slot its own transactional_id, and stop relays that run without the election", err)
}

// runRelayOnce builds a relay and runs it until ctx ends or, with a term, until the term is lost or
// (cfg.KafkaTimeout > 0) Kafka has not answered for that long while events waited (handover.go).
func runRelayOnce(ctx context.Context, term *leader.Term, cfg Config, log *zap.Logger, m *metrics.Metrics, state *health.State) error {
	rcfg := cfg.Relay
	if term != nil {
		// The next leader ends exactly this relay's walsender should this one be cut off: each
		// session publishes it before it uses the slot.
		rcfg.Replication.OnWalsender = term.PublishWalsender
	}
	r, err := relay.New(rcfg, log, m)
	if err != nil {
		return err
	}
	m.Halted.Set(0)
	m.Leader.Set(1)
	state.Lead(relayHealth{r})
	defer m.EndTerm()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// fence says why (an ERROR line), stops the relay at once and waits for its run to end. This
	// instance stops leading at the fence, not once the run has ended: another instance may take
	// over at once, and two instances reporting leadership at the same time are two leaders to
	// whoever watches.
	fence := func(why string, fields ...zap.Field) error {
		m.Leader.Set(0)
		log.Error(why, fields...)
		began := time.Now()
		r.Fence()
		err := <-done
		log.Info("the fenced relay stopped; standing by", zap.Duration("took", time.Since(began).Round(time.Millisecond)))
		return err
	}
	var lost <-chan struct{}
	var silent <-chan time.Duration
	if term != nil {
		lost = term.Lost()
		if cfg.KafkaTimeout > 0 {
			wctx, stopWatch := context.WithCancel(ctx)
			defer stopWatch()
			silent = watchKafka(wctx, r.Sink(), cfg.KafkaTimeout, func() bool { return term.Standbys() > 0 })
		}
	}
	select {
	case err := <-done:
		return err
	case <-lost:
	case d := <-silent:
		err := fence("no Kafka acknowledgement while events waited for leader_kafka_timeout; handing over: streaming stops now without confirming what Kafka did not acknowledge, and the leader lock is released for a standby that can reach Kafka",
			zap.Duration("silent_for", d.Round(time.Millisecond)), zap.Duration("leader_kafka_timeout", cfg.KafkaTimeout), zap.Strings("kafka_brokers", rcfg.Sink.Brokers),
			zap.Int("standbys_ready", term.Standbys()))
		if err != nil && !errors.Is(err, relay.ErrFenced) {
			return err
		}
		return fmt.Errorf("%w for %s (leader_kafka_timeout %s)", errKafkaSilent, d.Round(time.Millisecond), cfg.KafkaTimeout)
	}
	m.Fenced.Inc()
	err = fence("lost the leader lock connection; fencing: streaming stops now and unconfirmed events are replayed by the next leader",
		zap.Error(term.Err()))
	if err == nil {
		err = relay.ErrFenced // ctx ended at the same moment; the loop sees ctx first
	}
	return err
}

// relayHealth adapts a relay to what readiness needs.
type relayHealth struct{ r *relay.Relay }

func (h relayHealth) Streaming() bool { return h.r.Streaming() }

func (h relayHealth) Halted() (string, bool) {
	_, reason, _, halted := h.r.Sink().Halted()
	return reason, halted
}

// Stalled reports a Kafka topic every event waits for (health.Staller).
func (h relayHealth) Stalled() (string, bool) { return h.r.Sink().Stalled() }
