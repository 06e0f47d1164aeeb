package producer

import (
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// permanentErrors is the allow-list of broker error codes that are the broker's final word about
// the records of a produce request (or, for the partition-count lookup, about a topic name): these
// end a record's journey (Config.Done), after a refused batch is split so only the record refused
// on its own does. Everything else is retried in place, indefinitely, however kafka-go marks it: a
// record given up by mistake (for the relay: sent to the dead-letter topic) is a gap in its key's
// stream, while a wrongly retried one only waits, loudly (Config.Retrying), until an operator looks.
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

// ErrTopicRefused marks a topic a transactional producer may not write (RefusedTopic): there
// the refusal is permanent for the record. Retried in place as under at-least-once, its record
// would hold every Kafka transaction from committing (a transaction commits a prefix of the stream
// and cannot leave the record out), so read_committed consumers of every topic would wait, and a
// fence would go unnoticed (the broker checks ACLs before the producer's epoch).
var ErrTopicRefused = errors.New("under exactly-once its events go to the failure policy, or every Kafka transaction would wait for them")

// ErrNoSuchPartition is the producer's refusal of a partition the topic does not have.
var ErrNoSuchPartition = errors.New("no such partition")

// RefusedTopic is the error of a record whose topic a transactional producer may not write.
func RefusedTopic(topic string, err error) error {
	return fmt.Errorf("kafka refused the relay's principal on topic %s (%w): %w; grant the principal Write and Describe on the topic", topic, err, ErrTopicRefused)
}

// Permanent reports whether err is on the allow-list above, kafka-go's own refusal of a record
// over its size limit, or a topic refused under exactly-once. Everything else, every network and
// protocol failure below the Kafka error codes included, is transient.
func Permanent(err error) bool {
	if errors.Is(err, ErrTopicRefused) {
		return true
	}
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		return permanentErrors[kerr]
	}
	var tooLarge kafka.MessageTooLargeError
	return errors.As(err, &tooLarge)
}

// SequenceLost reports the errors that say the broker has no usable sequence state for the
// producer on the partition; the batch was not written.
func SequenceLost(err error) bool {
	return errors.Is(err, kafka.OutOfOrderSequenceNumber) || errors.Is(err, kafka.UnknownProducerId)
}

// ProducerRefused reports the errors that say the producer's epoch is not (or no longer) the
// current one: for a transactional producer, someone took over its transactional id.
func ProducerRefused(err error) bool {
	return errors.Is(err, kafka.InvalidProducerEpoch) || errors.Is(err, kafka.ProducerFenced)
}

// TransactionFailed reports the errors after which a Kafka transaction cannot commit.
func TransactionFailed(err error) bool {
	return errors.Is(err, kafka.InvalidTransactionState) || errors.Is(err, ErrTransactionAbortable) ||
		errors.Is(err, kafka.InvalidProducerIDMapping) || errors.Is(err, kafka.TransactionalIDAuthorizationFailed)
}

// AuthFailed reports whether err says the relay's credentials or permissions were refused:
// retried, but logged at ERROR, since only an operator (or a finishing rotation) fixes it.
func AuthFailed(err error) bool {
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

// Backoff grows from 200ms to 2s.
// A retry against a broker that is down costs one failed dial, so the ceiling is low: the relay
// notices a broker coming back within seconds.
func Backoff(attempt int) time.Duration {
	d := 200 * time.Millisecond << min(attempt, 6)
	return min(d, 2*time.Second)
}

// RecordSize is the size Kafka counts against max.message.bytes for a record on its own, with the
// record and batch framing overhead rounded up.
func RecordSize(m *kafka.Message) int {
	n := len(m.Key) + len(m.Value) + 100 // 61-byte batch header, record header, varints
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}
