package replication

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// Finish ends the stream after Run: it keeps reporting the checkpoint until drained is closed,
// sends the final position, ends the copy stream (waiting, boundedly, until the server has read
// that position) and closes the connection. When ctx ends (a fence, or the shutdown timeout), it
// stops waiting at once: the final position is sent as far as the socket takes it without waiting,
// and the connection is closed.
func (s *Stream) Finish(ctx context.Context, drained <-chan struct{}) error {
	if s.stopGuard != nil {
		defer s.stopGuard()
	}
	if s.conn == nil {
		return nil
	}
	defer s.closeConn(ctx)
	if !s.copying {
		// Stopped before streaming (waiting for Kafka, backfilling): nothing was received, so there
		// is nothing to report and no copy stream to end.
		return nil
	}
	bg := context.WithoutCancel(ctx)
	netConn := s.conn.Conn()
	release := interruptOnDone(ctx, netConn) // a status update stuck on a full socket ends with ctx
	for waiting := true; waiting && ctx.Err() == nil; {
		timer := time.NewTimer(time.Until(s.nextStatus))
		select {
		case <-drained:
			waiting = false
		case <-ctx.Done():
			waiting = false
		case <-timer.C:
			if err := s.sendStatus(bg, false); err != nil && ctx.Err() == nil {
				timer.Stop()
				release()
				return err
			}
		}
		timer.Stop()
	}
	release()
	netConn.SetDeadline(time.Time{})
	if ctx.Err() != nil {
		// Best effort: what the socket takes at once; the server may not read it before the close.
		netConn.SetWriteDeadline(time.Now().Add(cutShortWrite))
		if err := s.sendStatus(bg, false); err != nil {
			return fmt.Errorf("final position not sent (%w): the next start replays from %s at the latest", err, s.reported)
		}
		s.log.Info("final position sent without waiting for the server to read it", zap.Stringer("lsn", s.reported),
			zap.NamedError("cause", context.Cause(ctx)))
		return nil
	}
	// The horizon trails the stream by a check or two; give it that long to cover what Kafka has
	// acknowledged, so a clean stop does not leave more to replay than needed.
	wait, cancel := context.WithTimeout(ctx, 4*s.guard.interval())
	s.guard.waitFor(wait, s.ck.Safe())
	cancel()
	if err := s.sendStatus(bg, false); err != nil {
		return err
	}
	if err := s.endCopy(ctx); err != nil {
		return fmt.Errorf("final position %s sent, but the server may not have read it: %w", s.reported, err)
	}
	s.log.Info("final position confirmed", zap.Stringer("lsn", s.reported))
	return nil
}

// cutShortWrite bounds the final status update of a stop cut short: enough for a socket with
// room, no wait for one without.
const cutShortWrite = 100 * time.Millisecond

// finishTimeout bounds the end of the copy stream at a stop (see endCopy). A walsender in the
// middle of sending a large transaction reads the relay's messages only between its writes, so it
// may not get to the final status update (and answer CopyDone) within it: the connection is then
// closed anyway and the next start replays from the position reported before, which means
// duplicates, never a loss.
const finishTimeout = 5 * time.Second

// endCopy ends the copy stream and waits until the server answers with its own CopyDone, which it
// sends only after reading everything sent before, the final status update included. Closing the
// connection without this loses that update whenever the walsender is still writing: it finds the
// socket closed on its next write and exits without reading what it was sent last, and the next
// start replays what was already published. The wait ends after finishTimeout or with ctx.
func (w *wire) endCopy(ctx context.Context) error {
	netConn := w.conn.Conn()
	netConn.SetDeadline(time.Now().Add(finishTimeout))
	defer netConn.SetDeadline(time.Time{})
	defer interruptOnDone(ctx, netConn)()
	w.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := w.conn.Frontend().Flush(); err != nil {
		return fmt.Errorf("send CopyDone: %w", err)
	}
	for {
		// What the server sent meanwhile lies beyond the final position: it is streamed again.
		msg, err := w.conn.ReceiveMessage(context.Background())
		if err != nil {
			return fmt.Errorf("wait for the server's CopyDone: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyDone:
			w.copying = false
			return nil
		case *pgproto3.ErrorResponse:
			return w.above.streamError(pgconn.ErrorResponseToPgError(m))
		}
	}
}

// interruptOnDone expires netConn's deadlines when ctx ends, until the returned function is called.
// That function waits for a callback already under way, so a deadline its caller sets afterwards
// (endCopy's, or clearing it) is not overwritten by a late "now".
func interruptOnDone(ctx context.Context, netConn interface{ SetDeadline(time.Time) error }) (release func()) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		netConn.SetDeadline(time.Now())
	})
	return func() {
		if !stop() {
			<-fired
		}
	}
}

// closeConn closes the replication connection, waiting at most 5s (and not once ctx has ended) for
// the goodbye to be written.
func (w *wire) closeConn(ctx context.Context) {
	if w.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w.conn.Close(ctx)
	w.conn = nil
	w.copying = false
}
