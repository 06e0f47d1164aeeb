package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/positions"
	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// exactlyOnce is the sink's side of exactly-once delivery. The Kafka transactions themselves are
// the producer package's (producer.Committer): the stream is cut into transactions, each a prefix
// of what is left in publish (WAL) order, committed one after the other. The sink is the
// committer's owner: into each transaction it writes the Position of the transaction's last
// event (package positions), it acknowledges the events only once the transaction committed (the
// slot is confirmed only past what a read_committed consumer can see), and a halt aborts the
// transaction holding the halted event, committing every one before it.
type exactlyOnce struct {
	s         *Sink
	c         *producer.Committer
	positions *positions.Writer // set by New once the producers exist
	// stableWait bounds how long ReadPosition waits for other producers' open transactions in the
	// positions partition (positions.Read); set from Transactions.Timeout.
	stableWait time.Duration
	// settled says the first ReadPosition settled what earlier producers left (Committer.Settle).
	settled atomic.Bool

	mu     sync.Mutex
	last   Position // of the last transaction committed
	lastOK bool
}

func newExactlyOnce(s *Sink, cfg Transactions, ident *producer.Identity) *exactlyOnce {
	e := &exactlyOnce{s: s, stableWait: positions.StableWait(cfg.Timeout)}
	e.c = producer.NewCommitter(producer.CommitterConfig{
		Client: s.client, ID: cfg.ID, Identity: ident, Timeout: s.cfg.WriteTimeout,
		// Two transactions must fit in the in-flight window: one committing, one filling.
		MaxRecords: min(cfg.MaxEvents, s.cfg.MaxInFlight/2),
		Linger:     min(cmp.Or(cfg.Linger, max(0, s.cfg.Linger)), cfg.Interval),
		Owner:      e,
		Log:        s.log,
	})
	return e
}

// carry makes main, the events' producer, carry the positions too: a position and the events of
// its transaction are numbered by one producer id and epoch. New calls it once the producers
// exist, before anything is published.
func (e *exactlyOnce) carry(main *producer.Producer) {
	s, cfg := e.s, e.s.cfg.Transactions
	e.positions = positions.NewWriter(positions.WriterConfig{
		Topic: cfg.PositionsTopic, ID: cfg.ID, Client: s.client, Identity: s.ident, Committer: e.c,
		Producer: main, Retrying: s.retrying, Log: s.log,
	})
}

// Halted is the generation of the Kafka transaction holding the halted event (producer.Owner).
func (e *exactlyOnce) Halted() (uint64, bool) {
	if h := e.s.halted.Load(); h != nil {
		return h.txn, true
	}
	return 0, false
}

// Companion is the positions partition, once resolved (producer.Owner).
func (e *exactlyOnce) Companion() (producer.TopicPartition, bool) { return e.positions.Partition() }

// BeforeCommit writes the position of last's event inside the transaction (producer.Owner).
func (e *exactlyOnce) BeforeCommit(ctx context.Context, last *producer.Record, spans map[producer.TopicPartition]producer.Span) (producer.TopicPartition, int64, error) {
	offset, err := e.positions.Write(ctx, positionOf(last), spans)
	tp, _ := e.positions.Partition()
	return tp, offset, err
}

// Committed records the position of the transaction committed (producer.Owner).
func (e *exactlyOnce) Committed(last *producer.Record) {
	pos := positionOf(last)
	e.mu.Lock()
	e.last, e.lastOK = pos, true
	e.mu.Unlock()
}

// positionOf is the position a transaction whose last event is rec's reaches.
func positionOf(rec *producer.Record) Position {
	ev := rec.Owner.(*delivery).ev
	return Position{CommitLSN: ev.Tx.CommitLSN, Events: ev.Index + 1, SystemID: ev.Tx.SystemID, Timeline: ev.Tx.Timeline}
}

// committed returns the position of the last Kafka transaction this sink committed.
func (e *exactlyOnce) committed() (Position, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last, e.lastOK
}

// commitOwnOpen commits what this producer may have left open in the positions partition: a
// position whose commit marker was lost holds the partition's last stable offset down until this
// producer's next transaction there, and a start's read waits for it (positions.Read). Call it
// after fencing.
func (e *exactlyOnce) commitOwnOpen(ctx context.Context) error {
	if err := e.positions.Resolve(ctx); err != nil {
		return err
	}
	tp, _ := e.positions.Partition()
	if err := e.c.CommitOpen(ctx, tp); err != nil {
		return fmt.Errorf("positions topic %w", err)
	}
	return nil
}

// Count counts a Kafka transaction's outcome (producer.Owner).
func (e *exactlyOnce) Count(outcome string) {
	e.s.m.KafkaTransactions.WithLabelValues(outcome).Inc()
}

// Stopped ends the sink for good after the Kafka transactions stopped on err (producer.Owner).
func (e *exactlyOnce) Stopped(err error, fenced bool) {
	s, id := e.s, e.s.cfg.Transactions.ID
	switch {
	case errors.Is(err, positions.ErrRefused):
		// Not ErrAborted: a fresh start would abort again, for ever. An operator fixes this.
		s.fatal(fmt.Errorf("sink: transactional id %q: %w", id, err))
		s.log.Error("kafka transaction aborted: the relay may not write its positions topic; stopping",
			zap.String("transactional_id", id), zap.Error(err))
	case fenced:
		s.fatal(fmt.Errorf("sink: transactional id %q: %w (%v)", id, ErrFenced, err))
		s.log.Error("fenced: another relay with the same transactional id took over; this one stops and writes nothing more",
			zap.String("transactional_id", id), zap.Error(err))
	default:
		s.fatal(fmt.Errorf("sink: transactional id %q: %w: %v; nothing of it was acknowledged, so it is replayed from the last committed position", id, ErrAborted, err))
		s.log.Error("kafka transaction aborted; stopping the sink so the relay replays from the last committed position",
			zap.String("transactional_id", id), zap.Error(err))
	}
	s.stop()
}
