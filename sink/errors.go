package sink

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/credentials"
)

// permanentErrors is the allow-list of broker error codes that are the broker's final word about
// the records of a produce request (or, for the partition-count lookup, about a topic name): these
// go to the failure policy, after a refused batch is split so only the record refused on its own
// does. Everything else is retried in place, indefinitely, however kafka-go marks it: a record sent
// to the dead-letter topic by mistake is a gap in its aggregate's stream, while a wrongly retried
// one only waits, loudly (retries, logs, /readyz), until an operator looks.
//
// The list follows the Java producer (org.apache.kafka.common.protocol.Errors: an error that is
// not a RetriableException fails the batch there) minus what is not about the record:
//   - MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE: the record (or, before the split, the request)
//     exceeds the broker's or the topic's size limit. Java: RecordTooLargeException,
//     RecordBatchTooLargeException, not retriable; Java splits a batch too.
//   - INVALID_RECORD: the broker's per-record validation refused it (a null key on a compacted
//     topic, ...). Java: InvalidRecordException, not retriable.
//   - INVALID_TIMESTAMP: outside the topic's message.timestamp.*.ms window. Java: not retriable.
//   - INVALID_TOPIC_EXCEPTION: the topic name is not valid. Java: not retriable.
//   - UNSUPPORTED_FOR_MESSAGE_FORMAT: the topic's message format cannot hold the record (headers
//     on a pre-0.11 format). Java: not retriable. It cannot happen with Kafka 3 and later.
//   - POLICY_VIOLATION: the cluster's create-topic policy refuses the auto-created topic.
//     Java: not retriable.
//
// Deliberately retried, although Java gives up on them:
//   - UNKNOWN_SERVER_ERROR (-1), BROKER_NOT_AVAILABLE, REPLICA_NOT_AVAILABLE: connection or broker
//     state, seen during restarts; nothing about the record.
//   - TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED, SASL_AUTHENTICATION_FAILED and the
//     other authentication errors: none is record-level. They are about the relay's principal and
//     heal when a credential or ACL rotation completes; dead-lettering would cut a gap into every
//     aggregate of the topic (and the dead-letter topic usually refuses the same principal). They
//     are logged at ERROR on every retry (sampled) and a topic the relay may not write is reported
//     like a missing one (topics.go).
//   - INVALID_REQUIRED_ACKS: the relay always sends acks=all; if a broker refused that, it would
//     refuse every record, which is a broker problem, not a record's.
//   - CORRUPT_MESSAGE: Java retries it (CorruptRecordException is retriable): a CRC failure is
//     the network's, and the record is encoded again on the next attempt.
var permanentErrors = map[kafka.Error]bool{
	kafka.MessageSizeTooLarge:         true,
	kafka.RecordListTooLarge:          true,
	kafka.InvalidRecord:               true,
	kafka.InvalidTimestamp:            true,
	kafka.InvalidTopic:                true,
	kafka.UnsupportedForMessageFormat: true,
	kafka.PolicyViolation:             true,
}

// errTopicRefused marks a topic the relay may not write under exactly-once (refusedTopic): there
// the refusal is permanent for the record. Retried in place as under at-least-once, its record
// would hold every Kafka transaction from committing (a transaction commits a prefix of the stream
// and cannot leave the record out), so read_committed consumers of every topic would wait, and a
// fence would go unnoticed (the broker checks ACLs before the producer's epoch).
var errTopicRefused = errors.New("under exactly-once its events go to the failure policy, or every Kafka transaction would wait for them")

// errPositionsRefused marks a positions topic the relay may not write: no Kafka transaction can
// commit without its position, so unlike an event's topic it ends the relay with the fix (a fresh
// start would abort the same transaction again, for ever).
var errPositionsRefused = errors.New("kafka refused the relay's principal on the positions topic, so no Kafka transaction can commit")

// errNoSuchPartition is the producer's refusal of a partition the topic does not have.
var errNoSuchPartition = errors.New("no such partition")

// refusedTopic is the error of a record whose topic the relay may not write, under exactly-once.
func refusedTopic(topic string, err error) error {
	return fmt.Errorf("kafka refused the relay's principal on topic %s (%w): %w; grant the principal Write and Describe on the topic", topic, err, errTopicRefused)
}

// permanent reports whether err is on the allow-list above, kafka-go's own refusal of a record
// over its size limit, or a topic refused under exactly-once. Everything else, every network and
// protocol failure below the Kafka error codes included, is transient.
func permanent(err error) bool {
	if errors.Is(err, errTopicRefused) {
		return true
	}
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		return permanentErrors[kerr]
	}
	var tooLarge kafka.MessageTooLargeError
	return errors.As(err, &tooLarge)
}

// authError reports whether err says the relay's credentials or permissions were refused: retried,
// but logged at ERROR, since only an operator (or a finishing rotation) fixes it.
func authError(err error) bool {
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return false
	}
	switch kerr {
	case kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed, kafka.SASLAuthenticationFailed,
		kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState, kafka.TransactionalIDAuthorizationFailed:
		return true
	}
	return false
}

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
	case errors.Is(err, errTopicRefused):
		return ReasonNotAuthorized
	case errors.Is(err, errNoSuchPartition):
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
