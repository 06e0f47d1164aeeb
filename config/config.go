// Package config loads the relay's settings: defaults, then a YAML file, then OUTBOX_* environment
// variables, then command-line flags, the later winning. Every value is checked at load time and an
// error names the key and where the bad value came from.
package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v3"

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
	Mechanism    string // "", PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
	Username     string
	Password     string
	PasswordFile string // read for every connection; instead of Password
}

// setting is one configuration key: its default, its help, and how to apply a value.
type setting struct {
	key    string
	group  Group
	kind   kind // what help calls its value
	def    string
	help   string
	secret bool
	apply  func(c *Config, v string) error
}

func str(p func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *p(c) = v; return nil }
}

func boolean(p func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", v)
		}
		*p(c) = b
		return nil
	}
}

func duration(p func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("want a non-negative duration such as 10s or 500ms, got %q", v)
		}
		*p(c) = d
		return nil
	}
}

// minDuration is duration with a lower bound, for intervals that would busy-loop at zero.
func minDuration(least time.Duration, p func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < least {
			return fmt.Errorf("want a duration of at least %s such as 2s, got %q", least, v)
		}
		*p(c) = d
		return nil
	}
}

func integer(p func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive integer, got %q", v)
		}
		*p(c) = n
		return nil
	}
}

// integerOrAuto takes a positive integer, or auto (stored as 0), which validate resolves.
func integerOrAuto(p func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		if strings.EqualFold(strings.TrimSpace(v), "auto") {
			*p(c) = 0
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive integer or auto, got %q", v)
		}
		*p(c) = n
		return nil
	}
}

func size(p func(*Config) *int64) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := parseSize(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive size such as 67108864, 64MiB or 1MB, got %q", v)
		}
		*p(c) = n
		return nil
	}
}

func list(p func(*Config) *[]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		var out []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		*p(c) = out
		return nil
	}
}

