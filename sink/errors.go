package sink

import (
	"errors"
	"io"
	"strings"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/credentials"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// tlsProblem explains a TLS failure that retrying cannot fix: a broker certificate the relay does
// not trust, a client certificate the broker refused (credentials.ExplainTLS), or TLS off towards a
// TLS listener, which kafka-go recognises by the broker's reply. Before streaming it ends the start;
// afterwards it is retried in place, loudly, like refused credentials: renewed certificates heal it.
func tlsProblem(err error) (string, bool) {
	if line, ok := credentials.ExplainTLS(err, credentials.KafkaTLSKeys); ok {
		return line, true
	}
	if errors.Is(err, io.ErrUnexpectedEOF) && strings.Contains(err.Error(), "expecting TLS") {
		return "the broker expects TLS at that address (" + err.Error() + "): set kafka.tls.enabled to true", true
	}
	return "", false
}

// reason names a permanent error for the failed-events metric.
func reason(err error) string {
	var kerr kafka.Error
	var tooLarge kafka.MessageTooLargeError
	switch {
	case errors.Is(err, producer.ErrTopicRefused):
		return ReasonNotAuthorized
	case errors.Is(err, producer.ErrNoSuchPartition):
		return ReasonInvalidPartition
	case errors.As(err, &tooLarge):
		return ReasonTooLarge
	case errors.As(err, &kerr):
		switch kerr {
		case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge:
			return ReasonTooLarge
		case kafka.InvalidTopic:
			return ReasonInvalidTopic
		}
		return ReasonRejected
	}
	return ReasonRejected
}
