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
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// walSource reads the outbox from the WAL through a replication slot: the stream feeds the
// pipeline (decoder, tracker, sink; pipeline.go), and the position Kafka acknowledged goes back to
// the slot. It is built from the relay's configuration and the sink the relay owns (newWALSource)
// and knows nothing else of the relay: the lifecycle comes with run.
type walSource struct {
	cfg     Config
	log     *zap.Logger
	m       *metrics.Metrics
	tracker *checkpoint.Tracker
	dec     *decoder.Decoder
	sink    *sink.Sink
	stream  *replication.Stream
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
	// updatesChecked: checkUpdatesPublished ran (once per source).
	updatesChecked bool
	// cancelledReads ends the relay when reads of the outbox table are cancelled again and again.
	cancelledReads cancelledReads
}

// newWALSource builds the WAL source over sk, which the relay owns (it closes it). cfg is the
// relay's, with New's defaults applied; the replication settings that follow from the rest of it
// (read-ahead, the callbacks, the exported snapshot) are set here. Nothing is contacted until run.
func newWALSource(cfg Config, sk *sink.Sink, log *zap.Logger, m *metrics.Metrics) *walSource {
	w := &walSource{cfg: cfg, log: log, m: m, tracker: checkpoint.New(0), dec: decoder.New(cfg.Decoder), sink: sk}
	w.positions = sk.ReadPosition // after the sink has fenced earlier producers
	w.history = func(ctx context.Context, timeline uint32) (replication.Identity, []replication.TimelineSwitch, error) {
		return replication.TimelineHistory(ctx, &w.cfg.Replication, timeline)
	}
	if cfg.Sink.MaxInFlightSize > 0 && w.cfg.Replication.BufferBytes <= 0 {
		// Rows read ahead of the sink are a quarter of what the sink may hold (16 MiB with the
		// defaults), so memory stays a small multiple of max_in_flight_bytes (docs/guarantees.md).
		w.cfg.Replication.BufferBytes = cfg.Sink.MaxInFlightSize / 4
	}
	w.cfg.Replication.BeforeStream = w.beforeStream
	if cfg.Replication.OnSlotLost == replication.SlotLostRecover {
		w.cfg.Replication.Recover = w.recoverGap
		// Messages are stored nowhere but the WAL: a lost slot takes them with it.
		w.cfg.Replication.MessageEvents = cfg.Decoder.MessagePrefix != ""
	}
	w.cfg.Replication.ExportSnapshot = cfg.Backfill != nil
	w.stream = replication.New(w.cfg.Replication, w.tracker, log.Named("replication"), m)
	return w
}

// streaming reports whether a replication session has started (it stays set across reconnects).
func (w *walSource) streaming() bool { return w.stream.Streamed() }

// stopping: a session lost from here on is not replaced, since the stop would only wait for it.
func (w *walSource) stopping() { w.stream.StopReconnecting() }