func oneOf(p func(*Config) *string, allowed ...string) func(*Config, string) error {
	return func(c *Config, v string) error {
		for _, a := range allowed {
			if strings.EqualFold(v, a) {
				*p(c) = a
				return nil
			}
		}
		return fmt.Errorf("want one of %s, got %q", strings.Join(allowed, ", "), v)
	}
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

// settings is the whole configuration surface; README's table follows it.
var settings = append([]setting{
	{key: "profile", group: GroupOutbox, kind: kind("debezium"), help: "preset defaults: debezium (Debezium outbox router column names, id header only); empty for none",
		apply: func(c *Config, v string) error {
			if v == "" {
				c.Profile = ""
				return nil
			}
			return oneOf(func(c *Config) *string { return &c.Profile }, "debezium")(c, v)
		}},
	{key: "pg_dsn", group: GroupPostgres, kind: kindString, help: "PostgreSQL connection string (URL or key=value); the role needs REPLICATION (source wal) or SELECT and UPDATE on the table (source poll)", secret: true,
		apply: str(func(c *Config) *string { return &c.PGDSN })},
	{key: "pg_password_file", group: GroupPostgres, kind: kindString, help: "file holding the PostgreSQL password (a mounted Secret), read for every connection, so a rotated password is used at the next reconnect; pg_dsn then holds none",
		apply: str(func(c *Config) *string { return &c.PGPasswordFile })},
	{key: "kafka_brokers", group: GroupKafka, kind: kindList, help: "Kafka bootstrap brokers, comma-separated host:port",
		apply: list(func(c *Config) *[]string { return &c.KafkaBrokers })},
	{key: "slot", group: GroupPostgres, kind: kindString, def: "outbox_relay", help: "logical replication slot name",
		apply: str(func(c *Config) *string { return &c.Slot })},
	{key: "publication", group: GroupPostgres, kind: kindString, def: "outbox_relay", help: "publication name",
		apply: str(func(c *Config) *string { return &c.Publication })},
	{key: "table", group: GroupOutbox, kind: kind("[schema.]table"), def: "public.outbox_events", help: "outbox table, optionally schema-qualified",
		apply: func(c *Config, v string) error {
			schema, table, ok := strings.Cut(v, ".")
			if !ok {
				schema, table = "public", v
			}
			if schema == "" || table == "" || strings.Contains(table, ".") {
				return fmt.Errorf("want table or schema.table, got %q", v)
			}
			c.Schema, c.Table = schema, table
			return nil
		}},
	{key: "create_slot", group: GroupPostgres, kind: kindBool, def: "true", help: "create the slot when it does not exist",
		apply: boolean(func(c *Config) *bool { return &c.CreateSlot })},
	{key: "create_publication", group: GroupPostgres, kind: kindBool, def: "true", help: "create the publication when it does not exist",
		apply: boolean(func(c *Config) *bool { return &c.CreatePublication })},
	{key: "failover", group: GroupPostgres, kind: kindBool, def: "false", help: "make the slot a failover slot (PostgreSQL 17+), which standbys with sync_replication_slots keep, so that it survives a promotion: created with FAILOVER, an existing slot altered; an error on older servers",
		apply: boolean(func(c *Config) *bool { return &c.Failover })},
	{key: "failover_standby_dsn", group: GroupPostgres, kind: kindString, help: "a standby that may be promoted (PostgreSQL 17+, connection string like pg_dsn; pg_password_file and TLS settings apply): every slot_poll_interval the relay reads its copy of the failover slot for the standby_slot_* metrics (persisted, trail behind the primary's slot); unset: not watched", secret: true,
		apply: str(func(c *Config) *string { return &c.FailoverStandbyDSN })},
	{key: "columns.id", group: GroupOutbox, kind: kindString, def: "id", help: "event id column (sent as the id header)",
		apply: str(func(c *Config) *string { return &c.Columns.ID })},
	{key: "columns.aggregate_type", group: GroupOutbox, kind: kindString, def: "aggregate_type", help: "aggregate type column (routes to the topic)",
		apply: str(func(c *Config) *string { return &c.Columns.AggregateType })},
	{key: "columns.aggregate_id", group: GroupOutbox, kind: kindString, def: "aggregate_id", help: "aggregate id column (the record key)",
		apply: str(func(c *Config) *string { return &c.Columns.AggregateID })},
	{key: "columns.event_type", group: GroupOutbox, kind: kindString, def: "event_type", help: "event type column",
		apply: str(func(c *Config) *string { return &c.Columns.EventType })},
	{key: "columns.payload", group: GroupOutbox, kind: kindString, def: "payload", help: "payload column (the record value, bytes as stored)",
		apply: str(func(c *Config) *string { return &c.Columns.Payload })},
	{key: "columns.headers", group: GroupOutbox, kind: kindString, def: "headers", help: "JSON object column whose members become headers; empty for none",
		apply: str(func(c *Config) *string { return &c.Columns.Headers })},
	{key: "columns.aggregate_version", group: GroupOutbox, kind: kindString, help: "bigint column with the aggregate's version, sent as the aggregate_version header (consumers detect missed and stale events); empty for none",
		apply: str(func(c *Config) *string { return &c.Columns.AggregateVersion })},
	{key: "columns.created_at", group: GroupOutbox, kind: kindString, def: "created_at", help: "creation time column, for backfill_since and pruning",
		apply: str(func(c *Config) *string { return &c.Columns.CreatedAt })},
	{key: "columns.timestamp", group: GroupOutbox, kind: kindString, help: "timestamp or timestamptz column whose value is the record timestamp (else the commit time); empty for none",
		apply: str(func(c *Config) *string { return &c.Columns.Timestamp })},
	{key: "columns.tracing_span_context", group: GroupOutbox, kind: kindString, help: "column holding Debezium's tracing span context (Java Properties text with traceparent and tracestate), sent as W3C traceparent/tracestate headers; empty for none",
		apply: str(func(c *Config) *string { return &c.Columns.TracingSpanContext })},
	{key: "extra_headers", group: GroupRouting, kind: kindList, help: "further columns sent as headers, comma-separated column[:header]",
		apply: list(func(c *Config) *[]string { return &c.ExtraHeaders })},
	{key: "extra_fields", group: GroupRouting, kind: kindList, help: "further columns placed as Debezium's table.fields.additional.placement does, comma-separated column:placement[:alias] with placement header, envelope or partition",
		apply: func(c *Config, v string) error {
			if err := list(func(c *Config) *[]string { return &c.ExtraFields })(c, v); err != nil {
				return err
			}
			partitions := 0
			for _, f := range c.ExtraFields {
				parts := strings.Split(f, ":")
				if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || (len(parts) == 3 && parts[2] == "") {
					return fmt.Errorf("want column:placement or column:placement:alias, got %q", f)
				}
				switch parts[1] {
				case "header", "envelope":
				case "partition":
					partitions++
				default:
					return fmt.Errorf("placement %q of %q: want header, envelope or partition", parts[1], f)
				}
			}
			if partitions > 1 {
				return errors.New("at most one column may be placed as the partition")
			}
			return nil
		}},
	{key: "builtin_headers", group: GroupRouting, kind: kindList, def: "id,event_type,aggregate_type", help: "which of the headers id, event_type and aggregate_type every record carries",
		apply: func(c *Config, v string) error {
			if err := list(func(c *Config) *[]string { return &c.BuiltinHeaders })(c, v); err != nil {
				return err
			}
			for _, h := range c.BuiltinHeaders {
				if h != "id" && h != "event_type" && h != "aggregate_type" {
					return fmt.Errorf("want some of id, event_type, aggregate_type, got %q", h)
				}
			}
			if c.BuiltinHeaders == nil {
				c.BuiltinHeaders = []string{}
			}
			return nil
		}},
	{key: "value_encoding", group: GroupRouting, kind: choices("raw", "json-string", "json-expanded", "json-with-schema", "avro", "protobuf", "json-schema"), def: "raw", help: "record value: raw (payload bytes as stored), json-string (a JSON string, like Debezium's JsonConverter), json-expanded (the payload as Debezium's table.expand.json.payload writes it), json-with-schema (that in JsonConverter's {\"schema\",\"payload\"} envelope, schemas.enable=true), avro (Avro in the Confluent wire format through schema_registry, like Debezium's AvroConverter), protobuf (Protobuf, with its message-index list, likewise; like Confluent's ProtobufConverter) or json-schema (the JSON document checked against a JSON Schema, likewise; like Confluent's JsonSchemaConverter)",
		apply: oneOf(func(c *Config) *string { return &c.ValueEncoding }, "raw", "json-string", "json-expanded", "json-with-schema", "avro", "protobuf", "json-schema")},
	{key: "key_encoding", group: GroupRouting, kind: choices("raw", "json-string", "json-with-schema", "avro"), def: "raw", help: "record key: raw (aggregate id as stored), json-string (a JSON string, like Connect's JsonConverter with schemas disabled), json-with-schema (JsonConverter's envelope with schemas enabled) or avro (an Avro string through schema_registry, like Connect's AvroConverter)",
		apply: oneOf(func(c *Config) *string { return &c.KeyEncoding }, "raw", "json-string", "json-with-schema", "avro")},
	{key: "topic_template", group: GroupRouting, kind: kindString, def: "outbox.event.{aggregate_type}", help: "topic name; {aggregate_type} and {event_type} are replaced",
		apply: str(func(c *Config) *string { return &c.TopicTemplate })},
	{key: "topic_regex", group: GroupRouting, kind: kindString, help: "route by regular expression (Debezium's route.topic.regex, Go syntax) matched against the whole aggregate type: the topic is topic_replacement with its groups; an aggregate type it does not match is refused (reason topic_not_allowed) unless topic_regex_passthrough; replaces topic_template",
		apply: str(func(c *Config) *string { return &c.TopicRegex })},
	{key: "topic_replacement", group: GroupRouting, kind: kindString, def: "outbox.event.${routedByValue}", help: "the topic for topic_regex, with ${name} or $1 for its groups (Go's syntax: $$ for a dollar)",
		apply: str(func(c *Config) *string { return &c.TopicReplacement })},
	{key: "topic_regex_passthrough", group: GroupRouting, kind: kindBool, def: "false", help: "with topic_regex: an aggregate type the regex does not match is the topic itself, as Debezium's router does (any row then chooses its topic within topic_allow: set topic_allow to the topics rows may reach); off refuses such an event (failure policy, reason topic_not_allowed)",
		apply: boolean(func(c *Config) *bool { return &c.TopicRegexPassthrough })},
	{key: "topic_allow", group: GroupRouting, kind: kindList, help: "the topics outbox rows may reach, comma-separated names or patterns where * stands for any characters; empty: the routing's literal prefix (outbox.event.* for the default template), or the fixed topic; required when the routing starts with a placeholder ('*' allows any name but the reserved ones). Other routes go to the failure policy (reason topic_not_allowed)",
		apply: func(c *Config, v string) error {
			if err := list(func(c *Config) *[]string { return &c.TopicAllow })(c, v); err != nil {
				return err
			}
			for _, p := range c.TopicAllow {
				if err := record.CheckTopicPattern(p); err != nil {
					return err
				}
			}
			return nil
		}},
	{key: "topic_deny", group: GroupRouting, kind: kindList, def: "connect-configs,connect-offsets,connect-status", help: "topics no outbox row may reach whatever topic_allow says (Kafka Connect's and other platforms' internal topics), names or patterns where * stands for any characters; names starting with _ and the relay's dead_letter_topic (and redrive's ledger beside it) and positions_topic are always refused",
		apply: func(c *Config, v string) error {
			if err := list(func(c *Config) *[]string { return &c.TopicDeny })(c, v); err != nil {
				return err
			}
			for _, p := range c.TopicDeny {
				if err := record.CheckTopicPattern(p); err != nil {
					return err
				}
			}
			return nil
		}},
	{key: "tombstone_on_empty_payload", group: GroupRouting, kind: kindBool, def: "false", help: "a NULL, empty or blank payload gives a tombstone (a null value) even with envelope fields (Debezium's route.tombstone.on.empty.payload)",
		apply: boolean(func(c *Config) *bool { return &c.TombstoneOnEmptyPayload })},
	{key: "on_update", group: GroupOutbox, kind: choices("warn", "error", "fatal"), def: "warn", help: "what an UPDATE of the outbox table does, when the publication publishes UPDATEs: warn, error (logged at that level and skipped) or fatal (the relay stops before it); Debezium's table.op.invalid.behavior",
		apply: oneOf(func(c *Config) *string { return &c.OnUpdate }, "warn", "error", "fatal")},
	{key: "on_slot_lost", group: GroupPostgres, kind: choices("stop", "recover"), def: "stop", help: "what a lost replication slot (invalidated, or missing where the relay streamed it) makes the relay do: stop (an operator recovers by hand) or recover (replace the slot and publish, from the outbox table, the rows committed after the last event Kafka acknowledged, at least once; needs migrate and outbox rows kept until they are relayed)",
		apply: oneOf(func(c *Config) *string { return &c.OnSlotLost }, "stop", "recover")},
	{key: "slot_recovery_margin", group: GroupPostgres, kind: kindDuration, def: "0s", help: "on_slot_lost: recover: your bound on the longest transaction writing the outbox, used only where nothing PostgreSQL recorded bounds a lost slot's gap (no horizon in the slot ledger, no track_commit_timestamp): the gap is then read from rows created this long before the last acknowledged commit, and a longer or prepared transaction escapes it. 0: no such bound, and such a gap stops the relay. Pruning keeps rows this recent (0: 1h)",
		apply: duration(func(c *Config) *time.Duration { return &c.SlotRecoveryMargin })},
	{key: "on_failure", group: GroupDelivery, kind: choices("dead-letter", "halt"), def: "dead-letter", help: "what to do with an event Kafka cannot take: dead-letter or halt",
		apply: oneOf(func(c *Config) *string { return &c.OnFailure }, "dead-letter", "halt")},
	{key: "dead_letter_topic", group: GroupDelivery, kind: kindString, def: "outbox.dead-letter", help: "topic for events that cannot be published",
		apply: str(func(c *Config) *string { return &c.DeadLetterTopic })},
	{key: "status_interval", group: GroupPostgres, kind: kindDuration, def: "1s", help: "how often the confirmed position is reported to PostgreSQL",
		apply: minDuration(time.Millisecond, func(c *Config) *time.Duration { return &c.StatusInterval })},
	{key: "slot_busy_wait", group: GroupPostgres, kind: kindDuration, def: "30s", help: "at start, how long to wait for a slot another process streams before giving up",
		apply: minDuration(time.Millisecond, func(c *Config) *time.Duration { return &c.SlotBusyWait })},
	{key: "shutdown_timeout", group: GroupOperations, kind: kindDuration, def: "30s", help: "upper bound on a stop: finishing the open transaction, Kafka acknowledgements and the final position report",
		apply: minDuration(time.Millisecond, func(c *Config) *time.Duration { return &c.ShutdownTimeout })},
	{key: "max_in_flight_events", group: GroupDelivery, kind: kindIntAuto, def: "auto", help: "events handed to Kafka and not yet acknowledged, at most; auto: 10000, and 40000 with delivery exactly-once, where events wait for their Kafka transaction's commit and a backlog's transactions grow to half of this (max_in_flight_bytes bounds the memory either way)",
		apply: integerOrAuto(func(c *Config) *int { return &c.MaxInFlight })},
	{key: "max_in_flight_bytes", group: GroupDelivery, kind: kindSize, def: "64MiB", help: "bytes handed to Kafka and not yet acknowledged, at most",
		apply: size(func(c *Config) *int64 { return &c.MaxInFlightBytes })},
	{key: "max_message_bytes", group: GroupDelivery, kind: kindSize, def: "1MiB", help: "largest record sent to Kafka; larger events go to the failure policy",
		apply: func(c *Config, v string) error {
			n, err := parseSize(v)
			if err != nil || n <= 0 || n > 1<<30 {
				return fmt.Errorf("want a size between 1 and 1GiB, got %q", v)
			}
			c.MaxMessageBytes = int(n)
			return nil
		}},
	{key: "heartbeat_interval", group: GroupPostgres, kind: kindDuration, def: "0s", help: "emit a pg_logical_emit_message heartbeat this often; 0 disables",
		apply: duration(func(c *Config) *time.Duration { return &c.HeartbeatInterval })},
	{key: "prune_interval", group: GroupOperations, kind: kindDuration, def: "0s", help: "delete outbox rows older than prune_older_than this often (streaming reads the WAL, not the table; a backfill, a lost slot's recovery and polling read the table: see docs/operations.md); 0 disables, else at least 1s",
		apply: func(c *Config, v string) error {
			// 0 (off) or at least a second: a tiny interval would delete in a busy loop.
			if d, err := time.ParseDuration(v); err == nil && d == 0 {
				c.PruneInterval = 0
				return nil
			}
			return minDuration(time.Second, func(c *Config) *time.Duration { return &c.PruneInterval })(c, v)
		}},
	{key: "prune_older_than", group: GroupOperations, kind: kindDuration, def: "24h", help: "age beyond which pruning deletes an outbox row (by its created_at)",
		apply: duration(func(c *Config) *time.Duration { return &c.PruneOlderThan })},
	{key: "prune_batch_size", group: GroupOperations, kind: kindInt, def: "1000", help: "rows one pruning statement deletes, at most (each batch is its own short transaction)",
		apply: integer(func(c *Config) *int { return &c.PruneBatchSize })},
	{key: "outbox_shape", group: GroupOutbox, kind: choices(SourceTable, SourceMessages, SourceBoth), def: "table", help: "what the outbox is: table (rows inserted into the outbox table), messages (transactional pg_logical_emit_message with messages_prefix, no table; source wal only) or both",
		apply: oneOf(func(c *Config) *string { return &c.OutboxShape }, SourceTable, SourceMessages, SourceBoth)},
	{key: "messages_prefix", group: GroupOutbox, kind: kindString, def: "outbox", help: "prefix of the transactional logical decoding messages that are outbox events (outbox_shape messages or both)",
		apply: str(func(c *Config) *string { return &c.MessagesPrefix })},
	{key: "payload_encoding", group: GroupOutbox, kind: choices("json", "base64"), def: "json", help: "a message's payload member: json (any JSON value, sent as its JSON text) or base64 (a base64 string of the payload bytes); messages only",
		apply: oneOf(func(c *Config) *string { return &c.PayloadEncoding }, "json", "base64")},
	{key: "backfill", group: GroupOutbox, kind: kindBool, def: "false", help: "on first start, publish the rows already in the outbox table (from the new slot's snapshot: no gap, no duplicates)",
		apply: boolean(func(c *Config) *bool { return &c.Backfill })},
	{key: "backfill_since", group: GroupOutbox, kind: kind("time|duration"), help: "backfill only rows created at or after this RFC 3339 time, or this long before the start (e.g. 24h)",
		apply: func(c *Config, v string) error {
			if v == "" {
				c.BackfillSince = ""
				return nil
			}
			if _, err := time.Parse(time.RFC3339, v); err == nil {
				c.BackfillSince = v
				return nil
			}
			if d, err := time.ParseDuration(v); err == nil && d > 0 {
				c.BackfillSince = v
				return nil
			}
			return fmt.Errorf("want an RFC 3339 time (2026-01-02T15:04:05Z) or a positive duration (24h), got %q", v)
		}},
	{key: "backfill_where", group: GroupOutbox, kind: kindString, help: "extra SQL condition on the outbox table for the backfill, e.g. aggregate_type = 'order'",
		apply: str(func(c *Config) *string { return &c.BackfillWhere })},
	{key: "backfill_order_column", group: GroupOutbox, kind: kindString, def: "seq", help: "insertion sequence column the backfill publishes in (migrate adds seq); a table without seq is backfilled in created_at order, with a warning; any other column the table lacks is an error",
		apply: str(func(c *Config) *string { return &c.BackfillOrder })},
	{key: "source", group: GroupOutbox, kind: choices("wal", "poll"), def: "wal", help: "where events come from: wal (a logical replication slot) or poll (the outbox table, for databases without logical replication; needs migrate --source poll)",
		apply: oneOf(func(c *Config) *string { return &c.Source }, "wal", "poll")},
	{key: "poll_batch_size", group: GroupOutbox, kind: kindInt, def: "200", help: "source poll: rows one worker claims per transaction, at most",
		apply: integer(func(c *Config) *int { return &c.PollBatchSize })},
	{key: "poll_interval", group: GroupOutbox, kind: kindDuration, def: "1s", help: "source poll: how often an idle worker looks for rows when no notification woke it (at least 10ms)",
		apply: minDuration(10*time.Millisecond, func(c *Config) *time.Duration { return &c.PollInterval })},
	{key: "poll_max_attempts", group: GroupOutbox, kind: kindInt, def: "5", help: "source poll: permanent Kafka refusals of a row before it is a dead letter and goes to on_failure (broker outages never count)",
		apply: integer(func(c *Config) *int { return &c.PollMaxAttempts })},
	{key: "poll_retry_backoff", group: GroupOutbox, kind: kindDuration, def: "1s", help: "source poll: delay before a refused row is published again; doubles per attempt (with jitter) up to 5m (at least 10ms)",
		apply: minDuration(10*time.Millisecond, func(c *Config) *time.Duration { return &c.PollRetryBackoff })},
	{key: "poll_workers", group: GroupOutbox, kind: kindInt, def: "2", help: "source poll: batches one relay has in flight at once, each its own connection and transaction",
		apply: integer(func(c *Config) *int { return &c.PollWorkers })},
	{key: "delivery", group: GroupDelivery, kind: choices(DeliveryAtLeastOnce, DeliveryExactlyOnce), def: DeliveryAtLeastOnce, help: "at-least-once, or exactly-once: Kafka transactions that also record the position reached, so consumers reading with isolation.level=read_committed see every event once (see docs/guarantees.md)",
		apply: oneOf(func(c *Config) *string { return &c.Delivery }, DeliveryAtLeastOnce, DeliveryExactlyOnce)},
	{key: "transactional_id", group: GroupDelivery, kind: kindString, help: "exactly-once: the Kafka transactional.id; a relay starting with it fences every earlier producer with it; empty derives outbox-relay-<database system identifier>-<slot>",
		apply: str(func(c *Config) *string { return &c.TransactionalID })},
	{key: "transaction_interval", group: GroupDelivery, kind: kindDuration, def: "100ms", help: "exactly-once: how long a Kafka transaction stays open at most; it is committed sooner when the one before has committed and its first event waited kafka.linger (read_committed consumers see events at most about this much later)",
		apply: minDuration(10*time.Millisecond, func(c *Config) *time.Duration { return &c.TransactionInterval })},
	{key: "transaction_max_events", group: GroupDelivery, kind: kindIntAuto, def: "auto", help: "exactly-once: a Kafka transaction is committed once it holds this many events, sooner than transaction_interval, and at most half of max_in_flight_events (one transaction fills while the one before commits); auto: that half, at most 20000",
		apply: integerOrAuto(func(c *Config) *int { return &c.TransactionMaxEvents })},
	{key: "positions_topic", group: GroupDelivery, kind: kindString, def: "__outbox_relay_positions", help: "exactly-once: compacted topic where each Kafka transaction records the position it reached, keyed by transactional_id (created if missing; an existing one must have cleanup.policy=compact); positions only: not dead_letter_topic, not topic_template",
		apply: str(func(c *Config) *string { return &c.PositionsTopic })},
	{key: "metrics_addr", group: GroupOperations, kind: kindString, help: "listen address for /metrics, /healthz and /readyz (e.g. :9187); empty disables",
		apply: str(func(c *Config) *string { return &c.MetricsAddr })},
	{key: "leader_election", group: GroupOperations, kind: kindBool, def: "true", help: "hold a PostgreSQL advisory lock (keyed by the slot) so that one instance streams and the others stand by; false streams without it (with source poll the default is false: pollers share the table)",
		apply: boolean(func(c *Config) *bool { return &c.LeaderElection })},
	{key: "leader_retry_interval", group: GroupOperations, kind: kindDuration, def: "2s", help: "how often a standby tries to take the leader lock (at least 100ms)",
		apply: minDuration(100*time.Millisecond, func(c *Config) *time.Duration { return &c.LeaderRetryInterval })},
	{key: "leader_check_timeout", group: GroupOperations, kind: kindDuration, def: "5s", help: "how long the leader's check of its lock connection (every second) may take before the leader fences itself; PostgreSQL ends a silent leader's lock session 1s + 2 x this + 2s after its last check (at least 100ms)",
		apply: minDuration(100*time.Millisecond, func(c *Config) *time.Duration { return &c.LeaderCheckTimeout })},
	{key: "leader_dsn", group: GroupOperations, kind: kindString, help: "PostgreSQL connection string of the leader lock's session alone, e.g. through a pooler in session mode (a pooler in transaction mode is refused at start: the lock needs a session of its own); the same database as pg_dsn; pg_password_file applies to it too; empty uses pg_dsn", secret: true,
		apply: str(func(c *Config) *string { return &c.LeaderDSN })},
	{key: "leader_kafka_timeout", group: GroupOperations, kind: kindDuration, def: "60s", help: "a leader that has had no Kafka acknowledgement for this long while events wait (or that cannot reach Kafka to start), while a standby whose Kafka answers waits, releases the leader lock, unconfirmed events replayed by the next leader, and competes again only after a pause (2 x leader_retry_interval + 5s, doubling while it keeps happening) and once its Kafka answers; a standby that has seen another instance lead tries the lock only while its Kafka answers; 0 disables both (at least 1s otherwise)",
		apply: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 0 && d < time.Second {
				return fmt.Errorf("want 0 (off) or a duration of at least 1s such as 60s, got %q", v)
			}
			c.LeaderKafkaTimeout = d
			return nil
		}},
	{key: "slot_poll_interval", group: GroupOperations, kind: kindDuration, def: "10s", help: "how often the slot's lag, retained WAL and wal_status are read from pg_replication_slots for the metrics (at least 100ms)",
		apply: minDuration(100*time.Millisecond, func(c *Config) *time.Duration { return &c.SlotPollInterval })},
	{key: "log_level", group: GroupOperations, kind: choices("debug", "info", "warn", "error"), def: "info", help: "debug, info, warn or error",
		apply: oneOf(func(c *Config) *string { return &c.LogLevel }, "debug", "info", "warn", "error")},
	{key: "log_format", group: GroupOperations, kind: choices("json", "console"), def: "json", help: "json or console",
		apply: oneOf(func(c *Config) *string { return &c.LogFormat }, "json", "console")},
	{key: "kafka.batch_size", group: GroupKafka, kind: kindInt, def: "500", help: "records per produce request and partition",
		apply: integer(func(c *Config) *int { return &c.Kafka.BatchSize })},
	{key: "kafka.linger", group: GroupKafka, kind: kindDuration, def: "15ms", help: "how long a partition's oldest record waits for company before its batch is sent (sooner when the batch is full, or when another partition's batch goes to the same broker: they share one request); longer means fewer, bigger requests and less broker CPU per event, shorter means lower latency; 0 sends at once",
		apply: duration(func(c *Config) *time.Duration { return &c.Kafka.Linger })},
	{key: "kafka.write_timeout", group: GroupKafka, kind: kindDuration, def: "10s", help: "timeout of one produce request before it is retried",
		apply: minDuration(time.Millisecond, func(c *Config) *time.Duration { return &c.Kafka.WriteTimeout })},
	{key: "kafka.compression", group: GroupKafka, kind: choices("none", "gzip", "snappy", "lz4", "zstd"), def: "none", help: "none, gzip, snappy, lz4 or zstd",
		apply: oneOf(func(c *Config) *string { return &c.Kafka.Compression }, "none", "gzip", "snappy", "lz4", "zstd")},
	{key: "kafka.idempotence", group: GroupKafka, kind: choices("auto", "on", "off"), def: "auto", help: "idempotent producer (the broker drops a retried batch it already wrote): auto (on, or off with a warning when the broker denies IDEMPOTENT_WRITE), on (a denial stops the start) or off",
		apply: oneOf(func(c *Config) *string { return &c.Kafka.Idempotence }, "auto", "on", "off")},
	{key: "kafka.auto_create_topics", group: GroupKafka, kind: kindBool, def: "false", help: "ask the brokers to create a missing event topic (where auto.create.topics.enable lets them); off, a missing topic stalls the relay until it is created, and a row that invents an aggregate type creates nothing",
		apply: boolean(func(c *Config) *bool { return &c.Kafka.AutoCreateTopics })},
	{key: "kafka.client_id", group: GroupKafka, kind: kindString, def: "outbox-relay", help: "Kafka client id",
		apply: str(func(c *Config) *string { return &c.Kafka.ClientID })},
	{key: "kafka.tls.enabled", group: GroupKafka, kind: kindBool, def: "false", help: "connect to the brokers with TLS",
		apply: boolean(func(c *Config) *bool { return &c.Kafka.TLS.Enabled })},
	{key: "kafka.tls.ca_file", group: GroupKafka, kind: kindString, help: "PEM CA bundle to verify the brokers (default: system roots)",
		apply: str(func(c *Config) *string { return &c.Kafka.TLS.CAFile })},
	{key: "kafka.tls.cert_file", group: GroupKafka, kind: kindString, help: "PEM client certificate for mutual TLS",
		apply: str(func(c *Config) *string { return &c.Kafka.TLS.CertFile })},
	{key: "kafka.tls.key_file", group: GroupKafka, kind: kindString, help: "PEM client key for mutual TLS",
		apply: str(func(c *Config) *string { return &c.Kafka.TLS.KeyFile })},
	{key: "kafka.tls.insecure_skip_verify", group: GroupKafka, kind: kindBool, def: "false", help: "do not verify the brokers' certificates (testing only)",
		apply: boolean(func(c *Config) *bool { return &c.Kafka.TLS.InsecureSkipVerify })},
	{key: "kafka.sasl.mechanism", group: GroupKafka, kind: kind("PLAIN|SCRAM-SHA-256|SCRAM-SHA-512"), help: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty for none",
		apply: func(c *Config, v string) error {
			if v == "" {
				c.Kafka.SASL.Mechanism = ""
				return nil
			}
			return oneOf(func(c *Config) *string { return &c.Kafka.SASL.Mechanism }, "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")(c, v)
		}},
	{key: "kafka.sasl.username", group: GroupKafka, kind: kindString, help: "SASL user name",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.Username })},
	{key: "kafka.sasl.password", group: GroupKafka, kind: kindString, help: "SASL password", secret: true,
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.Password })},
	{key: "kafka.sasl.password_file", group: GroupKafka, kind: kindString, help: "file holding the SASL password (a mounted Secret), read for every connection, so a rotated password is used at the next reconnect; instead of kafka.sasl.password",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.PasswordFile })},
}, registrySettings...)

