package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// What a leader needs to tell a Kafka it cannot reach from one that is merely quiet (see
// cmd/outbox-relay: leader_kafka_timeout): when Kafka last answered anything, and whether the sink
// is still waiting for it to start.

// answered records that a broker answered: an acknowledgement, a refusal, a topic-level error.
func (s *Sink) answered() { s.lastAnswer.Store(time.Now().UnixNano()) }

// LastAnswer is when a broker last answered the sink's producers (acknowledged a batch, refused
// one, said a topic is missing or not authorized) or its start's metadata request; zero if never.
// Retries against a broker that is down or cut off answer nothing.
func (s *Sink) LastAnswer() time.Time {
	if n := s.lastAnswer.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Starting reports whether WaitReady is waiting for Kafka (the brokers' metadata, the producer id,
// the positions topic).
func (s *Sink) Starting() bool { return s.starting.Load() }

// Reachable sends one metadata request to cfg's brokers, over a fresh connection made as the
// sink's are (TLS, SASL), and reports whether they answered within timeout. It needs no Sink: a
// standby asks it before trying to take the leader lock. A broker that answers with an error, or a
// TLS handshake that fails on a certificate, counts as reachable: that is a problem of the
// configuration, which the relay's start reports (and exits on), not of the network.
func Reachable(ctx context.Context, cfg Config, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client, probe := NewClient(cfg, timeout)
	defer probe.CloseIdleConnections()
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
	if err == nil && len(md.Brokers) == 0 {
		err = errors.New("metadata lists no brokers")
	}
	var kerr kafka.Error
	if _, tls := tlsProblem(err); errors.As(err, &kerr) || tls {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kafka at %v did not answer a metadata request within %s: %w", cfg.Brokers, timeout, err)
	}
	return nil
}
