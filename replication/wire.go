package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/metrics"
)

// wire is the replication connection in copy mode, and what it knows of the server's WAL: it reads
// CopyData, answers keepalives, hands messages to the consumer within the read-ahead budget, and
// sends standby status updates. It runs no catalog SQL and decides nothing about the slot: what a
// status update may confirm, and whether the session must end instead, it asks above. One
// goroutine (Stream.Run's, then Stream.Finish's) uses it at a time: pgconn is not safe for
// concurrent use.
type wire struct {
	conn  *pgconn.PgConn
	above wireOwner
	log   *zap.Logger
	m     *metrics.Metrics
	ahead *readAhead

	interval   time.Duration // status interval for the current session
	nextStatus time.Time
	lastStatus time.Time
	received   pglogrepl.LSN
	reported   pglogrepl.LSN
	// serverEnd is the server's end of WAL as this session knows it (IDENTIFY_SYSTEM, then data
	// and keepalives): nothing beyond it is ever confirmed. maxXid is the newest transaction id of
	// a Begin received.
	serverEnd pglogrepl.LSN
	maxXid    uint32
	hasXid    bool
	// receiveTimeout is how long the server may be silent in this session: ReceiveTimeout, or
	// longer when the server's wal_sender_timeout says a busy walsender may take longer to answer.
	// After probeAfter (a third of ReceiveTimeout) in silence, status updates ask for a reply.
	receiveTimeout time.Duration
	probeAfter     time.Duration

	// copying is set while the connection is in copy mode (START_REPLICATION succeeded): only then
	// is there a copy stream for Finish to end.
	copying bool
	// streamingSince is when the session's START_REPLICATION succeeded; stopSigns watches its
	// keepalives. Both tell when the server shuts down (shutdown.go).
	streamingSince time.Time
	stopSigns      stopSigns
}

// wireOwner is what the wire loop asks the layer above (Stream: the slot's life and the guards).
// The wire loop is its one caller.
type wireOwner interface {
	// serverStopping ends the session when the server shuts down (shutdown.go); asked every round.
	serverStopping() error
	// beforeStatus ends the session instead of a status update: a guard's finding, or the server
	// shutting down.
	beforeStatus() error
	// confirmable is the position a status update may confirm; 0: none yet.
	confirmable() pglogrepl.LSN
	// confirming is told the position a status update is about to confirm, before it is sent: a
	// server that read an update the relay saw fail has confirmed it all the same.
	confirming(flush pglogrepl.LSN)
	// streamError maps an error of the stream to one the relay can act on.
	streamError(err error) error
}

// receive is the session's read loop.
func (w *wire) receive(ctx context.Context, out chan<- Message) error {
	// ReceiveMessage with a cancellable context starts a goroutine per call to watch it, which at
	// tens of thousands of messages a second is most of this loop's cost. Read with a socket
	// deadline instead, moved only when the next status update is due, and expire it when ctx ends.
	netConn := w.conn.Conn()
	defer netConn.SetDeadline(time.Time{})
	defer interruptOnDone(ctx, netConn)() // before the deadline is cleared: see interruptOnDone
	var deadline time.Time
	lastHeard := time.Now()
	heard := false // the last round received a message
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.above.serverStopping(); err != nil {
			return err
		}
		// One clock reading a round: at a hundred thousand messages a second, each reading counts.
		now := time.Now()
		if heard {
			lastHeard = now // the message, and the time spent waiting for the consumer, are not server silence
		}
		if w.statusDue(now) {
			// The server sends keepalives only when it has not heard from the relay for half its
			// wal_sender_timeout (never when that is 0) or has sent what the relay has not
			// confirmed, so an idle server says nothing while status updates arrive. Once it has
			// been silent a while, ask for a reply: a healthy one answers at once, so silence
			// up to ReceiveTimeout then means the connection is dead.
			probe := time.Since(lastHeard) >= w.probeAfter
			if err := w.sendStatus(ctx, probe); err != nil {
				return err
			}
		}
		if next, move := w.readDeadline(now, deadline); move {
			deadline = next
			netConn.SetReadDeadline(deadline)
		}
		raw, err := w.conn.ReceiveMessage(context.Background())
		heard = err == nil
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				if silent := time.Since(lastHeard); silent > w.receiveTimeout {
					return fmt.Errorf("no message from PostgreSQL for %s; presuming the connection dead", silent.Round(time.Second))
				}
				continue
			}
			return fmt.Errorf("receive from PostgreSQL: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.CopyData:
			if err := w.handleCopyData(ctx, out, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return w.above.streamError(pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("PostgreSQL ended the replication stream")
		}
	}
}

// eagerStatusGap is the least time between status updates sent because the checkpoint moved (rather
// than because the interval passed): confirming soon after Kafka acknowledges keeps the window of
// events replayed after a crash small, at the cost of one small message per gap.
const eagerStatusGap = 100 * time.Millisecond

