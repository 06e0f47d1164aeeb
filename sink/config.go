package sink

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/outbox-relay/outbox-relay/sink/producer"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Policy says what happens to an event that cannot be published to its topic.
type Policy string

const (
	// DeadLetter publishes the event to the dead-letter topic, with headers saying where it was
	// going and why it failed, and then counts it as done.
	DeadLetter Policy = "dead-letter"
	// Halt stops publishing and never acknowledges the event, so the slot stops advancing; the
	// process stays up, not ready, until an operator intervenes.
	Halt Policy = "halt"
)

// Config configures a Sink. Zero values get the defaults noted.
type Config struct {
	Brokers         []string
	Record          record.Options // how events become records: topic, key, value, headers
	MaxMessageBytes int            // largest record accepted; default 1048576 (Kafka's max.request.size)
	BatchSize       int            // records per produce request and partition; default 500
	Linger          time.Duration  // how long a partition's oldest record waits for more before its batch goes; default 15ms, negative for none
	WriteTimeout    time.Duration  // one produce request; default 10s
	MaxInFlight     int            // events not yet acknowledged; default 10000
	MaxInFlightSize int64          // bytes not yet acknowledged; default 64 MiB
	Compression     kafka.Compression
	Policy          Policy // default DeadLetter
	DeadLetterTopic string // default "outbox.dead-letter"
	TLS             *tls.Config
	SASL            sasl.Mechanism
	ClientID        string        // default "outbox-relay"
	Idempotence     Idempotence   // default IdempotenceAuto
	Transactions    *Transactions // exactly-once; nil for at-least-once
	// NoAutoCreateTopics stops the sink asking the brokers to create a missing event topic: with
	// auto-creation, every new aggregate type a row invents would create a topic. The dead-letter
	// topic, a fixed name, is still created when missing (where the brokers allow it). The
	// relay's default (config key kafka.auto_create_topics false).
	NoAutoCreateTopics bool
	// Serializer, when set, frames every record's key and value for a schema registry (value and
	// key encodings avro, protobuf, json-schema): Record then builds them raw (the aggregate id,
	// the payload), and the sink serializes them on its goroutine, holding the stream while the
	// registry cannot answer (serialize.go).
	Serializer Serializer
}

func (c *Config) setDefaults() {
	c.Record = c.Record.WithDefaults()
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 1 << 20
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.Linger == 0 {
		c.Linger = 15 * time.Millisecond
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 10000
	}
	if c.MaxInFlightSize <= 0 {
		c.MaxInFlightSize = 64 << 20
	}
	if c.Policy == "" {
		c.Policy = DeadLetter
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = "outbox.dead-letter"
	}
	if c.ClientID == "" {
		c.ClientID = "outbox-relay"
	}
	if c.Idempotence == "" {
		c.Idempotence = IdempotenceAuto
	}
	if c.Transactions != nil {
		t := *c.Transactions // the caller's value stays as it was
		t.setDefaults()
		c.Transactions = &t
	}
}

// Idempotence says whether the producer asks Kafka for a producer id and numbers its batches
// (producer.Idempotence).
type Idempotence = producer.Idempotence

const (
	// IdempotenceAuto is on where the broker allows it: a broker that denies IDEMPOTENT_WRITE
	// gets the plain producer, with a warning.
	IdempotenceAuto = producer.IdempotenceAuto
	// IdempotenceOn refuses to start when the broker denies it.
	IdempotenceOn = producer.IdempotenceOn
	// IdempotenceOff never asks: every retry of a request the broker already wrote is a duplicate.
	IdempotenceOff = producer.IdempotenceOff
)

