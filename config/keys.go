package config

import (
	"fmt"
	"strings"
	"time"
)

// Group is a section of the configuration keys, as help lists them.
type Group string

// The groups, in the order help lists them.
const (
	GroupPostgres   Group = "PostgreSQL"
	GroupOutbox     Group = "Outbox table and source"
	GroupKafka      Group = "Kafka"
	GroupRouting    Group = "Routing (event to record)"
	GroupDelivery   Group = "Delivery"
	GroupOperations Group = "Operations"
)

var groups = []Group{GroupPostgres, GroupOutbox, GroupKafka, GroupRouting, GroupDelivery, GroupOperations}

// kind is what a key's value is, in the words help uses after the flag ("duration", "size",
// "a|b|c"); booleans have none, so that help shows them as switches.
type kind string

const (
	kindBool     kind = ""
	kindString   kind = "string"
	kindInt      kind = "int"
	kindDuration kind = "duration"
	kindSize     kind = "size"
	kindList     kind = "list"
	kindIntAuto  kind = "int|auto"
)

func choices(allowed ...string) kind { return kind(strings.Join(allowed, "|")) }

// EnvName is the environment variable for a key: OUTBOX_ and the key in upper case, dots as
// underscores (kafka.sasl.password -> OUTBOX_KAFKA_SASL_PASSWORD).
func EnvName(key string) string {
	return "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// FlagName is the command-line flag for a key: underscores as dashes (max_in_flight_events ->
// --max-in-flight-events, kafka.sasl.password -> --kafka.sasl.password).
func FlagName(key string) string { return strings.ReplaceAll(key, "_", "-") }

// setting is one configuration key: its default, its help, and how to apply a value.
type setting struct {
	key    string
	group  Group
	kind   kind // what help calls its value
	def    string
	help   string
	secret bool
	apply  func(c *Config, v string) error
	// see names the pages (docs/PAGE.md#Section title, or the page alone) that explain the key
	// further, for operators: docs/configuration.md links them, help stays short.
	see []string
}

// settings is the whole configuration surface; docs/configuration.md is generated from it.
var settings = append(append([]setting{
	{key: "profile", group: GroupOutbox, kind: kind("debezium"), help: "preset defaults: debezium (Debezium's outbox router columns id, aggregatetype, aggregateid, type and payload, no headers column, the id header only); keys set explicitly still win; empty for none",
		apply: func(c *Config, v string) error {
			if v == "" {
				c.Profile = ""
				return nil
			}
			return oneOf(func(c *Config) *string { return &c.Profile }, "debezium")(c, v)
		}},
	{key: "pg_dsn", see: []string{"operations.md#PostgreSQL failover", "operations.md#PostgreSQL TLS", "operations.md#A least-privilege role"}, group: GroupPostgres, kind: kindString, help: "PostgreSQL connection string (URL or key=value), required; the role needs REPLICATION (source wal) or SELECT and UPDATE on the table (source poll). Several hosts (host=a,b or postgres://a:5432,b:5432/db) need target_session_attrs=read-write (or primary), so that the relay finds a promoted standby by itself. TLS is set here too (sslmode=verify-full, sslrootcert, sslcert, sslkey) and covers every connection", secret: true,
		apply: str(func(c *Config) *string { return &c.PGDSN })},
	{key: "pg_password_file", see: []string{"operations.md#Secrets in files and their rotation"}, group: GroupPostgres, kind: kindString, help: "file holding the PostgreSQL password (a mounted Secret), read for every connection, so a rotated password is used at the next reconnect; pg_dsn then holds none",
		apply: str(func(c *Config) *string { return &c.PGPasswordFile })},
	{key: "kafka_brokers", group: GroupKafka, kind: kindList, help: "Kafka bootstrap brokers, comma-separated host:port; required by every command that talks to Kafka",
		apply: list(func(c *Config) *[]string { return &c.KafkaBrokers })},
	{key: "slot", group: GroupPostgres, kind: kindString, def: "outbox_relay", help: "logical replication slot name",
		apply: str(func(c *Config) *string { return &c.Slot })},
	{key: "publication", group: GroupPostgres, kind: kindString, def: "outbox_relay", help: "publication name",
		apply: str(func(c *Config) *string { return &c.Publication })},
	{key: "table", group: GroupOutbox, kind: kind("[schema.]table"), def: "public.outbox_events", help: "outbox table, optionally schema-qualified",
		apply: tableName},
	{key: "create_slot", group: GroupPostgres, kind: kindBool, def: "true", help: "create the slot when it does not exist",
		apply: boolean(func(c *Config) *bool { return &c.CreateSlot })},
	{key: "create_publication", group: GroupPostgres, kind: kindBool, def: "true", help: "create the publication (INSERTs on table, publish_via_partition_root = true) when it does not exist, and set publish_via_partition_root on an existing one when table is partitioned",
		apply: boolean(func(c *Config) *bool { return &c.CreatePublication })},
	{key: "failover", see: []string{"operations.md#PostgreSQL failover"}, group: GroupPostgres, kind: kindBool, def: "false", help: "make the slot a failover slot (PostgreSQL 17+), which standbys with sync_replication_slots keep, so that it survives a promotion: created with FAILOVER, an existing slot altered; an error on older servers",
		apply: boolean(func(c *Config) *bool { return &c.Failover })},
	{key: "failover_standby_dsn", see: []string{"operations.md#PostgreSQL failover"}, group: GroupPostgres, kind: kindString, help: "a standby that may be promoted (PostgreSQL 17+, connection string like pg_dsn; pg_password_file and TLS settings apply): every slot_poll_interval the relay reads its copy of the failover slot for the outbox_relay_standby_slot_* metrics (persisted, trail behind the primary's slot) and the OutboxRelayFailoverWouldLoseSlot alert; unset: not watched", secret: true,
		apply: str(func(c *Config) *string { return &c.FailoverStandbyDSN })},
	{key: "columns.id", group: GroupOutbox, kind: kindString, def: "id", help: "event id column (sent as the id header)",
		apply: str(func(c *Config) *string { return &c.Columns.ID })},
	{key: "columns.aggregate_type", group: GroupOutbox, kind: kindString, def: "aggregate_type", help: "aggregate type column (routes to the topic)",
		apply: str(func(c *Config) *string { return &c.Columns.AggregateType })},
	{key: "columns.aggregate_id", group: GroupOutbox, kind: kindString, def: "aggregate_id", help: "aggregate id column (the record key)",
		apply: str(func(c *Config) *string { return &c.Columns.AggregateID })},
	{key: "columns.event_type", group: GroupOutbox, kind: kindString, def: "event_type", help: "event type column",
		apply: str(func(c *Config) *string { return &c.Columns.EventType })},
	{key: "columns.payload", group: GroupOutbox, kind: kindString, def: "payload", help: "payload column (the record value, bytes as stored; a bytea is sent raw, whatever bytea_output the database or role sets)",
		apply: str(func(c *Config) *string { return &c.Columns.Payload })},
	{key: "columns.headers", group: GroupOutbox, kind: kindString, def: "headers", help: "JSON object column whose members become headers; empty for none",
		apply: str(func(c *Config) *string { return &c.Columns.Headers })},
	{key: "columns.aggregate_version", group: GroupOutbox, kind: kindString, help: "bigint column with the aggregate's version, sent as the aggregate_version header (consumers detect missed and stale events, see the inbox package); empty for none",
		apply: str(func(c *Config) *string { return &c.Columns.AggregateVersion })},
	{key: "columns.created_at", group: GroupOutbox, kind: kindString, def: "created_at", help: "creation time column, for backfill_since and pruning",
		apply: str(func(c *Config) *string { return &c.Columns.CreatedAt })},
	{key: "columns.timestamp", group: GroupOutbox, kind: kindString, help: "timestamp or timestamptz column whose value is the record timestamp (a timestamp is read as UTC; NULL gives the commit time), as Debezium's table.field.event.timestamp; empty: the commit time",
		apply: str(func(c *Config) *string { return &c.Columns.Timestamp })},
	{key: "columns.tracing_span_context", group: GroupOutbox, kind: kindString, help: "column holding Debezium's tracing span context (Java Properties text with traceparent and tracestate), sent as W3C traceparent/tracestate headers unless the event has a traceparent header already; empty for none",
		apply: str(func(c *Config) *string { return &c.Columns.TracingSpanContext })},
	{key: "extra_headers", group: GroupRouting, kind: kindList, help: "further columns sent as headers, comma-separated column[:header]; a NULL column sends no header",
		apply: list(func(c *Config) *[]string { return &c.ExtraHeaders })},
	{key: "extra_fields", group: GroupRouting, kind: kindList, help: "further columns placed as Debezium's table.fields.additional.placement does, comma-separated column:placement[:alias] with placement header (a NULL column is a header with a null value), envelope (the value becomes {\"payload\": ..., \"<alias>\": <value>}) or partition (an integer column: the record's partition; NULL: the key's)",
		apply: extraFields},
	{key: "builtin_headers", group: GroupRouting, kind: kindList, def: "id,event_type,aggregate_type", help: "which of the headers id, event_type and aggregate_type every record carries",
		apply: builtinHeaders},
	{key: "value_encoding", see: []string{"registry-encodings.md"}, group: GroupRouting, kind: choices("raw", "json-string", "json-expanded", "json-with-schema", "avro", "protobuf", "json-schema"), def: "raw", help: "record value: raw (payload bytes as stored), json-string (a JSON string, like Debezium's JsonConverter with schemas disabled), json-expanded (the payload as Debezium's table.expand.json.payload writes it: a JSON object re-encoded compactly, null members and empty arrays dropped, anything else a string), json-with-schema (that in JsonConverter's {\"schema\",\"payload\"} envelope, schemas.enable=true), avro (Avro in the Confluent wire format through schema_registry, like Debezium's AvroConverter), protobuf (Protobuf, with its message-index list, likewise; like Confluent's ProtobufConverter) or json-schema (the JSON document checked against a JSON Schema, likewise; like Confluent's JsonSchemaConverter). A NULL payload is the JSON null with the JSON encodings, a null value with the registry ones (docs/registry-encodings.md)",
		apply: oneOf(func(c *Config) *string { return &c.ValueEncoding }, "raw", "json-string", "json-expanded", "json-with-schema", "avro", "protobuf", "json-schema")},
	{key: "key_encoding", see: []string{"registry-encodings.md"}, group: GroupRouting, kind: choices("raw", "json-string", "json-with-schema", "avro"), def: "raw", help: "record key: raw (aggregate id as stored), json-string (a JSON string, like Connect's JsonConverter with schemas disabled), json-with-schema (JsonConverter's envelope with schemas enabled, a NOT NULL string schema) or avro (an Avro string in the Confluent wire format through schema_registry, like Connect's AvroConverter); partitioning hashes the encoded key, like the Java producer",
		apply: oneOf(func(c *Config) *string { return &c.KeyEncoding }, "raw", "json-string", "json-with-schema", "avro")},
	{key: "topic_template", group: GroupRouting, kind: kindString, def: "outbox.event.{aggregate_type}", help: "topic name; {aggregate_type} and {event_type} are replaced",
		apply: str(func(c *Config) *string { return &c.TopicTemplate })},
	{key: "topic_regex", group: GroupRouting, kind: kindString, help: "route by regular expression (Debezium's route.topic.regex, Go syntax) matched against the whole aggregate type: the topic is topic_replacement with its groups; an aggregate type it does not match goes to the failure policy (reason topic_not_allowed) unless topic_regex_passthrough; replaces topic_template",
		apply: str(func(c *Config) *string { return &c.TopicRegex })},
	{key: "topic_replacement", group: GroupRouting, kind: kindString, def: "outbox.event.${routedByValue}", help: "the topic for topic_regex, with ${name} or $1 for its groups (Go's syntax: $$ for a dollar)",
		apply: str(func(c *Config) *string { return &c.TopicReplacement })},
	{key: "topic_regex_passthrough", group: GroupRouting, kind: kindBool, def: "false", help: "with topic_regex: an aggregate type the regex does not match is the topic itself, as Debezium's router does (any row then chooses its topic, bounded only by topic_allow and topic_deny: set topic_allow to the topics rows may reach); off refuses such an event (failure policy, reason topic_not_allowed)",
		apply: boolean(func(c *Config) *bool { return &c.TopicRegexPassthrough })},
	{key: "topic_allow", group: GroupRouting, kind: kindList, help: "the topics outbox rows may reach, comma-separated names or patterns where * stands for any characters; empty: the text of topic_template (or topic_replacement) before its first placeholder followed by * (outbox.event.* by default), or the fixed topic itself; required when the routing starts with a placeholder ('*' allows any name but the reserved ones). Other routes go to the failure policy (reason topic_not_allowed)",
		apply: topicPatterns(func(c *Config) *[]string { return &c.TopicAllow })},
	{key: "topic_deny", group: GroupRouting, kind: kindList, def: "connect-configs,connect-offsets,connect-status", help: "topics no outbox row may reach whatever topic_allow says (Kafka Connect's and other platforms' internal topics), names or patterns where * stands for any characters (connect-*); names starting with _, dead_letter_topic, redrive's ledger (dead_letter_topic + .redriven) and positions_topic are always refused, in every delivery mode",
		apply: topicPatterns(func(c *Config) *[]string { return &c.TopicDeny })},
	{key: "tombstone_on_empty_payload", group: GroupRouting, kind: kindBool, def: "false", help: "a NULL, empty or blank payload gives a tombstone (a null value), also with extra_fields placed in the value's envelope, with envelope cloudevents and with the JSON encodings (Debezium's route.tombstone.on.empty.payload)",
		apply: boolean(func(c *Config) *bool { return &c.TombstoneOnEmptyPayload })},
	{key: "on_update", group: GroupOutbox, kind: choices("warn", "error", "fatal"), def: "warn", help: "what an UPDATE of the outbox table does, when the publication publishes UPDATEs: warn, error (logged at that level and skipped) or fatal (the relay stops before it); Debezium's table.op.invalid.behavior",
		apply: oneOf(func(c *Config) *string { return &c.OnUpdate }, "warn", "error", "fatal")},
	{key: "on_slot_lost", see: []string{"operations.md#Recovering a lost or missing slot"}, group: GroupPostgres, kind: choices("stop", "recover"), def: "stop", help: "what a lost replication slot (invalidated, wal_status lost, or missing where the relay streamed it) makes the relay do: stop (with the fix in the error; an operator recovers by hand) or recover (replace the slot and publish, from the outbox table, the rows committed after the last event Kafka acknowledged, at least once; needs migrate and outbox rows kept until they are relayed)",
		apply: oneOf(func(c *Config) *string { return &c.OnSlotLost }, "stop", "recover")},
	{key: "slot_recovery_margin", see: []string{"operations.md#Recovering a lost or missing slot"}, group: GroupPostgres, kind: kindDuration, def: "0s", help: "on_slot_lost: recover: your bound on the longest transaction writing the outbox, used only where nothing PostgreSQL recorded bounds a lost slot's gap (no horizon in the slot ledger, no track_commit_timestamp): the gap is then read from rows created this long before the last acknowledged commit, and a longer or prepared transaction escapes it. 0: no such bound, and such a gap stops the relay. Pruning keeps rows this recent (0: 1h), plus 1s, before the last acknowledged commit",
		apply: duration(func(c *Config) *time.Duration { return &c.SlotRecoveryMargin })},
	{key: "on_failure", group: GroupDelivery, kind: choices("dead-letter", "halt"), def: "dead-letter", help: "what to do with an event Kafka cannot take: dead-letter or halt",
		apply: oneOf(func(c *Config) *string { return &c.OnFailure }, "dead-letter", "halt")},
	{key: "dead_letter_topic", see: []string{"operations.md#Replay and redrive"}, group: GroupDelivery, kind: kindString, def: "outbox.dead-letter", help: "topic for events that cannot be published; not a name starting with _ or matching topic_deny (rows choose what their dead letters hold)",
		apply: str(func(c *Config) *string { return &c.DeadLetterTopic })},
	{key: "status_interval", group: GroupPostgres, kind: kindDuration, def: "1s", help: "how often the confirmed position is reported to PostgreSQL; capped at a third of wal_sender_timeout, and at 40s (a third of the 2-minute receive timeout), so a silent server is asked for a reply in time",
		apply: minDuration(time.Millisecond, func(c *Config) *time.Duration { return &c.StatusInterval })},
	{key: "slot_busy_wait", group: GroupPostgres, kind: kindDuration, def: "30s", help: "at start, how long to wait for a slot another process streams before giving up",
		apply: minDuration(time.Millisecond, func(c *Config) *time.Duration { return &c.SlotBusyWait })},
	{key: "shutdown_timeout", see: []string{"operations.md#Stopping the relay"}, group: GroupOperations, kind: kindDuration, def: "30s", help: "upper bound on a stop: finishing the open transaction, Kafka acknowledgements and the final position report; closing the connections takes up to a few seconds more, so keep a grace period (terminationGracePeriodSeconds) at least 10s above it",
		apply: minDuration(time.Millisecond, func(c *Config) *time.Duration { return &c.ShutdownTimeout })},
	{key: "max_in_flight_events", group: GroupDelivery, kind: kindIntAuto, def: "auto", help: "events handed to Kafka and not yet acknowledged, at most; auto: 10000, and 40000 with delivery exactly-once, where events wait for their Kafka transaction's commit and a backlog's transactions grow to half of this (docs/benchmarks.md); max_in_flight_bytes bounds the memory either way",
		apply: integerOrAuto(func(c *Config) *int { return &c.MaxInFlight })},
	{key: "max_in_flight_bytes", group: GroupDelivery, kind: kindSize, def: "64MiB", help: "bytes handed to Kafka and not yet acknowledged, at most",
		apply: size(func(c *Config) *int64 { return &c.MaxInFlightBytes })},
	{key: "max_message_bytes", group: GroupDelivery, kind: kindSize, def: "1MiB", help: "largest record sent to Kafka, lowered to the broker's message.max.bytes if that is smaller; larger events go to the failure policy",
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
	{key: "prune_interval", group: GroupOperations, kind: kindDuration, def: "0s", help: "delete outbox rows older than prune_older_than this often (streaming reads the WAL, not the table; a backfill, a lost slot's recovery and polling read the table: see docs/operations.md); 0 disables, else at least 1s; outbox-relay prune does one run",
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
	{key: "outbox_shape", see: []string{"operations.md#The table-free outbox: logical decoding messages"}, group: GroupOutbox, kind: choices(SourceTable, SourceMessages, SourceBoth), def: "table", help: "what the outbox is: table (rows inserted into the outbox table), messages (transactional pg_logical_emit_message with messages_prefix: no table, nothing to backfill or prune) or both; messages and both need source wal, since messages exist only in the WAL",
		apply: oneOf(func(c *Config) *string { return &c.OutboxShape }, SourceTable, SourceMessages, SourceBoth)},
	{key: "messages_prefix", see: []string{"operations.md#The table-free outbox: logical decoding messages"}, group: GroupOutbox, kind: kindString, def: "outbox", help: "prefix of the transactional logical decoding messages that are outbox events (outbox_shape messages or both); messages with other prefixes are ignored",
		apply: str(func(c *Config) *string { return &c.MessagesPrefix })},
	{key: "payload_encoding", see: []string{"operations.md#The table-free outbox: logical decoding messages"}, group: GroupOutbox, kind: choices("json", "base64"), def: "json", help: "a message's payload member: json (any JSON value, sent as its JSON text) or base64 (a base64 string of the payload bytes); messages only",
		apply: oneOf(func(c *Config) *string { return &c.PayloadEncoding }, "json", "base64")},
	{key: "backfill", see: []string{"operations.md#First start with rows already in the table"}, group: GroupOutbox, kind: kindBool, def: "false", help: "on first start, publish the rows already in the outbox table (from the new slot's snapshot: no gap, no duplicates)",
		apply: boolean(func(c *Config) *bool { return &c.Backfill })},
	{key: "backfill_since", see: []string{"operations.md#First start with rows already in the table"}, group: GroupOutbox, kind: kind("time|duration"), help: "backfill only rows created at or after this RFC 3339 time, or this long before the start (e.g. 24h)",
		apply: backfillSince},
	{key: "backfill_where", see: []string{"operations.md#First start with rows already in the table"}, group: GroupOutbox, kind: kindString, help: "extra SQL condition on the outbox table for the backfill, e.g. aggregate_type = 'order': one condition, run alone in the backfill's read-only transaction (the extended protocol takes one statement); anything else stops the start with an error naming the key",
		apply: str(func(c *Config) *string { return &c.BackfillWhere })},
	{key: "backfill_order_column", see: []string{"operations.md#First start with rows already in the table"}, group: GroupOutbox, kind: kindString, def: "seq", help: "insertion sequence column the backfill publishes in (migrate adds seq); a table without seq is backfilled in created_at order, with a warning; any other column the table lacks is an error",
		apply: str(func(c *Config) *string { return &c.BackfillOrder })},
	{key: "source", see: []string{"operations.md#Choosing a source: wal or poll"}, group: GroupOutbox, kind: choices("wal", "poll"), def: "wal", help: "where events come from: wal (a logical replication slot) or poll (the outbox table, for databases without logical replication; needs migrate --source poll)",
		apply: oneOf(func(c *Config) *string { return &c.Source }, "wal", "poll")},
	{key: "poll_batch_size", group: GroupOutbox, kind: kindInt, def: "200", help: "source poll: rows one worker claims per transaction, at most",
		apply: integer(func(c *Config) *int { return &c.PollBatchSize })},
	{key: "poll_interval", group: GroupOutbox, kind: kindDuration, def: "1s", help: "source poll: how often an idle worker looks for rows when no notification woke it (notifications are lost while the LISTEN connection reconnects, and a row in backoff becomes due without one); at least 10ms",
		apply: minDuration(10*time.Millisecond, func(c *Config) *time.Duration { return &c.PollInterval })},
	{key: "poll_max_attempts", see: []string{"operations.md#Polling mode: dead letters and retry"}, group: GroupOutbox, kind: kindInt, def: "5", help: "source poll: permanent Kafka refusals of a row before it is a dead letter and goes to on_failure (broker outages never count)",
		apply: integer(func(c *Config) *int { return &c.PollMaxAttempts })},
	{key: "poll_retry_backoff", see: []string{"operations.md#Polling mode: dead letters and retry"}, group: GroupOutbox, kind: kindDuration, def: "1s", help: "source poll: delay before a refused row is published again; doubles per attempt, with jitter (half to all of it), up to 5m (at least 10ms)",
		apply: minDuration(10*time.Millisecond, func(c *Config) *time.Duration { return &c.PollRetryBackoff })},
	{key: "poll_workers", group: GroupOutbox, kind: kindInt, def: "2", help: "source poll: batches one relay has in flight at once, each its own connection and transaction",
		apply: integer(func(c *Config) *int { return &c.PollWorkers })},
	{key: "delivery", see: []string{"operations.md#Exactly-once delivery"}, group: GroupDelivery, kind: choices(DeliveryAtLeastOnce, DeliveryExactlyOnce), def: DeliveryAtLeastOnce, help: "at-least-once, or exactly-once: Kafka transactions that also record the position reached, so consumers reading with isolation.level=read_committed see every event once (see docs/guarantees.md)",
		apply: oneOf(func(c *Config) *string { return &c.Delivery }, DeliveryAtLeastOnce, DeliveryExactlyOnce)},
	{key: "transactional_id", see: []string{"operations.md#Exactly-once delivery", "operations.md#Exactly-once: broker settings and ACLs"}, group: GroupDelivery, kind: kindString, help: "exactly-once: the Kafka transactional.id; a relay starting with it fences every earlier producer with it; empty derives outbox-relay-<database system identifier>-<slot>, which survives a failover to a physical standby",
		apply: str(func(c *Config) *string { return &c.TransactionalID })},
	{key: "transaction_interval", see: []string{"operations.md#Exactly-once delivery"}, group: GroupDelivery, kind: kindDuration, def: "100ms", help: "exactly-once: how long a Kafka transaction stays open at most; it is committed sooner when the one before has committed and its first event waited kafka.linger (under load transactions commit back to back); read_committed consumers see events at most about this much later",
		apply: minDuration(10*time.Millisecond, func(c *Config) *time.Duration { return &c.TransactionInterval })},
	{key: "transaction_max_events", see: []string{"operations.md#Exactly-once delivery"}, group: GroupDelivery, kind: kindIntAuto, def: "auto", help: "exactly-once: a Kafka transaction is committed once it holds this many events, sooner than transaction_interval, and at most half of max_in_flight_events (one transaction fills while the one before commits); auto: that half, at most 20000",
		apply: integerOrAuto(func(c *Config) *int { return &c.TransactionMaxEvents })},
	{key: "positions_topic", see: []string{"operations.md#Exactly-once delivery", "operations.md#Exactly-once: broker settings and ACLs"}, group: GroupDelivery, kind: kindString, def: "__outbox_relay_positions", help: "exactly-once: compacted topic where each Kafka transaction records the position it reached, keyed by transactional_id (created if missing; an existing one must have cleanup.policy=compact); positions only: not dead_letter_topic, not a fixed topic_template, and an event routed to it goes to the failure policy",
		apply: str(func(c *Config) *string { return &c.PositionsTopic })},
	{key: "metrics_addr", see: []string{"operations.md#Metrics", "operations.md#Health endpoints"}, group: GroupOperations, kind: kindString, help: "listen address for /metrics, /healthz and /readyz (e.g. :9187); empty disables",
		apply: str(func(c *Config) *string { return &c.MetricsAddr })},
	{key: "leader_election", see: []string{"operations.md#Scaling and high availability"}, group: GroupOperations, kind: kindBool, def: "true", help: "hold a PostgreSQL advisory lock (keyed by the slot) so that one instance streams and the others stand by; false streams without it (with source poll the default is false: pollers share the table)",
		apply: boolean(func(c *Config) *bool { return &c.LeaderElection })},
	{key: "leader_retry_interval", group: GroupOperations, kind: kindDuration, def: "2s", help: "how often a standby tries to take the leader lock (at least 100ms)",
		apply: minDuration(100*time.Millisecond, func(c *Config) *time.Duration { return &c.LeaderRetryInterval })},
	{key: "leader_check_timeout", see: []string{"operations.md#Scaling and high availability"}, group: GroupOperations, kind: kindDuration, def: "5s", help: "how long the leader's check of its lock connection (every second) may take before the leader fences itself (a check answered within it never fences); PostgreSQL ends a silent leader's lock session 1s + 2 x this + 2s after its last check, which bounds a takeover after a network partition (at least 100ms)",
		apply: minDuration(100*time.Millisecond, func(c *Config) *time.Duration { return &c.LeaderCheckTimeout })},
	{key: "leader_dsn", see: []string{"operations.md#Scaling and high availability"}, group: GroupOperations, kind: kindString, help: "PostgreSQL connection string of the leader lock's session alone, e.g. through a pooler in session mode (a pooler in transaction or statement mode is refused at start: the lock needs a session of its own); the same database as pg_dsn; pg_password_file applies to it too; empty uses pg_dsn", secret: true,
		apply: str(func(c *Config) *string { return &c.LeaderDSN })},
	{key: "leader_kafka_timeout", see: []string{"operations.md#Scaling and high availability"}, group: GroupOperations, kind: kindDuration, def: "60s", help: "a leader that has had no Kafka acknowledgement for this long while events wait (or that cannot reach Kafka to start), while a standby whose Kafka answers waits, releases the leader lock, unconfirmed events replayed by the next leader, and competes again only after a pause (2 x leader_retry_interval + 5s, doubling while it keeps happening, up to 10m) and once its Kafka answers; a standby that has seen another instance lead tries the lock only while its Kafka answers a metadata request (alone, an instance leads and waits for Kafka); 0 disables both (at least 1s otherwise)",
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
	{key: "kafka.linger", see: []string{"operations.md#Broker cost and latency: `kafka.linger`"}, group: GroupKafka, kind: kindDuration, def: "15ms", help: "how long a partition's oldest record waits for company before its batch is sent (sooner when the batch is full, or when another partition's batch goes to the same broker: they share one request, as with the Java client; with source poll a batch goes at once, since its worker waits for it); longer means fewer, bigger requests and less broker CPU per event, shorter means lower latency; 0 sends at once",
		apply: duration(func(c *Config) *time.Duration { return &c.Kafka.Linger })},
	{key: "kafka.write_timeout", group: GroupKafka, kind: kindDuration, def: "10s", help: "timeout of one produce request before it is retried",
		apply: minDuration(time.Millisecond, func(c *Config) *time.Duration { return &c.Kafka.WriteTimeout })},
	{key: "kafka.compression", group: GroupKafka, kind: choices("none", "gzip", "snappy", "lz4", "zstd"), def: "none", help: "none, gzip, snappy, lz4 or zstd",
		apply: oneOf(func(c *Config) *string { return &c.Kafka.Compression }, "none", "gzip", "snappy", "lz4", "zstd")},
	{key: "kafka.idempotence", group: GroupKafka, kind: choices("auto", "on", "off"), def: "auto", help: "idempotent producer (the broker drops a retried batch it already wrote, so a request that timed out after the broker wrote it is not written twice): auto (on, or off with a warning when the broker denies IDEMPOTENT_WRITE), on (a denial stops the start) or off",
		apply: oneOf(func(c *Config) *string { return &c.Kafka.Idempotence }, "auto", "on", "off")},
	{key: "kafka.auto_create_topics", see: []string{"operations.md#A topic is missing or not authorized"}, group: GroupKafka, kind: kindBool, def: "false", help: "ask the brokers to create a missing event topic (where auto.create.topics.enable lets them); off, a missing topic stalls the relay, loudly (outbox_relay_topic_unavailable, /readyz), until it is created, and a row that invents an aggregate type creates nothing; the dead-letter topic is created when missing either way",
		apply: boolean(func(c *Config) *bool { return &c.Kafka.AutoCreateTopics })},
	{key: "kafka.client_id", group: GroupKafka, kind: kindString, def: "outbox-relay", help: "Kafka client id",
		apply: str(func(c *Config) *string { return &c.Kafka.ClientID })},
	{key: "kafka.tls.enabled", see: []string{"operations.md#Kafka TLS and SASL"}, group: GroupKafka, kind: kindBool, def: "false", help: "connect to the brokers with TLS",
		apply: boolean(func(c *Config) *bool { return &c.Kafka.TLS.Enabled })},
	{key: "kafka.tls.ca_file", group: GroupKafka, kind: kindString, help: "PEM CA bundle to verify the brokers (default: system roots)",
		apply: str(func(c *Config) *string { return &c.Kafka.TLS.CAFile })},
	{key: "kafka.tls.cert_file", group: GroupKafka, kind: kindString, help: "PEM client certificate for mutual TLS",
		apply: str(func(c *Config) *string { return &c.Kafka.TLS.CertFile })},
	{key: "kafka.tls.key_file", group: GroupKafka, kind: kindString, help: "PEM client key for mutual TLS",
		apply: str(func(c *Config) *string { return &c.Kafka.TLS.KeyFile })},
	{key: "kafka.tls.insecure_skip_verify", group: GroupKafka, kind: kindBool, def: "false", help: "do not verify the brokers' certificates (testing only)",
		apply: boolean(func(c *Config) *bool { return &c.Kafka.TLS.InsecureSkipVerify })},
	{key: "kafka.sasl.mechanism", group: GroupKafka, kind: kind("PLAIN|SCRAM-SHA-256|SCRAM-SHA-512|OAUTHBEARER"), help: "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (kafka.sasl.oauthbearer.*); empty for none",
		apply: func(c *Config, v string) error {
			if v == "" {
				c.Kafka.SASL.Mechanism = ""
				return nil
			}
			return oneOf(func(c *Config) *string { return &c.Kafka.SASL.Mechanism }, "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")(c, v)
		}},
	{key: "kafka.sasl.username", group: GroupKafka, kind: kindString, help: "SASL user name",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.Username })},
	{key: "kafka.sasl.password", group: GroupKafka, kind: kindString, help: "SASL password", secret: true,
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.Password })},
	{key: "kafka.sasl.password_file", group: GroupKafka, kind: kindString, help: "file holding the SASL password (a mounted Secret), read for every connection, so a rotated password is used at the next reconnect; instead of kafka.sasl.password",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.PasswordFile })},
	{key: "kafka.sasl.oauthbearer.token_file", group: GroupKafka, kind: kindString, help: "OAUTHBEARER: file holding the bearer token (a JWT a sidecar or a mounted Secret keeps fresh), read for every connection; instead of kafka.sasl.oauthbearer.token_endpoint_url",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.OAuthBearer.TokenFile })},
	{key: "kafka.sasl.oauthbearer.token_endpoint_url", group: GroupKafka, kind: kindString, help: "OAUTHBEARER: the identity provider's OAuth token endpoint; the relay fetches tokens with the client-credentials grant and fetches anew after 80% of a token's lifetime",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.OAuthBearer.TokenEndpointURL })},
	{key: "kafka.sasl.oauthbearer.client_id", group: GroupKafka, kind: kindString, help: "OAUTHBEARER: the OAuth client id of the client-credentials grant",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.OAuthBearer.ClientID })},
	{key: "kafka.sasl.oauthbearer.client_secret_file", group: GroupKafka, kind: kindString, help: "OAUTHBEARER: file holding the OAuth client secret (a mounted Secret), read for every fetch of a token",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.OAuthBearer.ClientSecretFile })},
	{key: "kafka.sasl.oauthbearer.scope", group: GroupKafka, kind: kindString, help: "OAUTHBEARER: the scope asked of the token endpoint (space-separated); empty for the endpoint's default",
		apply: str(func(c *Config) *string { return &c.Kafka.SASL.OAuthBearer.Scope })},
}, cloudEventsSettings...), registrySettings...) // the envelope's keys live beside it (cloudevents.go), the registry's too (registry.go)

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