// readDeadline says when the receive loop should wake up if nothing arrives, and whether that
// moves the deadline it has: for the next status update, and while received events await
// confirmation sooner, so the position goes out soon after it becomes confirmable (Kafka has
// acknowledged it and the publication check has verified it: see horizon) once the stream goes
// quiet. The deadline moves when it has passed or when an earlier one is wanted (the first message
// after a quiet spell: with the deadline left at the next status update, its confirmation waited
// for that even once confirmable), never later on a busy stream, where moving it at every message
// would cost a system call each.
func (w *wire) readDeadline(now, deadline time.Time) (time.Time, bool) {
	next := w.nextStatus
	if soon := now.Add(eagerStatusGap); w.received > w.reported && soon.Before(next) {
		next = soon
	}
	return next, !now.Before(deadline) || next.Before(deadline)
}

// statusDue reports whether a status update should go out now.
func (w *wire) statusDue(now time.Time) bool {
	if !now.Before(w.nextStatus) {
		return true
	}
	return w.above.confirmable() > w.reported && now.Sub(w.lastStatus) >= eagerStatusGap
}

func (w *wire) handleCopyData(ctx context.Context, out chan<- Message, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		w.serverEnd = max(w.serverEnd, pkm.ServerWALEnd)
		if w.stopSigns.keepalive(pkm.ReplyRequested, pkm.ServerWALEnd, time.Now(), w.interval) {
			return errWalsenderStopping
		}
		if pkm.ReplyRequested {
			if err := w.sendStatus(ctx, false); err != nil {
				return err
			}
		}
		return w.forward(ctx, out, Message{Kind: Keepalive, WALEnd: pkm.ServerWALEnd})
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		w.stopSigns.data()
		if xld.WALStart > w.received {
			w.received = xld.WALStart
			w.m.ReceivedLSN.Set(float64(xld.WALStart))
		}
		w.serverEnd = max(w.serverEnd, xld.ServerWALEnd, xld.WALStart)
		if xid, ok := beginXid(xld.WALData); ok && (!w.hasXid || xidAfter(xid, w.maxXid)) {
			w.maxXid, w.hasXid = xid, true
		}
		// forward copies the data: pgconn reuses its read buffer.
		return w.forward(ctx, out, Message{Kind: Data, WALStart: xld.WALStart, Data: xld.WALData})
	}
	return nil
}

// forward hands msg to the consumer, sending status updates while it waits: for room in the
// read-ahead budget (Data messages), then for room in the channel. A Data message's bytes belong to
// pgconn's read buffer; they are copied only once admitted, so a row waiting for the budget is not
// held twice.
func (w *wire) forward(ctx context.Context, out chan<- Message, msg Message) error {
	if msg.Kind == Data {
		for !w.ahead.tryAcquire(int64(len(msg.Data))) {
			if err := w.await(ctx, w.ahead.wake); err != nil {
				return err
			}
		}
		msg.Data, msg.ahead = bytes.Clone(msg.Data), w.ahead
	}
	select {
	case out <- msg:
		return nil
	default:
	}
	for {
		timer := time.NewTimer(time.Until(w.nextStatus))
		select {
		case out <- msg:
			timer.Stop()
			return nil
		case <-timer.C:
			if err := w.sendStatus(ctx, false); err != nil {
				msg.Release()
				return err
			}
		case <-ctx.Done():
			timer.Stop()
			msg.Release()
			return ctx.Err()
		}
	}
}

// await waits for wake, sending status updates meanwhile.
func (w *wire) await(ctx context.Context, wake <-chan struct{}) error {
	for {
		timer := time.NewTimer(time.Until(w.nextStatus))
		select {
		case <-wake:
			timer.Stop()
			return nil
		case <-timer.C:
			if err := w.sendStatus(ctx, false); err != nil {
				return err
			}
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
}

// sendStatus reports the checkpoint's position. Write, flush and apply are all set explicitly:
// pglogrepl replaces a zero flush position with the write position, which would confirm events
// that Kafka has not acknowledged.
func (w *wire) sendStatus(ctx context.Context, reply bool) error {
	if err := w.above.beforeStatus(); err != nil {
		return err
	}
	w.lastStatus = time.Now()
	w.nextStatus = w.lastStatus.Add(w.interval)
	flush := w.above.confirmable()
	if flush == 0 {
		return nil
	}
	// Remembered before it is sent: a server that read a status update the relay saw fail has
	// confirmed it all the same.
	w.above.confirming(flush)
	err := pglogrepl.SendStandbyStatusUpdate(ctx, w.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(w.received, flush),
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	if flush != w.reported {
		w.log.Debug("confirmed", zap.Stringer("lsn", flush))
	}
	w.reported = flush
	w.m.ConfirmedLSN.Set(float64(flush))
	w.m.StatusUpdates.Inc()
	return nil
}