// Transactions turns on exactly-once delivery: records go to Kafka in transactions that also
// write the Position they reach to a compacted topic, and are acknowledged only once their
// transaction has committed.
type Transactions struct {
	ID string // transactional.id; required
	// Interval is how long a Kafka transaction stays open at most while the broker keeps up;
	// default 100ms. It usually ends sooner, see Linger.
	Interval time.Duration
	// Linger is how old a transaction's first event gets before the committer, once it is free,
	// takes the transaction: under load commits go back to back, each taking what arrived while
	// the one before committed. Default Config.Linger; at most Interval. (Linger = Interval makes
	// every transaction last Interval, for tests that look at an open one.)
	Linger time.Duration
	// MaxEvents closes a transaction once it holds this many events; default 10000, at most
	// half of Config.MaxInFlight (one transaction fills while the one before commits).
	MaxEvents      int
	PositionsTopic string        // default "__outbox_relay_positions", created compacted if missing
	Timeout        time.Duration // transaction.timeout.ms asked for in InitProducerID; default 60s
}

// DefaultPositionsTopic is where positions go unless Transactions.PositionsTopic says otherwise.
const DefaultPositionsTopic = "__outbox_relay_positions"

func (t *Transactions) setDefaults() {
	if t.Interval <= 0 {
		t.Interval = 100 * time.Millisecond
	}
	if t.MaxEvents <= 0 {
		t.MaxEvents = 10000
	}
	if t.PositionsTopic == "" {
		t.PositionsTopic = DefaultPositionsTopic
	}
	if t.Timeout <= 0 {
		t.Timeout = time.Minute
	}
}

// validate checks what the defaults leave to the caller: the failure policy, the idempotence
// mode, and the topics the relay writes itself (the dead-letter and positions topics), which no
// event may share.
func (c *Config) validate() error {
	if c.Policy != DeadLetter && c.Policy != Halt {
		return fmt.Errorf("sink: unknown failure policy %q (want %q or %q)", c.Policy, DeadLetter, Halt)
	}
	switch c.Idempotence {
	case IdempotenceAuto, IdempotenceOn, IdempotenceOff:
	default:
		return fmt.Errorf("sink: unknown idempotence %q (want %q, %q or %q; config key kafka.idempotence)",
			c.Idempotence, IdempotenceAuto, IdempotenceOn, IdempotenceOff)
	}
	if t := c.Transactions; t != nil {
		if t.ID == "" {
			return errors.New("sink: exactly-once delivery needs a transactional id")
		}
		if c.Idempotence == IdempotenceOff {
			return errors.New("sink: exactly-once delivery needs the idempotent producer; kafka.idempotence is off")
		}
		if err := record.ValidTopic(t.PositionsTopic); err != nil {
			return fmt.Errorf("sink: positions topic: %w", err)
		}
	}
	if err := record.ValidTopic(c.DeadLetterTopic); err != nil {
		return fmt.Errorf("sink: dead-letter topic: %w", err)
	}
	if t := c.Transactions; t != nil {
		// The positions partition and an event's (or a dead letter's) partition of one topic would
		// be numbered twice from sequence 0 by the same producer id and epoch: the broker takes
		// the second writer's first batch for a duplicate of the first's and writes nothing.
		// A template with placeholders (or a regex) is checked per event, in submit.
		if t.PositionsTopic == c.DeadLetterTopic {
			return fmt.Errorf("sink: the positions topic and the dead-letter topic are both %s: the positions topic must hold positions only (config keys positions_topic and dead_letter_topic)", t.PositionsTopic)
		}
		if rc := c.Record; rc.TopicRegex == "" && t.PositionsTopic == rc.TopicTemplate {
			return fmt.Errorf("sink: the positions topic and the topic template are both %s: every event would go to the positions topic, which must hold positions only (config keys positions_topic and topic_template)", t.PositionsTopic)
		}
		if rc := c.Record; rc.TopicRegex != "" && t.PositionsTopic == rc.TopicReplacement {
			return fmt.Errorf("sink: the positions topic and the topic replacement are both %s: every event the topic regex matches would go to the positions topic, which must hold positions only (config keys positions_topic and topic_replacement)", t.PositionsTopic)
		}
	}
	return nil
}