// run streams until the stop, and drains (see Relay.Run). Every goroutine it starts ends before it
// returns; closing the sink is left to the relay, with the wait run returns: none once nothing
// more will be acknowledged (a halted sink, a fence).
func (w *walSource) run(life *lifecycle) (closeWait time.Duration, err error) {
	// reading ends once the pipeline has stopped (at a transaction boundary after the stop, or on
	// an error), or with hard.
	reading, stopReading := context.WithCancel(life.hard)
	defer stopReading()
	var helpers sync.WaitGroup
	sinkErr := w.startHelpers(&helpers, life, reading)
	confirmed := newConfirmedRecorder(w.tracker, &w.cfg.Replication, w.log)
	helpers.Go(func() { confirmed.run(reading) })

	msgs := make(chan replication.Message, w.stream.Buffer())
	drained := make(chan struct{}) // closed once the pipeline is done and Kafka has acknowledged it all
	piped := make(chan error, 1)
	go func() {
		err := w.pipeline(life.stop, life.abandon, msgs)
		stopReading()
		if err == nil {
			select {
			case <-w.tracker.Drained():
			case <-life.abandon.Done():
			}
		}
		close(drained)
		piped <- err
	}()

	// Kafka's part of the start (metadata, the idempotent producer's id) overlaps PostgreSQL's
	// checks; the verdict stays in beforeStream, after the slot exists.
	w.sink.Prestart(reading)
	streamErr := w.replicate(life, reading, msgs, drained)
	if life.hard.Err() == nil {
		// The last word on how far Kafka acknowledged, after the drain: a clean stop leaves a lost
		// slot's recovery nothing to publish twice. Not on a fence or after the shutdown timeout
		// (hard has ended), and bounded: a silent server must not hold the stop.
		wctx, cancel := context.WithTimeout(life.hard, time.Second)
		confirmed.write(wctx)
		cancel()
	}
	halted := context.Cause(life.abandon) == errHalted
	life.hardStop(nil) // the pipeline and the helpers let go
	pipeErr := <-piped
	helpers.Wait()
	closeConfirmed, cancelClose := context.WithTimeout(context.Background(), 100*time.Millisecond)
	confirmed.close(closeConfirmed)
	cancelClose()
	closeWait = time.Second
	if halted || life.isFenced() {
		// What the halted sink holds is never acknowledged. A fenced relay commits nothing more:
		// another instance may lead already, and the open Kafka transaction (the gap of a
		// recovery, a stream's events) is aborted, never committed; nothing waits for Kafka.
		closeWait = 0
	}
	switch {
	case *sinkErr != nil:
		return closeWait, *sinkErr
	case streamErr != nil:
		return closeWait, streamErr
	case pipeErr != nil && !errors.Is(pipeErr, context.Canceled):
		return closeWait, pipeErr
	}
	return closeWait, nil
}

// replicate runs the replication stream until reading ends, then keeps reporting while Kafka
// acknowledges what is in flight (until drained, or hard ends), and reports the final position.
func (w *walSource) replicate(life *lifecycle, reading context.Context, msgs chan<- replication.Message, drained <-chan struct{}) error {
	err := w.stream.Run(reading, msgs)
	if err == nil {
		if ferr := w.stream.Finish(life.hard, drained); ferr != nil {
			w.log.Warn("could not report the final position; the next start replays from the last one reported", zap.Error(ferr))
			if replication.IsFatal(ferr) {
				err = ferr // a publication check failed during the drain: not a clean stop
			}
		}
	}
	if life.timedOut() {
		events, _ := w.sink.InFlight()
		w.log.Warn("shutdown timeout: events not acknowledged by Kafka will be published again on the next start",
			zap.Int64("events", events), zap.Duration("shutdown_timeout", w.cfg.ShutdownTimeout))
	}
	return err
}

// startHelpers starts the goroutines that serve the stream beside the pipeline, each ended by the
// lifecycle or by reading: the heartbeat, the halt watch, the sink-failure watch and (exactly-once)
// the positions recorder. The sink's failure, if it comes, is in *sinkErr once helpers are done.
func (w *walSource) startHelpers(helpers *sync.WaitGroup, life *lifecycle, reading context.Context) (sinkErr *error) {
	if w.cfg.HeartbeatInterval > 0 {
		helpers.Go(func() { w.heartbeat(reading, w.cfg.HeartbeatInterval) })
	}
	helpers.Go(func() { w.watchHalt(life) })
	// A sink that failed for good (exactly-once: fenced by a newer producer, or a Kafka transaction
	// aborted; either mode: a producer the broker refused for good) acknowledges nothing more: stop
	// at once, like a fence, without waiting for anything.
	failedMsg := "the Kafka producer stopped for good; stopping at once: nothing more is published, and what Kafka had not acknowledged is not confirmed to PostgreSQL (the next start publishes it again)"
	if w.exactlyOnce() {
		failedMsg = "exactly-once: the Kafka producer stopped for good; stopping at once: nothing more is published, what its open transaction held is invisible to read_committed consumers and never confirmed to PostgreSQL"
	}
	sinkErr = new(error)
	helpers.Go(func() {
		select {
		case <-w.sink.Failed():
			*sinkErr = sinkFailed(w.sink.Err())
			w.log.Error(failedMsg, zap.Error(w.sink.Err()))
			life.hardStop(*sinkErr)
		case <-life.hard.Done():
		}
	})
	if w.exactlyOnce() {
		helpers.Go(func() { w.recordPositions(reading) })
	}
	return sinkErr
}

