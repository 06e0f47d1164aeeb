// Package relay wires the pipeline: replication -> decoder -> sink -> checkpoint, and the confirmed
// position back to replication. It owns startup order and the two-phase shutdown: stop reading at
// a transaction boundary, wait (bounded) for Kafka to acknowledge what is in flight, report the
// final position, close (see Run).
package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
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

// Relay moves outbox events from one replication slot to Kafka.
type Relay struct {
	cfg     Config
	log     *zap.Logger
	m       *metrics.Metrics
	tracker *checkpoint.Tracker
	dec     *decoder.Decoder
	sink    *sink.Sink
	stream  *replication.Stream
	poller  *poll.Poller // the polling source instead of stream

	// fenced ends when Fence is called.
	fenced context.Context
	fence  context.CancelFunc
	// kafkaReady is set by the stream's goroutine once Kafka has answered.
	kafkaReady bool

	// Exactly-once (exactlyonce.go), all used by the pipeline's goroutine only. positions reads the
	// position committed in Kafka (Sink.ReadPosition; a fake in tests).
	positions       func(ctx context.Context) (sink.Position, bool, error)
	positionChecked bool          // compared with the slot ledger
	startPosition   *positionRead // read before the first session streamed (BeforeStream's goroutine; handed over by the Session message)
	positionLogged  bool          // the first position read was logged at info level
	// history reads the server's timeline history (replication.TimelineHistory; a fake in tests),
	// for what an older timeline's position may skip (origin.go).
	history func(ctx context.Context, timeline uint32) (replication.Identity, []replication.TimelineSwitch, error)
	// recordFirstPosition is set on a first exactly-once start: recordPositions notes the first
	// commit in the slot ledger.
	recordFirstPosition atomic.Bool
	// updatesChecked: checkUpdatesPublished ran (once per relay).
	updatesChecked bool
	// cancelledReads ends the relay when reads of the outbox table are cancelled again and again.
	cancelledReads cancelledReads
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
	if cfg.Poll != nil {
		r := &Relay{cfg: cfg, log: log, m: m, sink: sk}
		r.fenced, r.fence = context.WithCancel(context.Background())
		r.poller = poll.New(*cfg.Poll, sk, log.Named("poll"), m)
		return r, nil
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
	r.positions = sk.ReadPosition // after the sink has fenced earlier producers
	r.history = func(ctx context.Context, timeline uint32) (replication.Identity, []replication.TimelineSwitch, error) {
		return replication.TimelineHistory(ctx, &r.cfg.Replication, timeline)
	}
	if cfg.Sink.MaxInFlightSize > 0 && r.cfg.Replication.BufferBytes <= 0 {
		// Rows read ahead of the sink are a quarter of what the sink may hold (16 MiB with the
		// defaults), so memory stays a small multiple of max_in_flight_bytes (docs/guarantees.md).
		r.cfg.Replication.BufferBytes = cfg.Sink.MaxInFlightSize / 4
	}
	r.cfg.Replication.BeforeStream = r.beforeStream
	if cfg.Replication.OnSlotLost == replication.SlotLostRecover {
		r.cfg.Replication.Recover = r.recoverGap
		// Messages are stored nowhere but the WAL: a lost slot takes them with it.
		r.cfg.Replication.MessageEvents = cfg.Decoder.MessagePrefix != ""
	}
	r.cfg.Replication.ExportSnapshot = cfg.Backfill != nil
	r.stream = replication.New(r.cfg.Replication, tracker, log.Named("replication"), m)
	return r, nil
}

// Sink exposes the sink for health reporting.
func (r *Relay) Sink() *sink.Sink { return r.sink }

// Streaming reports whether a replication session has started (it stays set across reconnects).
func (r *Relay) Streaming() bool {
	if r.poller != nil {
		return r.poller.Polling()
	}
	return r.stream.Streamed()
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
	r.fence()
	r.sink.Abandon()
}

// errShutdownTimeout ends the drain when it does not finish in time.
var errShutdownTimeout = errors.New("shutdown timeout")

// errHalted ends the drain of a stop that finds the sink halted: nothing more will be acknowledged.
var errHalted = errors.New("sink halted")

// Run streams until ctx ends (a clean stop: returns nil), Fence is called (ErrFenced) or a fatal
// error. A Relay runs once.
//
// What a stop does, all of it here:
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
func (r *Relay) Run(ctx context.Context) error {
	if r.poller != nil {
		return r.runPoll(ctx)
	}
	// hard ends everything: at once on a fence, ShutdownTimeout after ctx ended at the latest.
	hard, stopAll := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopAll(nil)
	defer context.AfterFunc(r.fenced, func() { stopAll(ErrFenced) })()
	defer context.AfterFunc(ctx, func() {
		// A session lost from here on is not replaced: the stop would only wait for it.
		r.stream.StopReconnecting()
		timer := time.AfterFunc(r.cfg.ShutdownTimeout, func() { stopAll(errShutdownTimeout) })
		context.AfterFunc(hard, func() { timer.Stop() })
	})()
	// abandon ends with hard, or once a stop finds the sink halted: the pipeline stops handing
	// events over and nobody waits for Kafka any more.
	abandon, giveUp := context.WithCancelCause(hard)
	defer giveUp(nil)
	// reading ends once the pipeline has stopped (at a transaction boundary after ctx ended, or on an
	// error), or with hard.
	reading, stopReading := context.WithCancel(hard)
	defer stopReading()

	var helpers sync.WaitGroup
	if r.cfg.HeartbeatInterval > 0 {
		helpers.Go(func() { r.heartbeat(reading, r.cfg.HeartbeatInterval) })
	}
	helpers.Go(func() { r.watchHalt(ctx, abandon, giveUp) })
	// A sink that failed for good (exactly-once: fenced by a newer producer, or a Kafka transaction
	// aborted; either mode: a producer the broker refused for good) acknowledges nothing more: stop
	// at once, like a fence, without waiting for anything.
	failedMsg := "the Kafka producer stopped for good; stopping at once: nothing more is published, and what Kafka had not acknowledged is not confirmed to PostgreSQL (the next start publishes it again)"
	if r.exactlyOnce() {
		failedMsg = "exactly-once: the Kafka producer stopped for good; stopping at once: nothing more is published, what its open transaction held is invisible to read_committed consumers and never confirmed to PostgreSQL"
	}
	var sinkErr error
	helpers.Go(func() {
		select {
		case <-r.sink.Failed():
			sinkErr = sinkFailed(r.sink.Err())
			r.log.Error(failedMsg, zap.Error(r.sink.Err()))
			stopAll(sinkErr)
		case <-hard.Done():
		}
	})
	if r.exactlyOnce() {
		helpers.Go(func() { r.recordPositions(reading) })
	}
	confirmed := r.newConfirmedRecorder()
	helpers.Go(func() { confirmed.run(reading) })

	msgs := make(chan replication.Message, r.stream.Buffer())
	drained := make(chan struct{}) // closed once the pipeline is done and Kafka has acknowledged it all
	piped := make(chan error, 1)
	go func() {
		err := r.pipeline(ctx, abandon, msgs)
		stopReading()
		if err == nil {
			select {
			case <-r.tracker.Drained():
			case <-abandon.Done():
			}
		}
		close(drained)
		piped <- err
	}()

	// Kafka's part of the start (metadata, the idempotent producer's id) overlaps PostgreSQL's
	// checks; the verdict stays in beforeStream, after the slot exists.
	r.sink.Prestart(reading)
	streamErr := r.stream.Run(reading, msgs)
	if streamErr == nil {
		// Keep reporting while Kafka acknowledges what is in flight, then report the final position.
		if err := r.stream.Finish(hard, drained); err != nil {
			r.log.Warn("could not report the final position; the next start replays from the last one reported", zap.Error(err))
			if replication.IsFatal(err) {
				streamErr = err // a publication check failed during the drain: not a clean stop
			}
		}
	}
	if context.Cause(hard) == errShutdownTimeout {
		events, _ := r.sink.InFlight()
		r.log.Warn("shutdown timeout: events not acknowledged by Kafka will be published again on the next start",
			zap.Int64("events", events), zap.Duration("shutdown_timeout", r.cfg.ShutdownTimeout))
	}
	if hard.Err() == nil {
		// The last word on how far Kafka acknowledged, after the drain: a clean stop leaves a lost
		// slot's recovery nothing to publish twice. Not on a fence or after the shutdown timeout
		// (hard has ended), and bounded: a silent server must not hold the stop.
		wctx, cancel := context.WithTimeout(hard, time.Second)
		confirmed.write(wctx)
		cancel()
	}
	halted := context.Cause(abandon) == errHalted
	stopAll(nil)
	pipeErr := <-piped
	helpers.Wait()
	closeConfirmed, cancelClose := context.WithTimeout(context.Background(), 100*time.Millisecond)
	confirmed.close(closeConfirmed)
	cancelClose()
	closeWait := time.Second
	if halted || r.fenced.Err() != nil {
		// What the halted sink holds is never acknowledged. A fenced relay commits nothing more:
		// another instance may lead already, and the open Kafka transaction (the gap of a
		// recovery, a stream's events) is aborted, never committed; nothing waits for Kafka.
		closeWait = 0
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	r.closeSink(closeCtx)

	switch {
	case sinkErr != nil:
		return sinkErr
	case streamErr != nil:
		return streamErr
	case pipeErr != nil && !errors.Is(pipeErr, context.Canceled):
		return pipeErr
	case r.fenced.Err() != nil:
		return ErrFenced
	}
	return nil
}

// watchHalt gives up on the drain (cancel with errHalted) when a stop (stop ends) finds the sink
// halted, or once it halts afterwards: the halted event is never acknowledged, and nothing after it
// is sent, so waiting for the open transaction or for Kafka could only end in the shutdown timeout.
// The halt guarantee does not depend on it: the checkpoint never passes the unacknowledged event.
func (r *Relay) watchHalt(stop, abandon context.Context, cancel context.CancelCauseFunc) {
	select {
	case <-stop.Done():
	case <-abandon.Done():
		return
	}
	// The sink reports a halt by state only; a stop is rare, so polling it is cheap enough.
	tick := time.NewTicker(haltPoll)
	defer tick.Stop()
	for {
		if id, reason, err, halted := r.sink.Halted(); halted {
			r.log.Warn("stopping while halted on an event: nothing more will be acknowledged, so the stop waits for nothing; the slot stays before the halted event",
				zap.String("event_id", id), zap.String("reason", reason), zap.Error(err), zap.Stringer("final_position", r.tracker.Safe()))
			cancel(errHalted)
			return
		}
		select {
		case <-tick.C:
		case <-abandon.Done():
			return
		}
	}
}

// checkUpdatesPublished warns when on_update asks to act on UPDATEs that the publication does not
// publish: pgoutput sends an UPDATE only if it does, so the setting would do nothing.
func (r *Relay) checkUpdatesPublished(ctx context.Context) {
	conn, err := r.cfg.Replication.Connect(ctx) // the relay's credentials: pg_password_file
	if err != nil {
		return // the stream reports connection problems itself
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var published bool
	if err := conn.QueryRow(ctx, "SELECT pubupdate FROM pg_publication WHERE pubname = $1", r.cfg.Replication.Publication).Scan(&published); err == nil && !published {
		r.log.Warn("on_update has no effect: the publication does not publish UPDATEs, so the stream never carries one; run ALTER PUBLICATION ... SET (publish = 'insert, update') to have UPDATEs of the outbox table reported (the table then needs a replica identity, which its primary key gives)",
			zap.String("publication", r.cfg.Replication.Publication), zap.String("on_update", r.cfg.OnUpdate))
	}
}

// update handles an UPDATE of the outbox table: never an event (the outbox is append-only), but
// said, at the level OnUpdate chooses, or the end of the relay before the transaction is confirmed.
func (r *Relay) update(ch decoder.Change) error {
	fields := []zap.Field{zap.String("table", ch.Prefix), zap.Uint32("xid", ch.Tx.Xid), zap.Stringer("commit_lsn", ch.Tx.CommitLSN)}
	switch r.cfg.OnUpdate {
	case "fatal":
		return replication.Fatal(fmt.Errorf("an UPDATE of outbox table %s in transaction %d (commit %s) and on_update is fatal: outbox rows must only be inserted; fix the producer, then set on_update to warn or error to go past this transaction (the slot stays before it)",
			ch.Prefix, ch.Tx.Xid, ch.Tx.CommitLSN))
	case "error":
		r.log.Error("an UPDATE of the outbox table was ignored: outbox rows must only be inserted", fields...)
	default:
		r.log.Warn("an UPDATE of the outbox table was ignored: outbox rows must only be inserted", fields...)
	}
	return nil
}

// haltPoll is how often a stop looks whether the sink has halted.
const haltPoll = 50 * time.Millisecond

// beforeStream runs once the slot exists and before streaming starts: waiting for Kafka there
// rather than before connecting to PostgreSQL means a first start during a Kafka outage has already
// created its slot, so events committed while it waits are not missed.
func (r *Relay) beforeStream(ctx context.Context, snapshot string) error {
	if !r.kafkaReady {
		if r.exactlyOnce() {
			defer time.AfterFunc(transactionsHintAfter, r.transactionsHint).Stop()
		}
		if err := r.sink.WaitReady(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return replication.Fatal(err)
		}
		r.kafkaReady = true
	}
	if !r.updatesChecked && (r.cfg.OnUpdate == "error" || r.cfg.OnUpdate == "fatal") && !r.cfg.Decoder.NoTable {
		r.updatesChecked = true
		r.checkUpdatesPublished(ctx)
	}
	if r.exactlyOnce() {
		if err := r.startingPosition(ctx); err != nil {
			return err
		}
	}
	if r.cfg.Backfill == nil {
		return nil
	}
	if err := r.backfill(ctx, snapshot); err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	return nil
}

// forgetOpenTransaction aborts, in the tracker, a transaction whose Commit will not come: the
// stream ended (a stop while it was reconnecting, or a fatal error), or a stop came while a new
// session was replaying transactions before it. The next start replays it from its Begin, events
// already sent included (unless, with exactly-once delivery, a committed Kafka transaction holds
// them).
func (r *Relay) forgetOpenTransaction() {
	if commitLSN, aborted := r.tracker.Abort(); aborted {
		r.log.Warn("the replication stream ended inside a transaction; the next start replays it, publishing its events already sent again",
			zap.Stringer("commit_lsn", commitLSN))
	}
}

func (r *Relay) closeSink(ctx context.Context) {
	if err := r.sink.Close(ctx); err != nil {
		r.log.Debug("sink closed with events in flight", zap.Error(err))
	}
}

// pipeline decodes messages in WAL order and hands events to the sink, tracking every transaction
// so the checkpoint knows what Kafka still owes. It returns when msgs is closed, on an error, at the
// first transaction boundary after stop ends, or at once when hard ends (nothing more is handed to
// Kafka then, not even what was already received).
func (r *Relay) pipeline(stop, hard context.Context, msgs <-chan replication.Message) error {
	var tx *checkpoint.Txn
	stopping := stop.Done()
	for {
		if hard.Err() != nil {
			return nil
		}
		if tx == nil && stop.Err() != nil {
			// A transaction a lost session was in the middle of may still be open in the tracker
			// (the new session was replaying older ones when the stop came): the stop must not wait
			// for its Commit, which will not come now.
			r.forgetOpenTransaction()
			return nil
		}
		var msg replication.Message
		var ok bool
		select {
		case msg, ok = <-msgs:
		case <-stopping:
			stopping = nil // a transaction is open: read on to its Commit
			continue
		case <-hard.Done():
			return nil
		}
		if !ok {
			r.forgetOpenTransaction()
			return nil
		}
		switch msg.Kind {
		case replication.Session:
			r.dec.Reset()
			// Events carry the server they come from into the positions committed in Kafka.
			r.dec.SetOrigin(msg.SystemID, msg.Timeline)
			// A transaction the lost session was in the middle of stays open: the new session
			// replays it from its Begin (nothing after the slot's confirmed position is skipped), and
			// the tracker resumes it, so its events already handed over are not published twice.
			if msg.Timeline != r.tracker.Timeline() {
				// First session, or a failover: positions of another timeline mean nothing here.
				r.tracker.Reset(msg.WALEnd, msg.Timeline)
			}
			tx = nil
			if r.exactlyOnce() {
				// Reading the position may wait (another producer's open transaction in the
				// positions partition, the server's timeline history): a stop ends the wait, since
				// nothing of this session has been handed to Kafka yet.
				taking, cancel := context.WithCancel(hard)
				unhook := context.AfterFunc(stop, cancel)
				err := r.takeUpPosition(taking, msg)
				unhook()
				cancel()
				if err != nil {
					if hard.Err() != nil {
						return nil
					}
					if stop.Err() != nil {
						r.forgetOpenTransaction()
						return nil
					}
					return err
				}
			}
		case replication.Barrier:
			close(msg.Done) // everything before it is with the sink
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
				tx = r.tracker.BeginAt(ch.Tx.CommitLSN, ch.Tx.CommitTime) // nil: already handled before a reconnect
			case decoder.Relation:
				if err := r.relation(hard, ch.Relation); err != nil {
					if hard.Err() != nil {
						return nil
					}
					return err
				}
			case decoder.Insert:
				if tx != nil {
					if !tx.Take(ch.Event.Index) {
						// Committed in Kafka already (exactly-once), or handed over before a
						// reconnect: done, or acknowledged through tx when Kafka has it.
						r.m.EventsSkipped.Inc()
						break
					}
					publish := r.sink.Publish
					if ch.Unusable != nil {
						publish = r.reject(ch.Unusable)
					}
					if err := publish(hard, ch.Event, tx); err != nil {
						if hard.Err() != nil {
							return nil
						}
						return err
					}
				}
			case decoder.Update:
				if err := r.update(ch); err != nil {
					return err
				}
			case decoder.Commit:
				if tx != nil {
					r.tracker.Commit(tx, ch.EndLSN)
					r.m.TransactionsTotal.Inc()
					tx = nil
				}
			case decoder.Message:
				if ch.Prefix != "" && ch.Prefix == r.cfg.Decoder.MessagePrefix {
					// Written outside any transaction's commit: it is not an outbox event, and
					// publishing it could not be tied to a commit. Say so, loudly, each time.
					r.log.Warn("ignored a non-transactional logical decoding message with the outbox prefix: only pg_logical_emit_message(true, ...) inside the producing transaction is an outbox event",
						zap.String("prefix", ch.Prefix), zap.Stringer("lsn", ch.LSN))
				}
				if !r.dec.InTransaction() {
					r.tracker.Idle(ch.LSN)
				}
			}
		}
		// The sink has the event now (and counts its bytes); the stream may read ahead again.
		msg.Release()
	}
}