// profiles preset defaults; keys set explicitly still win.
var profiles = map[string]map[string]string{
	// Debezium's outbox event router defaults: its column names, no headers column, and only the
	// id header (event type and aggregate type travel as headers only when configured).
	"debezium": {
		"columns.id":             "id",
		"columns.aggregate_type": "aggregatetype",
		"columns.aggregate_id":   "aggregateid",
		"columns.event_type":     "type",
		"columns.payload":        "payload",
		"columns.headers":        "",
		"builtin_headers":        "id",
		"topic_template":         "outbox.event.{aggregate_type}",
	},
}

// EnvName is the environment variable for a key: OUTBOX_ and the key in upper case, dots as
// underscores (kafka.sasl.password -> OUTBOX_KAFKA_SASL_PASSWORD).
func EnvName(key string) string {
	return "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// FlagName is the command-line flag for a key: underscores as dashes (max_in_flight_events ->
// --max-in-flight-events, kafka.sasl.password -> --kafka.sasl.password).
func FlagName(key string) string { return strings.ReplaceAll(key, "_", "-") }

// Load applies defaults, the file, the environment and the flags that were set, then validates.
func (l *Loader) Load() (*Config, error) {
	c := &Config{}
	type source struct {
		value, from string
	}
	values := make(map[string]source)
	for _, s := range settings {
		values[s.key] = source{s.def, "default"}
	}
	if *l.file != "" {
		fileValues, err := readFile(*l.file)
		if err != nil {
			return nil, err
		}
		for k, v := range fileValues {
			values[k] = source{v, *l.file}
		}
	}
	for _, s := range settings {
		if v, ok := lookupEnv(l.getenv, EnvName(s.key)); ok {
			values[s.key] = source{v, EnvName(s.key)}
		}
	}
	l.fs.Visit(func(f *flag.Flag) {
		for _, s := range settings {
			if FlagName(s.key) == f.Name {
				values[s.key] = source{f.Value.String(), "--" + f.Name}
			}
		}
	})
	if p := values["profile"]; p.value != "" {
		preset, ok := profiles[strings.ToLower(p.value)]
		if !ok {
			return nil, fmt.Errorf("config key profile (from %s): want debezium, got %q", p.from, p.value)
		}
		for k, v := range preset {
			if values[k].from == "default" {
				values[k] = source{v, "profile " + p.value}
			}
		}
	}
	var errs []error
	for _, s := range settings {
		v := values[s.key]
		if err := s.apply(c, v.value); err != nil {
			errs = append(errs, fmt.Errorf("config key %s (from %s): %w", s.key, v.from, err))
		}
	}
	if err := joinErrors(errs); err != nil {
		return nil, err
	}
	from := func(key string) string { return values[key].from }
	if err := c.validate(from, !l.noKafka, !l.noPG); err != nil {
		return nil, err
	}
	c.Warnings = c.securityWarnings(from)
	return c, nil
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	if getenv == nil {
		return os.LookupEnv(name)
	}
	v := getenv(name)
	return v, v != ""
}

// readFile flattens a YAML document into dotted keys; lists become comma-separated values.
func readFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out := make(map[string]string)
	if err := flatten("", doc, out); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	known := make(map[string]bool, len(settings))
	for _, s := range settings {
		known[s.key] = true
	}
	var unknown []string
	for k := range out {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("config file %s: unknown key %s (see `outbox-relay run -h` for the keys)", path, strings.Join(unknown, ", "))
	}
	return out, nil
}