// watchHalt gives up on the drain (abandon with errHalted) when a stop finds the sink halted, or
// once it halts afterwards: the halted event is never acknowledged, and nothing after it is sent,
// so waiting for the open transaction or for Kafka could only end in the shutdown timeout. The
// halt guarantee does not depend on it: the checkpoint never passes the unacknowledged event.
func (w *walSource) watchHalt(life *lifecycle) {
	select {
	case <-life.stop.Done():
		if life.abandon.Err() != nil {
			return // a hard stop: nobody waits for anything already
		}
	case <-life.abandon.Done():
		return
	}
	// The sink reports a halt by state only; a stop is rare, so polling it is cheap enough.
	tick := time.NewTicker(haltPoll)
	defer tick.Stop()
	for {
		if id, reason, err, halted := w.sink.Halted(); halted {
			w.log.Warn("stopping while halted on an event: nothing more will be acknowledged, so the stop waits for nothing; the slot stays before the halted event",
				zap.String("event_id", id), zap.String("reason", reason), zap.Error(err), zap.Stringer("final_position", w.tracker.Safe()))
			life.giveUp(errHalted)
			return
		}
		select {
		case <-tick.C:
		case <-life.abandon.Done():
			return
		}
	}
}

// haltPoll is how often a stop looks whether the sink has halted.
const haltPoll = 50 * time.Millisecond

// beforeStream runs once the slot exists and before streaming starts: waiting for Kafka there
// rather than before connecting to PostgreSQL means a first start during a Kafka outage has already
// created its slot, so events committed while it waits are not missed.
func (w *walSource) beforeStream(ctx context.Context, snapshot string) error {
	if !w.kafkaReady {
		if w.exactlyOnce() {
			defer time.AfterFunc(transactionsHintAfter, w.transactionsHint).Stop()
		}
		if err := w.sink.WaitReady(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return replication.Fatal(err)
		}
		w.kafkaReady = true
	}
	if !w.updatesChecked && (w.cfg.OnUpdate == "error" || w.cfg.OnUpdate == "fatal") && !w.cfg.Decoder.NoTable {
		w.updatesChecked = true
		w.checkUpdatesPublished(ctx)
	}
	if w.exactlyOnce() {
		if err := w.startingPosition(ctx); err != nil {
			return err
		}
	}
	if w.cfg.Backfill == nil {
		return nil
	}
	if err := w.backfill(ctx, snapshot); err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	return nil
}

// checkUpdatesPublished warns when on_update asks to act on UPDATEs that the publication does not
// publish: pgoutput sends an UPDATE only if it does, so the setting would do nothing.
func (w *walSource) checkUpdatesPublished(ctx context.Context) {
	conn, err := w.cfg.Replication.Connect(ctx) // the relay's credentials: pg_password_file
	if err != nil {
		return // the stream reports connection problems itself
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var published bool
	if err := conn.QueryRow(ctx, "SELECT pubupdate FROM pg_publication WHERE pubname = $1", w.cfg.Replication.Publication).Scan(&published); err == nil && !published {
		w.log.Warn("on_update has no effect: the publication does not publish UPDATEs, so the stream never carries one; run ALTER PUBLICATION ... SET (publish = 'insert, update') to have UPDATEs of the outbox table reported (the table then needs a replica identity, which its primary key gives)",
			zap.String("publication", w.cfg.Replication.Publication), zap.String("on_update", w.cfg.OnUpdate))
	}
}
