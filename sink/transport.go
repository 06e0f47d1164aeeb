package sink

import (
	"context"
	"errors"
	"net"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// retryTransport makes every failure below the Kafka protocol retriable.
//
// kafka-go's Writer retries a batch in place only for errors it recognises as temporary; anything
// else (io.EOF from a broker that closed the connection, net.ErrClosed, a TLS error during a restart)
// completes the batch with an error while later batches of the same partition go ahead. That would
// break per-aggregate order, so every transport error is reported as temporary and only errors the
// broker itself returns (kafka.Error codes) can end a batch.
type retryTransport struct {
	kafka.RoundTripper
}

func (t retryTransport) RoundTrip(ctx context.Context, addr net.Addr, req protocol.Message) (protocol.Message, error) {
	res, err := t.RoundTripper.RoundTrip(ctx, addr, req)
	if err != nil {
		var kerr kafka.Error
		if !errors.As(err, &kerr) {
			err = transientError{err}
		}
	}
	return res, err
}

// transientError marks an error as worth retrying.
type transientError struct{ err error }

func (e transientError) Error() string   { return e.err.Error() }
func (e transientError) Unwrap() error   { return e.err }
func (e transientError) Temporary() bool { return true }

// permanent reports whether err is the broker's final word about a message: a Kafka error code that
// is not temporary (message too large, invalid topic, not authorized...). Everything else is retried.
func permanent(err error) bool {
	var kerr kafka.Error
	return errors.As(err, &kerr) && !kerr.Temporary()
}

// reason names a permanent error for the failed-events metric.
func reason(err error) string {
	var kerr kafka.Error
	var tooLarge kafka.MessageTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return ReasonTooLarge
	case errors.As(err, &kerr):
		switch kerr {
		case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge:
			return ReasonTooLarge
		case kafka.InvalidTopic:
			return ReasonInvalidTopic
		case kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed:
			return ReasonNotAuthorized
		}
		return ReasonRejected
	}
	return ReasonRejected
}
