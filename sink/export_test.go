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