func flatten(prefix string, v any, out map[string]string) error {
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			if err := flatten(key, sub, out); err != nil {
				return err
			}
		}
	case []any:
		parts := make([]string, len(v))
		for i, item := range v {
			parts[i] = fmt.Sprint(item)
		}
		out[prefix] = strings.Join(parts, ",")
	case nil:
		out[prefix] = ""
	default:
		out[prefix] = fmt.Sprint(v)
	}
	return nil
}

// The in-flight window max_in_flight_events: auto means. Exactly-once acknowledges events only
// once their Kafka transaction commits, and every commit is a pause in production: in a backlog a
// transaction grows to half the window (the sink keeps the other half for the next one, filling
// while it commits), and larger ones drain faster (0.67-0.70 of at-least-once's rate with a 10,000
// window, 0.78-0.89 with 40,000: docs/benchmarks.md).
const (
	autoInFlight            = 10000
	autoInFlightExactlyOnce = 40000
	autoTransactionMax      = autoInFlightExactlyOnce / 2
)

// resolveAuto gives the keys set to auto their value for the delivery mode.
func (c *Config) resolveAuto() {
	if c.MaxInFlight == 0 {
		c.MaxInFlight = autoInFlight
		if c.Delivery == DeliveryExactlyOnce {
			c.MaxInFlight = autoInFlightExactlyOnce
		}
	}
	if c.TransactionMaxEvents == 0 {
		c.TransactionMaxEvents = max(1, min(c.MaxInFlight/2, autoTransactionMax))
	}
}

