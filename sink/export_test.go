package sink

import (
	"context"
	"net"
)

// SetDialer makes the sink's connections to Kafka go through dial; set it before the first
// publish. Tests use it to stall one connection after a request went out.
func SetDialer(s *Sink, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	s.transport.Dial = dial
}

// DecodePosition reads a position record's value.
var DecodePosition = decodePosition

// HoldTransactions makes Kafka transactions stay open until their Interval is over (or until
// Close), instead of committing as soon as the committer is free: tests use it to look at an
// open transaction. Call it before the first publish.
func HoldTransactions(s *Sink) {
	s.txn.mu.Lock()
	defer s.txn.mu.Unlock()
	s.txn.linger = s.txn.cfg.Interval
}
