// Package relay wires the pipeline: replication -> decoder -> sink -> checkpoint, and the confirmed
// position back to replication. It owns startup order and the two-phase shutdown: stop reading at
// a transaction boundary, wait (bounded) for Kafka to acknowledge what is in flight, report the
// final position, close (see Run).
package relay

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/poll"
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
	// ShutdownTimeout bounds a graceful stop: finishing the open transaction and waiting for Kafka
	// to acknowledge in-flight events. Default 30s.
	ShutdownTimeout time.Duration
	// Poll, when set, chooses the polling source (source: poll): the outbox table is read by
	// package poll instead of the WAL, and Replication, Backfill and HeartbeatInterval are unused.
	Poll *poll.Config
	// OnUpdate is what an UPDATE of the outbox table does (Debezium's table.op.invalid.behavior):
	// "warn" (the default) or "error" logs it at that level, "fatal" stops the relay before it.
	// The stream carries UPDATEs only when the publication publishes them.
	OnUpdate string
	// Recovery configures how a lost slot's gap is read from the outbox table when
	// Replication.OnSlotLost is replication.SlotLostRecover (recover.go); nil: the defaults.
	Recovery *Recovery
}

// Relay moves outbox events from one replication slot to Kafka. It is the supervisor: it owns the
// sink and the one lifecycle of the run, and hands both to the source configured (a walSource or a
// pollSource), which knows nothing else of it.
type Relay struct {
	cfg  Config
	log  *zap.Logger
	sink *sink.Sink
	// source reads the outbox: the WAL through a replication slot (wal.go), or the table by
	// polling (poll.go).
	source source
	// life is the one shutdown signal of the run: stop, hard stop, abandon (lifecycle.go).
	life *lifecycle
}

// New builds a relay. Nothing is contacted until Run.
func New(cfg Config, log *zap.Logger, m *metrics.Metrics) (*Relay, error) {
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.HeartbeatInterval > 0 || cfg.Decoder.MessagePrefix != "" {
		cfg.Replication.Messages = true
	}
	if cfg.Decoder.NoTable {
		if cfg.Decoder.MessagePrefix == "" {
			return nil, errors.New("relay: no outbox table and no message prefix: nothing would be published")
		}
		if cfg.Backfill != nil {
			return nil, errors.New("relay: a backfill reads the outbox table, and messages-only mode has none: logical decoding messages are stored nowhere but the WAL")
		}
		// Nothing of the table to check: the replication side checks the publication's existence
		// only, and caps no position at a publication check (messages do not depend on it).
		cfg.Replication.NoTable = true
	}
	sk, err := sink.New(cfg.Sink, log.Named("sink"), m)
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, log: log, sink: sk, life: newLifecycle()}
	if cfg.Poll != nil {
		r.source = newPollSource(cfg, sk, log, m)
	} else {
		r.source = newWALSource(cfg, sk, log, m)
	}
	return r, nil
}

// Sink exposes the sink for health reporting.
func (r *Relay) Sink() *sink.Sink { return r.sink }

// Streaming reports whether the source has started: a replication session (it stays set across
// reconnects), or polling.
func (r *Relay) Streaming() bool { return r.source.streaming() }

// A source reads the outbox and hands its events to the sink: the WAL (walSource) or polling
// (pollSource). The relay supervises whichever is configured.
type source interface {
	// run reads until the lifecycle's stop, drains as the source can, and returns once every
	// goroutine it started has ended. closeWait is how long closing the sink may still wait for
	// Kafka: none when nothing more will be acknowledged.
	run(life *lifecycle) (closeWait time.Duration, err error)
	// stopping is called once, when the caller's stop comes (before the shutdown timeout runs).
	stopping()
	// streaming reports whether the source has started reading.
	streaming() bool
}

// ErrFenced is what Run returns after Fence.
var ErrFenced = errors.New("relay fenced: stopped streaming without draining")

// Fence stops a running (or starting) relay at once, without the graceful drain: reading stops,
// the final acknowledged position is reported, the replication connection is closed and Kafka
// acknowledgements still outstanding are abandoned (they are replayed by whoever streams next).
// A leader that lost its lock calls it, since another instance may already be taking over. With
// exactly-once, the open Kafka transaction is aborted, never committed (Sink.Abandon): that
// includes a lost slot's gap whose publication the fence ended.
func (r *Relay) Fence() {
	r.life.fence()
	r.sink.Abandon()
}

// errShutdownTimeout ends the drain when it does not finish in time.
var errShutdownTimeout = errors.New("shutdown timeout")

// errHalted ends the drain of a stop that finds the sink halted: nothing more will be acknowledged.
var errHalted = errors.New("sink halted")

// Run streams until ctx ends (a clean stop: returns nil), Fence is called (ErrFenced) or a fatal
// error. A Relay runs once.
//
// What a stop does, over the WAL (the source's goroutines, the drain and the final position are
// walSource.run's; polling's stop is pollSource.run's; the signals are the lifecycle's):
//   - ctx ends (SIGTERM): the pipeline finishes the transaction it is in the middle of (its Commit is
//     already on its way: pgoutput sends a transaction only after it committed), then stops reading,
//     so the stop falls on a transaction boundary and nothing is published that the final position
//     does not cover. What was received after that Commit is dropped; it lies beyond the final
//     position and is streamed again on the next start. Then it waits for Kafka to acknowledge what
//     it was given, reports the final position (the end of the last transaction acknowledged) and
//     closes. Normally that takes milliseconds.
//   - ctx ends while the replication connection is down (or not yet streaming): no new session is
//     started. A transaction the lost session was in the middle of cannot be finished any more; it
//     is forgotten (the next start replays it from its Begin, so its events already sent to Kafka
//     are published twice), and the stop waits for nothing: with no connection to report to,
//     what Kafka still owes would change nothing, so it counts as a crash for duplicates.
//   - ctx ends while the sink is halted: nothing more will be acknowledged, so nothing is waited
//     for; the position reported stays before the halted event.
//   - ShutdownTimeout after ctx ended, whatever is still waiting gives up (logged as a shutdown
//     timeout): the position acknowledged so far is reported, the rest is published again on the next
//     start.
//   - Fence: the same at once, without finishing the transaction or waiting for Kafka; nothing
//     more is handed to Kafka, not even messages already received, and with exactly-once nothing
//     more is committed (the open Kafka transaction is aborted: Sink.Abandon). A lost slot's
//     recovery ends with it, its read of the table too (rollback).
//   - The sink fails for good (fenced by a newer producer, a Kafka transaction aborted, a producer
//     the broker refused for good): the same as a fence, and Run returns why (sinkFailed).
func (r *Relay) Run(ctx context.Context) error {
	end := r.life.begin(ctx, r.cfg.ShutdownTimeout, r.source.stopping)
	defer end()
	closeWait, err := r.source.run(r.life)
	closeCtx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	r.closeSink(closeCtx)
	if err == nil && r.life.isFenced() {
		return ErrFenced
	}
	return err
}

func (r *Relay) closeSink(ctx context.Context) {
	if err := r.sink.Close(ctx); err != nil {
		r.log.Debug("sink closed with events in flight", zap.Error(err))
	}
}
