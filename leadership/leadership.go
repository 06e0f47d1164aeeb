// Package leadership runs the relay while this instance leads: the leader loop (campaign for the
// slot's leader lock, stream while holding it, stand by when it is lost), the relays of one term
// (a fresh one after an aborted Kafka transaction, a fence the moment the term is lost) and the
// handover of a leader cut off from Kafka alone (handover.go). Without an election it runs one
// term that ends only with ctx. It is the binary's run command without the binary: flags, config
// files, signals and the HTTP server stay in cmd/outbox-relay.
package leadership

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/health"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
)

// Config configures Run.
type Config struct {
	// Relay configures every relay of every term: each is built afresh, since a relay runs once.
	Relay relay.Config
	// Election, when set, has relays run only while this instance holds the slot's leader lock
	// (leader_election). Its callbacks OnStandby, OnSlowCheck and BeforeLock are set by Run. Nil:
	// one term, without an election.
	Election *leader.Config
	// KafkaTimeout (leader_kafka_timeout), when positive and with an election, hands the lock over
	// when Kafka has not answered for that long while events waited and a standby is ready.
	KafkaTimeout time.Duration
	// SlotBusyWait (slot_busy_wait) is how long another process may stream the slot before standing
	// by for it is said at warning level: past it, it is no walsender being reaped.
	SlotBusyWait time.Duration
	// Scrub removes secrets from text that is logged (a driver's error can quote connection
	// parameters); nil logs the text as it is.
	Scrub func(string) string
}

// Run runs relays, as leader when cfg.Election is set, until ctx ends (nil) or an error that
// retrying cannot fix. Leadership shows in m (leader, fenced) and in state (readiness).
func Run(ctx context.Context, cfg Config, log *zap.Logger, m *metrics.Metrics, state *health.State) error {
	if cfg.Scrub == nil {
		cfg.Scrub = func(s string) string { return s }
	}
	if cfg.Election == nil {
		return runTerm(ctx, nil, cfg, log, m, state)
	}
	return leaderLoop(ctx, cfg, log, m, state)
}

// leaderLoop stands by until this instance holds the leader lock, streams while it does, and
// stands by again when it loses it. It returns when ctx ends or on an error retrying cannot fix.
func leaderLoop(ctx context.Context, cfg Config, log *zap.Logger, m *metrics.Metrics, state *health.State) error {
	l := &loop{cfg: cfg, log: log, state: state}
	ecfg := *cfg.Election
	ecfg.OnStandby = state.Standby
	ecfg.OnSlowCheck = func(time.Duration) { m.LeaderSlowChecks.Inc() }
	ecfg.BeforeLock = kafkaAnswers(cfg.KafkaTimeout, cfg.Relay.Sink, func() bool { return l.handovers > 0 })
	el := leader.New(ecfg, log.Named("leader"))
	for {
		state.Standby(false)
		term, err := el.Campaign(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		log.Info("leader: holding the leader lock; streaming the slot",
			zap.String("slot", cfg.Relay.Replication.Slot), zap.Uint32("lock_backend_pid", term.PID()))
		began := time.Now()
		err = runTerm(ctx, term, cfg, log, m, state)
		term.Release()
		if done, err := l.afterTerm(ctx, err, time.Since(began)); done {
			return err
		}
	}
}

// loop is the leader loop's memory across terms.
type loop struct {
	cfg   Config
	log   *zap.Logger
	state *health.State
	// handovers counts the terms in a row that ended cut off from Kafka, for the pause before
	// competing again. Read by the election's BeforeLock, on the loop's goroutine (Campaign).
	handovers int
	// busySince is when this instance, holding the lock, first found someone else streaming the
	// slot; zero while it does not.
	busySince time.Time
}

// afterTerm decides what follows a term that ended with err after it lasted: stand by for a while
// and campaign again (done false), or end the loop (done true, with the loop's error).
func (l *loop) afterTerm(ctx context.Context, err error, lasted time.Duration) (done bool, _ error) {
	slot := l.cfg.Relay.Replication.Slot
	retry := l.cfg.Election.RetryInterval
	if !errors.Is(err, replication.ErrSlotActive) {
		l.busySince = time.Time{}
	}
	if !errors.Is(err, errKafkaSilent) || lasted > maxHandoverPause {
		l.handovers = 0
	}
	switch {
	case ctx.Err() != nil:
		return true, nil
	case errors.Is(err, errKafkaSilent):
		l.handovers++
		pause := handoverPause(handoverBase(retry), l.handovers)
		l.log.Warn("released the leader lock, cut off from Kafka; competing again after a pause, and only once Kafka answers",
			zap.String("slot", slot), zap.Duration("pause", pause), zap.Int("handovers_in_a_row", l.handovers))
		return l.standBy(ctx, pause), nil
	case errors.Is(err, relay.ErrFenced):
		// Campaign again at once: usually another instance has the lock by now and this one
		// becomes its standby; if PostgreSQL restarted, this one may simply lead again.
		return false, nil
	case errors.Is(err, replication.ErrSlotActive):
		// Someone outside the election streams the slot (a relay with leader_election off,
		// Debezium, or a walsender PostgreSQL has not reaped yet): not a crash, wait our turn.
		// Past slot_busy_wait it is no longer a walsender being reaped, so say so louder.
		if l.busySince.IsZero() {
			l.busySince = time.Now()
		}
		level := zap.InfoLevel
		msg := "another process streams the slot; standing by and retrying"
		if time.Since(l.busySince) > l.cfg.SlotBusyWait {
			level = zap.WarnLevel
			msg = "a process outside the leader election has streamed the slot for longer than slot_busy_wait (another relay with leader_election off, or Debezium?); standing by until it stops"
		}
		l.log.Check(level, msg).Write(
			zap.String("slot", slot), zap.String("detail", l.cfg.Scrub(err.Error())),
			zap.Duration("retry_in", retry))
		return l.standBy(ctx, retry), nil
	case err != nil:
		return true, err
	}
	return false, nil
}

// standBy reports a connected standby and waits for d; done: ctx ended meanwhile.
func (l *loop) standBy(ctx context.Context, d time.Duration) (done bool) {
	l.state.Standby(true)
	select {
	case <-time.After(d):
		return false
	case <-ctx.Done():
		return true
	}
}
