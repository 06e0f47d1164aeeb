// Package relay wires the pipeline: replication -> decoder -> sink -> checkpoint, and the confirmed
// position back to replication. It owns startup order and the two-phase shutdown: stop reading,
// wait (bounded) for Kafka to acknowledge what is in flight, report the final position, close.
package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Config configures a Relay.
type Config struct {
	Replication replication.Config
	Decoder     decoder.Config
	Sink        sink.Config
	// Backfill, when set, publishes the rows already in the outbox table before streaming, once
	// per slot (see relay/backfill.go).
	Backfill *Backfill
	// HeartbeatInterval, when positive, emits a logical decoding message that often so the slot
	// advances even when nothing in this database writes WAL. Replication.Messages must be set.
	HeartbeatInterval time.Duration
	// ShutdownTimeout bounds how long a stopping relay waits for Kafka to acknowledge in-flight
	// events. Default 30s.
	ShutdownTimeout time.Duration
}

// Relay moves outbox events from one replication slot to Kafka.
type Relay struct {
	cfg     Config
	log     *zap.Logger
	m       *metrics.Metrics
	tracker *checkpoint.Tracker
	dec     *decoder.Decoder
	sink    *sink.Sink
	stream  *replication.Stream

	// fenced ends when Fence is called; streaming is set once a replication session has started.
	fenced    context.Context
	fence     context.CancelFunc
	streaming atomic.Bool
	// kafkaReady is set by the stream's goroutine once Kafka has answered.
	kafkaReady bool
}

// New builds a relay. Nothing is contacted until Run.
func New(cfg Config, log *zap.Logger, m *metrics.Metrics) (*Relay, error) {
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.HeartbeatInterval > 0 {
		cfg.Replication.Messages = true
	}
	sk, err := sink.New(cfg.Sink, log.Named("sink"), m)
	if err != nil {
		return nil, err
	}
	tracker := checkpoint.New(0)
	r := &Relay{
		cfg:     cfg,
		log:     log,
		m:       m,
		tracker: tracker,
		dec:     decoder.New(cfg.Decoder),
		sink:    sk,
	}
	r.fenced, r.fence = context.WithCancel(context.Background())
	r.cfg.Replication.BeforeStream = r.beforeStream
	r.cfg.Replication.ExportSnapshot = cfg.Backfill != nil
	r.stream = replication.New(r.cfg.Replication, tracker, log.Named("replication"), m)
	return r, nil
}

// Sink exposes the sink for health reporting.
func (r *Relay) Sink() *sink.Sink { return r.sink }

// Streaming reports whether a replication session has started (it stays set across reconnects).
func (r *Relay) Streaming() bool { return r.streaming.Load() }

// ErrFenced is what Run returns after Fence.
var ErrFenced = errors.New("relay fenced: stopped streaming without draining")

// Fence stops a running (or starting) relay at once, without the graceful drain: reading stops,
// the final acknowledged position is reported, the replication connection is closed and Kafka
// acknowledgements still outstanding are abandoned (they are replayed by whoever streams next).
// A leader that lost its lock calls it, since another instance may already be taking over.
func (r *Relay) Fence() { r.fence() }

// errShutdownTimeout ends the drain when Kafka does not acknowledge in time.
var errShutdownTimeout = errors.New("shutdown timeout")

