// Package config loads the relay's settings: defaults, then a YAML file, then OUTBOX_* environment
// variables, then command-line flags, the later winning. Every value is checked at load time and an
// error names the key and where the bad value came from.
package config

import (
	"time"

	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Config is every setting of `outbox-relay run`.
type Config struct {
	PGDSN             string
	PGPasswordFile    string // read for every connection; pg_dsn then holds no password
	KafkaBrokers      []string
	Slot              string
	Publication       string
	Schema            string
	Table             string
	CreateSlot        bool
	CreatePublication bool
	Failover          bool
	Columns           Columns
	ExtraHeaders      []string // "column" or "column:header"
	BuiltinHeaders    []string
	ValueEncoding     string
	KeyEncoding       string
	SchemaRegistry    SchemaRegistry // value_encoding avro, protobuf or json-schema, key_encoding avro (registry.go)
	Profile           string
	TopicTemplate     string
	OnFailure         string
	DeadLetterTopic   string
	StatusInterval    time.Duration
	SlotBusyWait      time.Duration
	ShutdownTimeout   time.Duration
	MaxInFlight       int
	MaxInFlightBytes  int64
	MaxMessageBytes   int
	HeartbeatInterval time.Duration
	Backfill          bool
	BackfillSince     string // RFC 3339 time, or a duration before the start
	BackfillWhere     string
	BackfillOrder     string // column; the backfill's publishing order
	MetricsAddr       string
	LogLevel          string
	LogFormat         string
	Kafka             Kafka

	// Delivery is at-least-once or exactly-once (Kafka transactions; see docs/guarantees.md).
	Delivery             string
	TransactionalID      string // "" derives outbox-relay-<system identifier>-<slot> at start
	TransactionInterval  time.Duration
	TransactionMaxEvents int
	PositionsTopic       string
	// The table-free outbox. OutboxShape says where events come from: "table" (rows inserted
	// into Table), "messages" (transactional logical decoding messages with MessagesPrefix, no
	// table) or "both".
	OutboxShape     string
	MessagesPrefix  string
	PayloadEncoding string // messages' payload member: "json" or "base64"

	// Debezium's outbox event router options.
	ExtraFields           []string // column:placement[:alias], placement header, envelope or partition
	TopicRegex            string
	TopicReplacement      string
	TopicRegexPassthrough bool
	// The topics outbox rows may reach: TopicAllow (empty: derived from the routing, see
	// record.DefaultTopicAllow) minus TopicDeny.
	TopicAllow              []string
	TopicDeny               []string
	TombstoneOnEmptyPayload bool
	OnUpdate                string // warn, error or fatal
	OnSlotLost              string // stop or recover
	SlotRecoveryMargin      time.Duration

	// Retention (package prune): delete outbox rows older than PruneOlderThan every PruneInterval.
	PruneInterval  time.Duration
	PruneOlderThan time.Duration
	PruneBatchSize int

	// Source is where events come from: "wal" (the replication slot) or "poll" (the table; package
	// poll). The Poll* settings apply to poll only.
	Source           string
	PollBatchSize    int
	PollInterval     time.Duration
	PollMaxAttempts  int
	PollRetryBackoff time.Duration
	PollWorkers      int

	// Single leader and the slot monitor.
	LeaderElection      bool
	LeaderRetryInterval time.Duration
	LeaderCheckTimeout  time.Duration
	// LeaderDSN, when set, is the connection of the leader lock's session alone (e.g. through a
	// session-mode pooler); empty uses PGDSN.
	LeaderDSN string
	// LeaderKafkaTimeout is how long a leader goes without any Kafka acknowledgement while events
	// wait before it hands the lock over; 0 never does.
	LeaderKafkaTimeout time.Duration
	SlotPollInterval   time.Duration

	// FailoverStandbyDSN is a standby the slot monitor asks about its copy of the failover slot.
	FailoverStandbyDSN string

	// CloudEvents is the envelope: envelope and cloudevents.* (cloudevents.go).
	CloudEvents CloudEvents

	// Warnings are what Load found exposed without being wrong (a secret on the command line, a
	// server not verified): the commands log them at start.
	Warnings []string
}

// Columns names the outbox table's columns.
type Columns struct {
	ID, AggregateType, AggregateID, EventType, Payload, Headers, CreatedAt string
	AggregateVersion                                                       string // optional
	// Optional: the record timestamp, and Debezium's tracing span context.
	Timestamp, TracingSpanContext string
}

// Kafka holds producer and connection settings.
type Kafka struct {
	BatchSize    int
	Linger       time.Duration
	WriteTimeout time.Duration
	Compression  string
	Idempotence  string // auto, on or off
	// AutoCreateTopics asks the brokers to create a missing event topic.
	AutoCreateTopics bool
	ClientID         string
	TLS              TLS
	SASL             SASL
}

// TLS configures encryption to the brokers.
type TLS struct {
	Enabled            bool
	CAFile             string
	CertFile           string
	KeyFile            string
	InsecureSkipVerify bool
}

// SASL configures authentication to the brokers.
type SASL struct {
	Mechanism    string // "", PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER
	Username     string
	Password     string
	PasswordFile string // read for every connection; instead of Password
	OAuthBearer  OAuthBearer
}

// OAuthBearer configures SASL OAUTHBEARER: a token from a file, or from an OAuth token endpoint
// with the client-credentials grant.
type OAuthBearer struct {
	TokenFile        string // read for every connection
	TokenEndpointURL string
	ClientID         string
	ClientSecretFile string // read for every fetch of a token
	Scope            string
}

// Values of outbox_shape.
const (
	SourceTable    = "table"
	SourceMessages = "messages"
	SourceBoth     = "both"
)

// HeartbeatPrefix is the prefix of the relay's own heartbeat messages, which messages_prefix must
// not take.
const HeartbeatPrefix = "outbox-relay-heartbeat"

// UsesTable reports whether rows of the outbox table are events.
func (c *Config) UsesTable() bool { return c.OutboxShape != SourceMessages }

// UsesMessages reports whether logical decoding messages are events.
func (c *Config) UsesMessages() bool {
	return c.OutboxShape == SourceMessages || c.OutboxShape == SourceBoth
}

// Delivery modes (config key delivery).
const (
	DeliveryAtLeastOnce = "at-least-once"
	DeliveryExactlyOnce = "exactly-once"
)

// recordRouting is the routing part of the record options, for the topics it implies.
func (c *Config) recordRouting() record.Options {
	return record.Options{TopicTemplate: c.TopicTemplate, TopicRegex: c.TopicRegex, TopicReplacement: c.TopicReplacement}
}

// ExactlyOnce reports whether delivery is exactly-once.
func (c *Config) ExactlyOnce() bool { return c.Delivery == DeliveryExactlyOnce }

// BackfillFrom resolves backfill_since against now; zero means all rows.
func (c *Config) BackfillFrom(now time.Time) time.Time {
	if c.BackfillSince == "" {
		return time.Time{}
	}
	if t, err := time.Parse(time.RFC3339, c.BackfillSince); err == nil {
		return t
	}
	d, _ := time.ParseDuration(c.BackfillSince)
	return now.Add(-d)
}
