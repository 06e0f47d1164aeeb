package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// streamError maps errors of START_REPLICATION and of the stream to actionable ones.
func (s *Stream) streamError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("replication stream: %w", err)
	}
	switch pgErr.Code {
	case "55006": // object_in_use: "replication slot ... is active for PID n"
		return fmt.Errorf("%w: %s", ErrSlotActive, pgErr.Message)
	case "42704": // undefined_object: the slot or the publication
		if strings.HasPrefix(pgErr.Message, "publication ") && s.cfg.NoTable {
			return fatalf("%s: publication %q was dropped while the relay was streaming; pgoutput needs it, although messages do not depend on what it publishes: recreate it (CREATE PUBLICATION %s) and restart",
				pgErr.Message, s.cfg.Publication, pgx.Identifier{s.cfg.Publication}.Sanitize())
		}
		if strings.HasPrefix(pgErr.Message, "publication ") {
			return fatalf("%s: publication %q was dropped while the relay was streaming, so outbox rows written since are not in the replication stream: recreate it (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)), republish the rows written meanwhile (backfill_since), and restart",
				pgErr.Message, s.cfg.Publication, pgx.Identifier{s.cfg.Publication}.Sanitize(), s.cfg.qualifiedTable())
		}
		if s.cfg.OnSlotLost == SlotLostRecover {
			// Also before this process streamed it: the session's checks found the slot, and it
			// went while the session waited (for Kafka, say) before START_REPLICATION. The next
			// session's checks decide from the slot ledger, as for any missing slot.
			return fmt.Errorf("%w: %s", errSlotGone, pgErr.Message)
		}
		if s.streamed.Load() {
			return fmt.Errorf("%w: %s", ErrSlotLost, pgErr.Message)
		}
		return fatalf("%s: check the slot and publication settings", pgErr.Message)
	case "55000": // object_not_in_prerequisite_state: e.g. the slot's WAL was removed
		if s.cfg.OnSlotLost == SlotLostRecover {
			return fmt.Errorf("%w: %s", errSlotGone, pgErr.Message)
		}
		return fmt.Errorf("%w: %s: the slot can no longer be streamed; drop and recreate it, then reconcile outbox rows written since %s", ErrSlotLost, pgErr.Message, s.reported)
	case "57P01", "57P02", "57P03": // server shutting down or restarting
		return fmt.Errorf("PostgreSQL is shutting down: %w", err)
	}
	if pgErr.Code[:2] == "42" || pgErr.Code[:2] == "22" {
		return fatalf("replication stream: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("replication stream: %w", err)
}

// receive is the session's read loop.
func (s *Stream) receive(ctx context.Context, out chan<- Message) error {
	// ReceiveMessage with a cancellable context starts a goroutine per call to watch it, which at
	// tens of thousands of messages a second is most of this loop's cost. Read with a socket
	// deadline instead, moved only when the next status update is due, and expire it when ctx ends.
	netConn := s.conn.Conn()
	defer netConn.SetDeadline(time.Time{})
	defer interruptOnDone(ctx, netConn)() // before the deadline is cleared: see interruptOnDone
	var deadline time.Time
	lastHeard := time.Now()
	heard := false // the last round received a message
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.serverStopping(); err != nil {
			return err
		}
		// One clock reading a round: at a hundred thousand messages a second, each reading counts.
		now := time.Now()
		if heard {
			lastHeard = now // the message, and the time spent waiting for the consumer, are not server silence
		}
		if s.statusDue(now) {
			// The server sends keepalives only when it has not heard from the relay for half its
			// wal_sender_timeout (never when that is 0) or has sent what the relay has not
			// confirmed, so an idle server says nothing while status updates arrive. Once it has
			// been silent a while, ask for a reply: a healthy one answers at once, so silence
			// up to ReceiveTimeout then means the connection is dead.
			probe := time.Since(lastHeard) >= s.cfg.ReceiveTimeout/3
			if err := s.sendStatus(ctx, probe); err != nil {
				return err
			}
		}
		if next, move := s.readDeadline(now, deadline); move {
			deadline = next
			netConn.SetReadDeadline(deadline)
		}
		raw, err := s.conn.ReceiveMessage(context.Background())
		heard = err == nil
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				if silent := time.Since(lastHeard); silent > s.receiveTimeout {
					return fmt.Errorf("no message from PostgreSQL for %s; presuming the connection dead", silent.Round(time.Second))
				}
				continue
			}
			return fmt.Errorf("receive from PostgreSQL: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(ctx, out, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return s.streamError(pgconn.ErrorResponseToPgError(msg))
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
func (s *Stream) readDeadline(now, deadline time.Time) (time.Time, bool) {
	next := s.nextStatus
	if soon := now.Add(eagerStatusGap); s.received > s.reported && soon.Before(next) {
		next = soon
	}
	return next, !now.Before(deadline) || next.Before(deadline)
}

// statusDue reports whether a status update should go out now.
func (s *Stream) statusDue(now time.Time) bool {
	if !now.Before(s.nextStatus) {
		return true
	}
	return s.confirmable() > s.reported && now.Sub(s.lastStatus) >= eagerStatusGap
}

func (s *Stream) handleCopyData(ctx context.Context, out chan<- Message, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		s.serverEnd = max(s.serverEnd, pkm.ServerWALEnd)
		if s.stopSigns.keepalive(pkm.ReplyRequested, pkm.ServerWALEnd, time.Now(), s.interval) {
			return errWalsenderStopping
		}
		if pkm.ReplyRequested {
			if err := s.sendStatus(ctx, false); err != nil {
				return err
			}
		}
		return s.forward(ctx, out, Message{Kind: Keepalive, WALEnd: pkm.ServerWALEnd})
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		s.stopSigns.data()
		if xld.WALStart > s.received {
			s.received = xld.WALStart
			s.m.ReceivedLSN.Set(float64(xld.WALStart))
		}
		s.serverEnd = max(s.serverEnd, xld.ServerWALEnd, xld.WALStart)
		if xid, ok := beginXid(xld.WALData); ok && (!s.hasXid || xidAfter(xid, s.maxXid)) {
			s.maxXid, s.hasXid = xid, true
		}
		// forward copies the data: pgconn reuses its read buffer.
		return s.forward(ctx, out, Message{Kind: Data, WALStart: xld.WALStart, Data: xld.WALData})
	}
	return nil
}

// forward hands msg to the consumer, sending status updates while it waits: for room in the
// read-ahead budget (Data messages), then for room in the channel. A Data message's bytes belong to
// pgconn's read buffer; they are copied only once admitted, so a row waiting for the budget is not
// held twice.
func (s *Stream) forward(ctx context.Context, out chan<- Message, msg Message) error {
	if msg.Kind == Data {
		for !s.ahead.tryAcquire(int64(len(msg.Data))) {
			if err := s.await(ctx, s.ahead.wake); err != nil {
				return err
			}
		}
		msg.Data, msg.ahead = bytes.Clone(msg.Data), s.ahead
	}
	select {
	case out <- msg:
		return nil
	default:
	}
	for {
		timer := time.NewTimer(time.Until(s.nextStatus))
		select {
		case out <- msg:
			timer.Stop()
			return nil
		case <-timer.C:
			if err := s.sendStatus(ctx, false); err != nil {
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
func (s *Stream) await(ctx context.Context, wake <-chan struct{}) error {
	for {
		timer := time.NewTimer(time.Until(s.nextStatus))
		select {
		case <-wake:
			timer.Stop()
			return nil
		case <-timer.C:
			if err := s.sendStatus(ctx, false); err != nil {
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
func (s *Stream) sendStatus(ctx context.Context, reply bool) error {
	if err := s.guard.Err(); err != nil {
		return err
	}
	if err := s.serverStopping(); err != nil {
		return err
	}
	s.lastStatus = time.Now()
	s.nextStatus = s.lastStatus.Add(s.interval)
	flush := s.confirmable()
	if flush == 0 {
		return nil
	}
	// Remembered before it is sent: a server that read a status update the relay saw fail has
	// confirmed it all the same.
	s.mem.note(s.cfg.Slot, s.identity, true, max(s.serverEnd, s.received), flush, s.maxXid, s.hasXid)
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(s.received, flush),
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	if flush != s.reported {
		s.log.Debug("confirmed", zap.Stringer("lsn", flush))
	}
	s.reported = flush
	s.m.ConfirmedLSN.Set(float64(flush))
	s.m.StatusUpdates.Inc()
	return nil
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// parsePGDuration reads a time setting as current_setting returns it ("60s", "1min", "500ms", "0").
func parsePGDuration(v string) time.Duration {
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"ms", time.Millisecond}, {"min", time.Minute}, {"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			var x int64
			if _, err := fmt.Sscan(n, &x); err == nil {
				return time.Duration(x) * u.unit
			}
		}
	}
	var ms int64
	if _, err := fmt.Sscan(v, &ms); err == nil {
		return time.Duration(ms) * time.Millisecond
	}
	return 0
}

// receiveTimeout is how long a session lets the server stay silent before presuming the
// connection dead: the configured ReceiveTimeout, or longer where a healthy walsender may take
// longer to answer. A walsender decoding a large transaction that gives it nothing to send (rows of
// tables outside the publication) reads the relay's messages, the requests for a reply among them,
// only once it has not heard from the relay for half its wal_sender_timeout; it then sends a
// keepalive itself, and it gives the relay up after a whole wal_sender_timeout without reading
// anything. So it answers within about wal_sender_timeout, plus up to a status interval on either
// side before the relay's next message goes out and is read. With wal_sender_timeout 0 it reads
// the relay's messages at every progress update of such a decode, so ReceiveTimeout stands.
func receiveTimeout(configured, senderTimeout, interval time.Duration) time.Duration {
	return max(configured, senderTimeout+2*interval)
}