// Run streams until ctx ends (a clean stop: returns nil), Fence is called (ErrFenced) or a fatal
// error. A Relay runs once.
func (r *Relay) Run(ctx context.Context) error {
	// soft ends reading; hard ends everything, ShutdownTimeout after soft at the latest.
	soft, stopReading := context.WithCancel(ctx)
	defer stopReading()
	hard, stopAll := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopAll(nil)
	// A fence skips phase two: hard ends first, so nothing waits for Kafka.
	defer context.AfterFunc(r.fenced, func() { stopAll(ErrFenced); stopReading() })()
	go func() {
		select {
		case <-soft.Done():
		case <-hard.Done():
			return
		}
		timer := time.NewTimer(r.cfg.ShutdownTimeout)
		defer timer.Stop()
		select {
		case <-timer.C:
			stopAll(errShutdownTimeout)
		case <-hard.Done():
		}
	}()

	if r.cfg.HeartbeatInterval > 0 {
		go r.heartbeat(soft, r.cfg.HeartbeatInterval)
	}

	msgs := make(chan replication.Message, r.stream.Buffer())
	drained := make(chan struct{}) // closed once the pipeline is done and Kafka has acknowledged it all
	piped := make(chan error, 1)
	go func() {
		err := r.pipeline(hard, msgs)
		if err != nil {
			stopReading()
		} else {
			select {
			case <-r.tracker.Drained():
			case <-hard.Done():
			}
		}
		close(drained)
		piped <- err
	}()

	streamErr := r.stream.Run(soft, msgs)
	if streamErr == nil {
		// Phase two: keep reporting while Kafka acknowledges what is in flight, then report the
		// final position.
		if err := r.stream.Finish(hard, drained); err != nil {
			r.log.Warn("could not report the final position; the next start replays from the last one reported", zap.Error(err))
		}
	}
	if context.Cause(hard) == errShutdownTimeout {
		events, _ := r.sink.InFlight()
		r.log.Warn("shutdown timeout: events not acknowledged by Kafka will be published again on the next start",
			zap.Int64("events", events), zap.Duration("shutdown_timeout", r.cfg.ShutdownTimeout))
	}
	stopAll(nil)
	pipeErr := <-piped
	closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r.closeSink(closeCtx)

	switch {
	case streamErr != nil:
		return streamErr
	case pipeErr != nil && !errors.Is(pipeErr, context.Canceled):
		return pipeErr
	case r.fenced.Err() != nil:
		return ErrFenced
	}
	return nil
}

// beforeStream runs once the slot exists and before streaming starts: waiting for Kafka there
// rather than before connecting to PostgreSQL means a first start during a Kafka outage has already
// created its slot, so events committed while it waits are not missed.
func (r *Relay) beforeStream(ctx context.Context, snapshot string) error {
	if !r.kafkaReady {
		if err := r.sink.WaitReady(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return replication.Fatal(err)
		}
		r.kafkaReady = true
	}
	if r.cfg.Backfill == nil {
		return nil
	}
	if err := r.backfill(ctx, snapshot); err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	return nil
}

func (r *Relay) closeSink(ctx context.Context) {
	if err := r.sink.Close(ctx); err != nil {
		r.log.Debug("sink closed with events in flight", zap.Error(err))
	}
}

// pipeline decodes messages in WAL order and hands events to the sink, tracking every transaction
// so the checkpoint knows what Kafka still owes.
func (r *Relay) pipeline(ctx context.Context, msgs <-chan replication.Message) error {
	var tx *checkpoint.Txn
	for msg := range msgs {
		switch msg.Kind {
		case replication.Session:
			r.streaming.Store(true)
			r.dec.Reset()
			r.tracker.Abort()
			tx = nil
		case replication.Keepalive:
			// Inside a transaction (even one being skipped as a replay) the server's WAL end may lie
			// beyond events not yet received.
			if !r.dec.InTransaction() {
				r.tracker.Idle(msg.WALEnd)
			}
		case replication.Data:
			ch, err := r.dec.Decode(msg.WALStart, msg.Data)
			if err != nil {
				return fmt.Errorf("decode the replication stream: %w", err)
			}
			switch ch.Kind {
			case decoder.Begin:
				tx = r.tracker.Begin(ch.Tx.CommitLSN) // nil: already handled before a reconnect
			case decoder.Relation:
				if err := r.relation(ctx, ch.Relation); err != nil {
					return err
				}
			case decoder.Insert:
				if tx == nil {
					continue
				}
				tx.Add()
				publish := r.sink.Publish
				if ch.Unusable != nil {
					publish = r.reject(ch.Unusable)
				}
				if err := publish(ctx, ch.Event, tx); err != nil {
					return err
				}
			case decoder.Commit:
				if tx != nil {
					r.tracker.Commit(tx, ch.EndLSN)
					r.m.TransactionsTotal.Inc()
					tx = nil
				}
			case decoder.Message:
				if !r.dec.InTransaction() {
					r.tracker.Idle(ch.LSN)
				}
			}
		}
	}
	return nil
}
