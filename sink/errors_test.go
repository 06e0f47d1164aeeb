package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
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
		{"a topic authorization failure is permanent", kafka.TopicAuthorizationFailed, true, ReasonNotAuthorized},
		{"a cluster authorization failure is permanent", kafka.ClusterAuthorizationFailed, true, ReasonNotAuthorized},
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
		{"a transport error marked transient is temporary", transientError{io.ErrUnexpectedEOF}, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := permanent(tt.err); got != tt.permanent {
				t.Fatalf("permanent(%v) = %v, want %v", tt.err, got, tt.permanent)
			}
			if tt.reason != "" {
				if got := reason(tt.err); got != tt.reason {
					t.Fatalf("reason(%v) = %q, want %q", tt.err, got, tt.reason)
				}
			}
		})
	}
}

// fakeRoundTripper answers every request with err.
type fakeRoundTripper struct{ err error }

func (f fakeRoundTripper) RoundTrip(context.Context, net.Addr, protocol.Message) (protocol.Message, error) {
	return nil, f.err
}

// writerRetries is kafka-go's rule for retrying a batch in place (isTemporary or
// isTransientNetworkError in kafka-go's error.go).
func writerRetries(err error) bool {
	var temp interface{ Temporary() bool }
	if errors.As(err, &temp) {
		return temp.Temporary()
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func TestRetryTransport(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	tests := []struct {
		name      string
		err       error
		retried   bool // kafka-go's writer retries the batch in place
		permanent bool
	}{
		{"io.EOF from a closed connection is retried", io.EOF, true, false},
		{"a wrapped io.EOF is retried", fmt.Errorf("read response: %w", io.EOF), true, false},
		{"net.ErrClosed is retried", net.ErrClosed, true, false},
		{"a refused connection is retried", refused, true, false},
		{"a reset connection is retried", fmt.Errorf("write: %w", syscall.ECONNRESET), true, false},
		{"a broken pipe is retried", syscall.EPIPE, true, false},
		{"a TLS handshake failure during a restart is retried", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, true, false},
		{"a context deadline is retried", context.DeadlineExceeded, true, false},
		{"an arbitrary error is retried", errors.New("something odd"), true, false},
		{"a temporary Kafka error passes through and is retried", kafka.LeaderNotAvailable, true, false},
		{"a permanent Kafka error passes through and is not retried", kafka.MessageSizeTooLarge, false, true},
		{"a wrapped permanent Kafka error passes through and is not retried",
			fmt.Errorf("%w: too big", kafka.TopicAuthorizationFailed), false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := retryTransport{fakeRoundTripper{tt.err}}.RoundTrip(context.Background(), nil, nil)
			if err == nil {
				t.Fatal("the error was swallowed")
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("error %v does not wrap %v", err, tt.err)
			}
			if err.Error() != tt.err.Error() {
				t.Fatalf("error text changed: %q, want %q", err, tt.err)
			}
			if got := writerRetries(err); got != tt.retried {
				t.Fatalf("kafka-go retries %v: %v, want %v", err, got, tt.retried)
			}
			if got := permanent(err); got != tt.permanent {
				t.Fatalf("permanent(%v) = %v, want %v", err, got, tt.permanent)
			}
		})
	}
	t.Run("a success passes through", func(t *testing.T) {
		res, err := retryTransport{fakeRoundTripper{nil}}.RoundTrip(context.Background(), nil, nil)
		if res != nil || err != nil {
			t.Fatalf("RoundTrip = %v, %v", res, err)
		}
	})
}

func TestBackoff(t *testing.T) {
	prev := backoff(0)
	if prev != 200e6 {
		t.Fatalf("backoff(0) = %v, want 200ms", prev)
	}
	for attempt := 1; attempt < 100; attempt++ {
		d := backoff(attempt)
		if d < prev || d > 10e9 {
			t.Fatalf("backoff(%d) = %v after %v: want non-decreasing and at most 10s", attempt, d, prev)
		}
		prev = d
	}
	if prev != 10e9 {
		t.Fatalf("backoff tops out at %v, want 10s", prev)
	}
}