// validate checks values against each other and names where a bad one came from (from(key)).
func (c *Config) validate(from func(key string) string, needKafka, needPG bool) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config key %s (from %s): %s", key, from(key), fmt.Sprintf(format, args...)))
	}
	if c.PGDSN == "" && needPG {
		errs = append(errs, fmt.Errorf("config key pg_dsn is required: set %s or --pg-dsn", EnvName("pg_dsn")))
	}
	if len(c.KafkaBrokers) == 0 && needKafka {
		errs = append(errs, fmt.Errorf("config key kafka_brokers is required: set %s or --kafka-brokers", EnvName("kafka_brokers")))
	}
	for _, b := range c.KafkaBrokers {
		if _, port, ok := strings.Cut(b, ":"); !ok || port == "" {
			bad("kafka_brokers", "%q is not host:port", b)
		}
	}
	for key, name := range map[string]string{"slot": c.Slot, "publication": c.Publication} {
		if !validIdent(name) {
			bad(key, "%q must be lower-case letters, digits and underscores, at most 63 characters", name)
		}
	}
	for key, col := range map[string]string{"columns.id": c.Columns.ID, "columns.aggregate_type": c.Columns.AggregateType,
		"columns.aggregate_id": c.Columns.AggregateID, "columns.event_type": c.Columns.EventType, "columns.payload": c.Columns.Payload} {
		if col == "" {
			bad(key, "must not be empty")
		}
	}
	if c.TopicTemplate == "" {
		bad("topic_template", "must not be empty")
	}
	if c.StatusInterval < 100*time.Millisecond {
		bad("status_interval", "%s is too short (at least 100ms)", c.StatusInterval)
	}
	if c.Kafka.SASL.Mechanism != "" && (c.Kafka.SASL.Username == "" || c.Kafka.SASL.Password == "" && c.Kafka.SASL.PasswordFile == "") {
		errs = append(errs, errors.New("config key kafka.sasl.mechanism is set, so kafka.sasl.username and kafka.sasl.password (or kafka.sasl.password_file) are required"))
	}
	if c.Kafka.SASL.Password != "" && c.Kafka.SASL.PasswordFile != "" {
		errs = append(errs, fmt.Errorf("config keys kafka.sasl.password (from %s) and kafka.sasl.password_file (from %s) are both set: keep the password in one place",
			from("kafka.sasl.password"), from("kafka.sasl.password_file")))
	}
	if c.PGPasswordFile != "" && dsnPassword(c.LeaderDSN) != "" {
		errs = append(errs, fmt.Errorf("config key pg_password_file (from %s) is set, and leader_dsn (from %s) holds a password too: keep the password in one place",
			from("pg_password_file"), from("leader_dsn")))
	}
	if c.PGPasswordFile != "" && dsnPassword(c.PGDSN) != "" {
		errs = append(errs, fmt.Errorf("config key pg_password_file (from %s) is set, and pg_dsn (from %s) holds a password too: keep the password in one place",
			from("pg_password_file"), from("pg_dsn")))
	}
	if (c.Kafka.TLS.CertFile == "") != (c.Kafka.TLS.KeyFile == "") {
		errs = append(errs, errors.New("config keys kafka.tls.cert_file and kafka.tls.key_file go together: set both or neither"))
	}
	c.resolveAuto()
	if c.Source == "poll" && from("leader_election") == "default" {
		// Pollers share the table (each aggregate is claimed by one at a time), so several run at
		// once unless the operator asks for a single active one.
		c.LeaderElection = false
	}
	if c.LeaderDSN != "" && !c.LeaderElection {
		bad("leader_dsn", "is set, but leader_election (from %s) is false: there is no leader lock to connect for; remove leader_dsn or turn leader_election on", from("leader_election"))
	}
	if c.Delivery == DeliveryExactlyOnce {
		if c.Source == "poll" {
			errs = append(errs, fmt.Errorf("config key delivery (from %s) is exactly-once, but source (from %s) is poll: exactly-once records the replication slot's position in each Kafka transaction, and the poller has no such position; use source: wal, or delivery: at-least-once (with the idempotent producer a broker retry writes nothing twice; a crash between Kafka's acknowledgement and the row's mark publishes that batch again)",
				from("delivery"), from("source")))
		}
		if c.Backfill {
			errs = append(errs, fmt.Errorf("config key backfill (from %s) cannot be used with delivery: exactly-once (from %s): the backfill publishes outside Kafka transactions, so a crash during it publishes rows twice. Start once with delivery: at-least-once and backfill: true (the slot ledger records that it completed), then restart with delivery: exactly-once and backfill: false",
				from("backfill"), from("delivery")))
		}
		if c.Kafka.Idempotence == "off" {
			errs = append(errs, fmt.Errorf("config key kafka.idempotence (from %s) is off, but delivery: exactly-once (from %s) needs the idempotent producer (Kafka transactions are built on it): set kafka.idempotence to auto or on",
				from("kafka.idempotence"), from("delivery")))
		}
		// The positions partition and an event's (or dead letter's) partition of the same topic
		// would be numbered by one producer id and epoch twice from sequence 0: the broker takes
		// the second writer's first batch for a duplicate of the first's, acknowledges it and
		// writes nothing. A template with placeholders is checked per event (sink).
		if c.PositionsTopic == c.DeadLetterTopic {
			errs = append(errs, fmt.Errorf("config key positions_topic (from %s) and dead_letter_topic (from %s) are both %q: the positions topic must hold positions only; choose another name for one of them",
				from("positions_topic"), from("dead_letter_topic"), c.PositionsTopic))
		}
		if c.TopicRegex == "" && c.PositionsTopic == c.TopicTemplate {
			errs = append(errs, fmt.Errorf("config key positions_topic (from %s) and topic_template (from %s) are both %q: every event would go to the positions topic, which must hold positions only; choose another name for one of them",
				from("positions_topic"), from("topic_template"), c.PositionsTopic))
		}
		if c.TopicRegex != "" && c.PositionsTopic == c.TopicReplacement {
			errs = append(errs, fmt.Errorf("config key positions_topic (from %s) and topic_replacement (from %s) are both %q: every event the topic regex matches would go to the positions topic, which must hold positions only; choose another name for one of them",
				from("positions_topic"), from("topic_replacement"), c.PositionsTopic))
		}
		if c.TransactionMaxEvents > c.MaxInFlight {
			errs = append(errs, fmt.Errorf("config key transaction_max_events (from %s) is %d, more than max_in_flight_events (from %s), %d: events are acknowledged only once their Kafka transaction commits, so a transaction never holds more than max_in_flight_events; lower transaction_max_events or raise max_in_flight_events",
				from("transaction_max_events"), c.TransactionMaxEvents, from("max_in_flight_events"), c.MaxInFlight))
		}
	}
	if strings.TrimSpace(c.TransactionalID) != c.TransactionalID || len(c.TransactionalID) > 249 {
		bad("transactional_id", "%q must have no leading or trailing spaces and at most 249 characters", c.TransactionalID)
	}
	if err := validTopicName(c.PositionsTopic); err != nil {
		bad("positions_topic", "%v", err)
	}
	// A row chooses its dead letter's key and value, and can make its event fail at will (a
	// refused topic, a malformed headers member): the dead-letter topic is written by rows too.
	if record.ReservedTopic(c.DeadLetterTopic, c.TopicDeny) {
		bad("dead_letter_topic", "%q starts with '_' or matches topic_deny: outbox rows choose what their dead letters hold, so it must be a topic they may write; choose another name", c.DeadLetterTopic)
	}
	if c.TopicRegex != "" && from("topic_template") != "default" && !strings.HasPrefix(from("topic_template"), "profile") {
		bad("topic_regex", "and topic_template (from %s) both route: set one", from("topic_template"))
	}
	c.validateRegistry(bad)
	if c.ValueEncoding == "json-with-schema" {
		for _, f := range c.ExtraFields {
			if strings.Contains(f, ":envelope") {
				bad("value_encoding", "json-with-schema cannot carry envelope fields (extra_fields %q): use json-string or raw with them", f)
				break
			}
		}
	}
	if c.TopicRegex != "" {
		if _, err := record.NewTopicRegex(c.TopicRegex, c.TopicReplacement); err != nil {
			bad("topic_regex", "%v", err)
		}
	}
	if c.TopicRegex == "" && c.TopicRegexPassthrough {
		bad("topic_regex_passthrough", "applies with topic_regex only")
	}
	if len(c.TopicAllow) == 0 {
		if allow := record.DefaultTopicAllow(c.recordRouting()); len(allow) == 1 && allow[0] == "*" {
			route := "topic_template " + c.TopicTemplate
			if c.TopicRegex != "" {
				route = "topic_replacement " + c.TopicReplacement
			}
			bad("topic_allow", "must be set: %s starts with a placeholder, so any outbox row would choose its topic; list the topics rows may reach (e.g. orders.*,customers.*), or '*' for any name but the reserved ones", route)
		}
	}
	if c.TopicRegex == "" && from("topic_replacement") != "default" && c.TopicReplacement != record.DefaultTopicReplacement {
		bad("topic_replacement", "applies with topic_regex only; for a fixed pattern use topic_template")
	}
	if c.UsesMessages() {
		switch c.MessagesPrefix {
		case "":
			bad("messages_prefix", "must not be empty with outbox_shape %s", c.OutboxShape)
		case HeartbeatPrefix:
			bad("messages_prefix", "%q is the relay's heartbeat prefix; choose another", c.MessagesPrefix)
		}
	} else if c.PayloadEncoding != "json" {
		bad("payload_encoding", "applies to logical decoding messages only, and outbox_shape is %s: remove it or set outbox_shape to messages or both", c.OutboxShape)
	}
	if !c.UsesTable() {
		// Nothing is stored: a message exists only in the WAL, so there are no rows to backfill
		// or prune.
		nothing := "outbox_shape messages stores nothing (an event exists only in the WAL), so there is nothing to %s: remove it, or use outbox_shape both with an outbox table"
		if c.Backfill {
			bad("backfill", nothing, "backfill")
		}
		if c.BackfillSince != "" {
			bad("backfill_since", nothing, "backfill")
		}
		if c.BackfillWhere != "" {
			bad("backfill_where", nothing, "backfill")
		}
		if c.PruneInterval > 0 {
			bad("prune_interval", nothing, "prune")
		}
	}
	if c.Source == "poll" && c.UsesMessages() {
		bad("outbox_shape", "is %s, but source (from %s) is poll: logical decoding messages exist only in the WAL, so the poller cannot read them; use source: wal, or outbox_shape: table", c.OutboxShape, from("source"))
	}
	if c.PGDSN != "" {
		if err := checkDSN(c.PGDSN); err != nil {
			bad("pg_dsn", "%v", err)
		}
	}
	if c.FailoverStandbyDSN != "" {
		// A standby is what it names, so checkDSN's demand for the writable server does not apply.
		if _, err := pgconn.ParseConfig(c.FailoverStandbyDSN); err != nil {
			bad("failover_standby_dsn", "%s", Scrub(err.Error(), dsnPassword(c.FailoverStandbyDSN)))
		}
		if c.Source == "poll" {
			bad("failover_standby_dsn", "is set, but source (from %s) is poll: there is no slot to keep through a promotion", from("source"))
		}
	}
	if c.OnSlotLost == "recover" && c.Source == "poll" {
		bad("on_slot_lost", "is recover, but source (from %s) is poll: there is no slot to lose", from("source"))
	}
	if c.SlotRecoveryMargin < 0 {
		bad("slot_recovery_margin", "is %s; want 0 (none) or more", c.SlotRecoveryMargin)
	}
	if c.LeaderDSN != "" {
		if err := checkDSN(c.LeaderDSN); err != nil {
			bad("leader_dsn", "%v", err)
		}
	}
	return joinErrors(errs)
}

// joinErrors keeps several problems on one line, so each is still one line of the log.
func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
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

// validTopicName applies Kafka's rules for topic names.
func validTopicName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 249 {
		return fmt.Errorf("%q is not a Kafka topic name (1 to 249 characters, not . or ..)", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q is not a Kafka topic name (letters, digits, '.', '_' and '-' only)", name)
		}
	}
	return nil
}

func validIdent(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// checkDSN catches a malformed DSN early, without echoing the password, and a multi-host DSN
// that could lead to a standby.
func checkDSN(dsn string) error {
	if isURL(dsn) {
		if _, _, err := parseURL(dsn); err != nil {
			return fmt.Errorf("not a valid URL (%s)", RedactDSN(dsn))
		}
	}
	return checkHosts(dsn)
}

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

// parseSize reads a byte count with an optional KB/MB/GB (powers of 1000) or KiB/MiB/GiB suffix.
func parseSize(v string) (int64, error) {
	v = strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"B", 1}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, err
	}
	if n > (1<<63-1)/mult {
		return 0, errors.New("size overflows") // n*mult would wrap, maybe to a small positive size
	}
	return n * mult, nil
}
