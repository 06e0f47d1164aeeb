package sink

import (
	"context"
	"net"
	"time"

	"github.com/outbox-relay/outbox-relay/sink/positions"
)

// SetDialer makes the sink's connections to Kafka go through dial; set it before the first
// publish. Tests use it to stall one connection after a request went out.
func SetDialer(s *Sink, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	s.transport.Dial = dial
}

// DecodePosition reads a position record's value.
func DecodePosition(b []byte) (Position, error) {
	pos, _, err := positions.Decode(b)
	return pos, err
}

// OpenPositionTransaction writes pos to the positions topic inside the sink's current Kafka
// transaction and leaves it open, as a relay killed between its position and EndTxn does.
func OpenPositionTransaction(ctx context.Context, s *Sink, pos Position) error {
	_, err := s.txn.positions.Write(ctx, pos, nil)
	return err
}

// SetStableWait sets how long ReadPosition waits for other producers' open transactions in the
// positions partition to end.
func SetStableWait(s *Sink, d time.Duration) { s.txn.stableWait = d }

// PrestartDone is closed once Prestart's attempt has ended.
func PrestartDone(s *Sink) <-chan struct{} { return s.early.done }
