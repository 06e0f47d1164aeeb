package sink

import (
	"errors"

	"github.com/segmentio/kafka-go"
)

// permanent reports whether err is the broker's final word about a message: a Kafka error code that
// is not temporary (message too large, invalid topic, not authorized...). Everything else, including
// every network and protocol failure below the Kafka error codes, is retried in place.
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
