package sink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

func TestPermanentAndReason(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		permanent bool
		reason    string // only checked for permanent errors and MessageTooLargeError
	}{
		{"a broker's message size too large is permanent", kafka.MessageSizeTooLarge, true, ReasonTooLarge},
		{"a wrapped message size too large with the broker's text is permanent",
			fmt.Errorf("%w: the request included a message larger than the max message size", kafka.MessageSizeTooLarge), true, ReasonTooLarge},
		{"a record list too large is permanent", kafka.RecordListTooLarge, true, ReasonTooLarge},
		{"an invalid topic is permanent", kafka.InvalidTopic, true, ReasonInvalidTopic},
		{"an unsupported message format is permanent", kafka.UnsupportedForMessageFormat, true, ReasonRejected},
		{"a policy violation is permanent", kafka.PolicyViolation, true, ReasonRejected},
		{"a topic authorization failure (an ACL rotation) is retried", kafka.TopicAuthorizationFailed, false, ""},
		{"under exactly-once, a topic the relay may not write is permanent for its record", producer.RefusedTopic("orders", kafka.TopicAuthorizationFailed), true, ReasonNotAuthorized},
		{"a cluster authorization failure is retried", kafka.ClusterAuthorizationFailed, false, ""},
		{"a SASL authentication failure (a credential rotation) is retried", kafka.SASLAuthenticationFailed, false, ""},
		{"a wrapped SASL authentication failure is retried", fmt.Errorf("dial: %w", kafka.SASLAuthenticationFailed), false, ""},
		{"broker not available (a restart) is retried", kafka.BrokerNotAvailable, false, ""},
		{"replica not available is retried", kafka.ReplicaNotAvailable, false, ""},
		{"the unknown server error is retried", kafka.Unknown, false, ""},
		{"a corrupt message (a CRC failure on the way) is retried, as Java does", kafka.InvalidMessage, false, ""},
		{"invalid required acks is not about a record and is retried", kafka.InvalidRequiredAcks, false, ""},
		{"an out-of-order sequence is retried", kafka.OutOfOrderSequenceNumber, false, ""},
		{"an invalid record is permanent and counted as rejected", kafka.InvalidRecord, true, ReasonRejected},
		{"an invalid timestamp is permanent and counted as rejected", kafka.InvalidTimestamp, true, ReasonRejected},
		{"the writer's own message too large error is permanent and counted as too large",
			kafka.MessageTooLargeError{}, true, ReasonTooLarge},
		{"leader not available is temporary", kafka.LeaderNotAvailable, false, ""},
		{"not leader for partition is temporary", kafka.NotLeaderForPartition, false, ""},
		{"not enough replicas is temporary", kafka.NotEnoughReplicas, false, ""},
		{"not enough replicas after append is temporary", kafka.NotEnoughReplicasAfterAppend, false, ""},
		{"a request timeout is temporary", kafka.RequestTimedOut, false, ""},
		{"a network exception is temporary", kafka.NetworkException, false, ""},
		{"an unknown topic (being auto-created) is temporary", kafka.UnknownTopicOrPartition, false, ""},
		{"a storage error is temporary", kafka.KafkaStorageError, false, ""},
		{"a wrapped temporary code is temporary", fmt.Errorf("produce: %w", kafka.LeaderNotAvailable), false, ""},
		{"io.EOF is temporary", io.EOF, false, ""},
		{"a deadline is temporary", context.DeadlineExceeded, false, ""},
		{"an unexpected EOF is temporary", io.ErrUnexpectedEOF, false, ""},
		{"net.ErrClosed is temporary", net.ErrClosed, false, ""},
		{"a refused connection is temporary", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, false, ""},
		{"a reset connection is temporary", fmt.Errorf("write: %w", syscall.ECONNRESET), false, ""},
		{"a TLS handshake failure during a restart is temporary", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, false, ""},
		{"an arbitrary error is temporary", errors.New("something odd"), false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := producer.Permanent(tt.err); got != tt.permanent {
				t.Fatalf("producer.Permanent(%v) = %v, want %v", tt.err, got, tt.permanent)
			}
			if tt.reason != "" {
				if got := reason(tt.err); got != tt.reason {
					t.Fatalf("reason(%v) = %q, want %q", tt.err, got, tt.reason)
				}
			}
		})
	}
}

// A certificate problem ends the start (WaitReady) with a line naming the key; while streaming it
// is retried in place like refused credentials, never sent to the failure policy.
func TestTLSProblemsAreExplainedAndNeverPermanent(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string // in the explanation; "" when it is not a TLS problem
	}{
		{"an unknown authority names the CA bundle",
			fmt.Errorf("kafka.(*Client).Metadata: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), "kafka.tls.ca_file"},
		{"a refused client certificate names the certificate keys",
			fmt.Errorf("kafka.(*Client).Metadata: %w", &net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}), "kafka.tls.cert_file"},
		{"a plain connection to a TLS listener names kafka.tls.enabled",
			fmt.Errorf("%w: broker appears to be expecting TLS", io.ErrUnexpectedEOF), "kafka.tls.enabled"},
		{"an unexpected EOF alone is no TLS problem", io.ErrUnexpectedEOF, ""},
		{"a refused connection is no TLS problem", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line, ok := tlsProblem(tt.err)
			if ok != (tt.want != "") || !strings.Contains(line, tt.want) {
				t.Fatalf("tlsProblem(%v) = %q, %v; want one naming %q", tt.err, line, ok, tt.want)
			}
			if producer.Permanent(tt.err) {
				t.Fatalf("%v is permanent: it would go to the failure policy", tt.err)
			}
		})
	}
}
