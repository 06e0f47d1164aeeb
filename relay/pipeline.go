package relay

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/replication"
)

// pipeline decodes messages in WAL order and hands events to the sink, tracking every transaction
// so the checkpoint knows what Kafka still owes. It returns when msgs is closed, on an error, at the
// first transaction boundary after stop ends, or at once when hard ends (nothing more is handed to
// Kafka then, not even what was already received).
func (w *walSource) pipeline(stop, hard context.Context, msgs <-chan replication.Message) error {
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
			w.forgetOpenTransaction()
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
			w.forgetOpenTransaction()
			return nil
		}
		if done, err := w.handle(stop, hard, msg, &tx); done || err != nil {
			return err
		}
		// The sink has the event now (and counts its bytes); the stream may read ahead again.
		msg.Release()
	}
}

// handle is the pipeline's step for one message; tx is the transaction being read (nil between
// transactions, and in one already handled before a reconnect). done: the pipeline ends (with err).
func (w *walSource) handle(stop, hard context.Context, msg replication.Message, tx **checkpoint.Txn) (done bool, err error) {
	switch msg.Kind {
	case replication.Session:
		*tx = nil
		return w.session(stop, hard, msg)
	case replication.Barrier:
		close(msg.Done) // everything before it is with the sink
	case replication.Keepalive:
		// Inside a transaction (even one being skipped as a replay) the server's WAL end may lie
		// beyond events not yet received.
		if !w.dec.InTransaction() {
			w.tracker.Idle(msg.WALEnd)
		}
	case replication.Data:
		ch, err := w.dec.Decode(msg.WALStart, msg.Data)
		if err != nil {
			return true, fmt.Errorf("decode the replication stream: %w", err)
		}
		if err := w.change(hard, ch, tx); err != nil {
			if errors.Is(err, errHardStopped) {
				return true, nil
			}
			return true, err
		}
	}
	return false, nil
}

// session starts a new replication session in the pipeline. done: the pipeline ends (with err).
func (w *walSource) session(stop, hard context.Context, msg replication.Message) (done bool, err error) {
	w.dec.Reset()
	// Events carry the server they come from into the positions committed in Kafka.
	w.dec.SetOrigin(msg.SystemID, msg.Timeline)
	// A transaction the lost session was in the middle of stays open: the new session replays it
	// from its Begin (nothing after the slot's confirmed position is skipped), and the tracker
	// resumes it, so its events already handed over are not published twice.
	if msg.Timeline != w.tracker.Timeline() {
		// First session, or a failover: positions of another timeline mean nothing here.
		w.tracker.Reset(msg.WALEnd, msg.Timeline)
	}
	if !w.exactlyOnce() {
		return false, nil
	}
	// Reading the position may wait (another producer's open transaction in the positions
	// partition, the server's timeline history): a stop ends the wait, since nothing of this
	// session has been handed to Kafka yet.
	taking, cancel := context.WithCancel(hard)
	unhook := context.AfterFunc(stop, cancel)
	err = w.takeUpPosition(taking, msg)
	unhook()
	cancel()
	switch {
	case err == nil:
		return false, nil
	case hard.Err() != nil:
		return true, nil
	case stop.Err() != nil:
		w.forgetOpenTransaction()
		return true, nil
	}
	return true, err
}

// errHardStopped is what change returns when a wait of its ended with hard: the pipeline ends
// without an error of its own.
var errHardStopped = errors.New("hard stop")

// change applies one decoded change: a transaction's bounds to the tracker, its events to the
// sink.
func (w *walSource) change(hard context.Context, ch decoder.Change, tx **checkpoint.Txn) error {
	switch ch.Kind {
	case decoder.Begin:
		*tx = w.tracker.BeginAt(ch.Tx.CommitLSN, ch.Tx.CommitTime) // nil: already handled before a reconnect
	case decoder.Relation:
		return orHardStop(hard, w.relation(hard, ch.Relation))
	case decoder.Insert:
		if *tx == nil {
			return nil
		}
		if !(*tx).Take(ch.Event.Index) {
			// Committed in Kafka already (exactly-once), or handed over before a reconnect: done,
			// or acknowledged through tx when Kafka has it.
			w.m.EventsSkipped.Inc()
			return nil
		}
		publish := w.sink.Publish
		if ch.Unusable != nil {
			publish = w.reject(ch.Unusable)
		}
		return orHardStop(hard, publish(hard, ch.Event, *tx))
	case decoder.Update:
		return w.update(ch)
	case decoder.Commit:
		if *tx != nil {
			w.tracker.Commit(*tx, ch.EndLSN)
			w.m.TransactionsTotal.Inc()
			*tx = nil
		}
	case decoder.Message:
		if ch.Prefix != "" && ch.Prefix == w.cfg.Decoder.MessagePrefix {
			// Written outside any transaction's commit: it is not an outbox event, and publishing
			// it could not be tied to a commit. Say so, loudly, each time.
			w.log.Warn("ignored a non-transactional logical decoding message with the outbox prefix: only pg_logical_emit_message(true, ...) inside the producing transaction is an outbox event",
				zap.String("prefix", ch.Prefix), zap.Stringer("lsn", ch.LSN))
		}
		if !w.dec.InTransaction() {
			w.tracker.Idle(ch.LSN)
		}
	}
	return nil
}

// orHardStop is errHardStopped for an error that came once hard ended, err otherwise.
func orHardStop(hard context.Context, err error) error {
	if err != nil && hard.Err() != nil {
		return errHardStopped
	}
	return err
}

// update handles an UPDATE of the outbox table: never an event (the outbox is append-only), but
// said, at the level OnUpdate chooses, or the end of the relay before the transaction is confirmed.
func (w *walSource) update(ch decoder.Change) error {
	fields := []zap.Field{zap.String("table", ch.Prefix), zap.Uint32("xid", ch.Tx.Xid), zap.Stringer("commit_lsn", ch.Tx.CommitLSN)}
	switch w.cfg.OnUpdate {
	case "fatal":
		return replication.Fatal(fmt.Errorf("an UPDATE of outbox table %s in transaction %d (commit %s) and on_update is fatal: outbox rows must only be inserted; fix the producer, then set on_update to warn or error to go past this transaction (the slot stays before it)",
			ch.Prefix, ch.Tx.Xid, ch.Tx.CommitLSN))
	case "error":
		w.log.Error("an UPDATE of the outbox table was ignored: outbox rows must only be inserted", fields...)
	default:
		w.log.Warn("an UPDATE of the outbox table was ignored: outbox rows must only be inserted", fields...)
	}
	return nil
}

// forgetOpenTransaction aborts, in the tracker, a transaction whose Commit will not come: the
// stream ended (a stop while it was reconnecting, or a fatal error), or a stop came while a new
// session was replaying transactions before it. The next start replays it from its Begin, events
// already sent included (unless, with exactly-once delivery, a committed Kafka transaction holds
// them).
func (w *walSource) forgetOpenTransaction() {
	if commitLSN, aborted := w.tracker.Abort(); aborted {
		w.log.Warn("the replication stream ended inside a transaction; the next start replays it, publishing its events already sent again",
			zap.Stringer("commit_lsn", commitLSN))
	}
}
