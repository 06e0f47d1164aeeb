package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/sink/record"
)

// validate checks values against each other and names where a bad one came from (from(key)).
// Each check covers one job's keys; every problem found is reported at once, so an operator
// fixes a configuration in one round.
func (c *Config) validate(from func(key string) string, needKafka, needPG bool) error {
	p := &problems{from: from}
	c.checkPostgres(p, needPG)
	c.checkSlot(p)
	c.checkKafka(p, needKafka)
	c.checkOutbox(p)
	c.checkRouting(p)
	c.checkCloudEvents(p)
	c.checkDelivery(p)
	c.checkLeadership(p)
	return joinErrors(p.errs)
}

// problems collects what validate finds, each one line naming the key and where its value came
// from.
type problems struct {
	from func(key string) string
	errs []error
}

// bad reports key's value as wrong, and why.
func (p *problems) bad(key, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("config key %s (from %s): %s", key, p.from(key), fmt.Sprintf(format, args...)))
}

// add reports a problem worded in full, for one that involves several keys.
func (p *problems) add(format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf(format, args...))
}

// checkPostgres checks the connection strings and where the PostgreSQL password is kept.
func (c *Config) checkPostgres(p *problems, needPG bool) {
	if c.PGDSN == "" && needPG {
		p.add("config key pg_dsn is required: set %s or --pg-dsn", EnvName("pg_dsn"))
	}
	if c.PGDSN != "" {
		if err := checkDSN(c.PGDSN); err != nil {
			p.bad("pg_dsn", "%v", err)
		}
	}
	if c.PGPasswordFile != "" && dsnPassword(c.LeaderDSN) != "" {
		p.add("config key pg_password_file (from %s) is set, and leader_dsn (from %s) holds a password too: keep the password in one place",
			p.from("pg_password_file"), p.from("leader_dsn"))
	}
	if c.PGPasswordFile != "" && dsnPassword(c.PGDSN) != "" {
		p.add("config key pg_password_file (from %s) is set, and pg_dsn (from %s) holds a password too: keep the password in one place",
			p.from("pg_password_file"), p.from("pg_dsn"))
	}
	if c.FailoverStandbyDSN != "" {
		// A standby is what it names, so checkDSN's demand for the writable server does not apply.
		if _, err := pgconn.ParseConfig(c.FailoverStandbyDSN); err != nil {
			p.bad("failover_standby_dsn", "%s", Scrub(err.Error(), dsnPassword(c.FailoverStandbyDSN)))
		}
	}
}

// checkSlot checks the replication slot's and publication's keys, which only source wal uses.
func (c *Config) checkSlot(p *problems) {
	for key, name := range map[string]string{"slot": c.Slot, "publication": c.Publication} {
		if !validIdent(name) {
			p.bad(key, "%q must be lower-case letters, digits and underscores, at most 63 characters", name)
		}
	}
	if c.StatusInterval < 100*time.Millisecond {
		p.bad("status_interval", "%s is too short (at least 100ms)", c.StatusInterval)
	}
	if c.FailoverStandbyDSN != "" && c.Source == "poll" {
		p.bad("failover_standby_dsn", "is set, but source (from %s) is poll: there is no slot to keep through a promotion", p.from("source"))
	}
	if c.OnSlotLost == "recover" && c.Source == "poll" {
		p.bad("on_slot_lost", "is recover, but source (from %s) is poll: there is no slot to lose", p.from("source"))
	}
	if c.SlotRecoveryMargin < 0 {
		p.bad("slot_recovery_margin", "is %s; want 0 (none) or more", c.SlotRecoveryMargin)
	}
}

// checkKafka checks the brokers and the connection's security.
func (c *Config) checkKafka(p *problems, needKafka bool) {
	if len(c.KafkaBrokers) == 0 && needKafka {
		p.add("config key kafka_brokers is required: set %s or --kafka-brokers", EnvName("kafka_brokers"))
	}
	for _, b := range c.KafkaBrokers {
		if _, port, ok := strings.Cut(b, ":"); !ok || port == "" {
			p.bad("kafka_brokers", "%q is not host:port", b)
		}
	}
	sasl := c.Kafka.SASL
	c.checkOAuthBearer(p)
	if sasl.Mechanism != "" && sasl.Mechanism != "OAUTHBEARER" && (sasl.Username == "" || sasl.Password == "" && sasl.PasswordFile == "") {
		p.add("config key kafka.sasl.mechanism is set, so kafka.sasl.username and kafka.sasl.password (or kafka.sasl.password_file) are required")
	}
	if sasl.Password != "" && sasl.PasswordFile != "" {
		p.add("config keys kafka.sasl.password (from %s) and kafka.sasl.password_file (from %s) are both set: keep the password in one place",
			p.from("kafka.sasl.password"), p.from("kafka.sasl.password_file"))
	}
	if (c.Kafka.TLS.CertFile == "") != (c.Kafka.TLS.KeyFile == "") {
		p.add("config keys kafka.tls.cert_file and kafka.tls.key_file go together: set both or neither")
	}
}

// checkOutbox checks the outbox's columns and shape against the source that reads it.
func (c *Config) checkOutbox(p *problems) {
	for key, col := range map[string]string{"columns.id": c.Columns.ID, "columns.aggregate_type": c.Columns.AggregateType,
		"columns.aggregate_id": c.Columns.AggregateID, "columns.event_type": c.Columns.EventType, "columns.payload": c.Columns.Payload} {
		if col == "" {
			p.bad(key, "must not be empty")
		}
	}
	if c.UsesMessages() {
		switch c.MessagesPrefix {
		case "":
			p.bad("messages_prefix", "must not be empty with outbox_shape %s", c.OutboxShape)
		case HeartbeatPrefix:
			p.bad("messages_prefix", "%q is the relay's heartbeat prefix; choose another", c.MessagesPrefix)
		}
	} else if c.PayloadEncoding != "json" {
		p.bad("payload_encoding", "applies to logical decoding messages only, and outbox_shape is %s: remove it or set outbox_shape to messages or both", c.OutboxShape)
	}
	if !c.UsesTable() {
		// Nothing is stored: a message exists only in the WAL, so there are no rows to backfill
		// or prune.
		nothing := "outbox_shape messages stores nothing (an event exists only in the WAL), so there is nothing to %s: remove it, or use outbox_shape both with an outbox table"
		if c.Backfill {
			p.bad("backfill", nothing, "backfill")
		}
		if c.BackfillSince != "" {
			p.bad("backfill_since", nothing, "backfill")
		}
		if c.BackfillWhere != "" {
			p.bad("backfill_where", nothing, "backfill")
		}
		if c.PruneInterval > 0 {
			p.bad("prune_interval", nothing, "prune")
		}
	}
	if c.Source == "poll" && c.UsesMessages() {
		p.bad("outbox_shape", "is %s, but source (from %s) is poll: logical decoding messages exist only in the WAL, so the poller cannot read them; use source: wal, or outbox_shape: table", c.OutboxShape, p.from("source"))
	}
}

// checkRouting checks how an event finds its topic, and which topics outbox rows may reach.
func (c *Config) checkRouting(p *problems) {
	if c.TopicTemplate == "" {
		p.bad("topic_template", "must not be empty")
	}
	// A row chooses its dead letter's key and value, and can make its event fail at will (a
	// refused topic, a malformed headers member): the dead-letter topic is written by rows too.
	if record.ReservedTopic(c.DeadLetterTopic, c.TopicDeny) {
		p.bad("dead_letter_topic", "%q starts with '_' or matches topic_deny: outbox rows choose what their dead letters hold, so it must be a topic they may write; choose another name", c.DeadLetterTopic)
	}
	if c.TopicRegex != "" && p.from("topic_template") != "default" && !strings.HasPrefix(p.from("topic_template"), "profile") {
		p.bad("topic_regex", "and topic_template (from %s) both route: set one", p.from("topic_template"))
	}
	c.checkRegistry(p)
	if c.ValueEncoding == "json-with-schema" {
		for _, f := range c.ExtraFields {
			if strings.Contains(f, ":envelope") {
				p.bad("value_encoding", "json-with-schema cannot carry envelope fields (extra_fields %q): use json-string or raw with them", f)
				break
			}
		}
	}
	if c.TopicRegex != "" {
		if _, err := record.NewTopicRegex(c.TopicRegex, c.TopicReplacement); err != nil {
			p.bad("topic_regex", "%v", err)
		}
	}
	if c.TopicRegex == "" && c.TopicRegexPassthrough {
		p.bad("topic_regex_passthrough", "applies with topic_regex only")
	}
	if len(c.TopicAllow) == 0 {
		if allow := record.DefaultTopicAllow(c.recordRouting()); len(allow) == 1 && allow[0] == "*" {
			route := "topic_template " + c.TopicTemplate
			if c.TopicRegex != "" {
				route = "topic_replacement " + c.TopicReplacement
			}
			p.bad("topic_allow", "must be set: %s starts with a placeholder, so any outbox row would choose its topic; list the topics rows may reach (e.g. orders.*,customers.*), or '*' for any name but the reserved ones", route)
		}
	}
	if c.TopicRegex == "" && p.from("topic_replacement") != "default" && c.TopicReplacement != record.DefaultTopicReplacement {
		p.bad("topic_replacement", "applies with topic_regex only; for a fixed pattern use topic_template")
	}
}

// checkDelivery checks the delivery mode's keys; exactly-once's have their own check.
func (c *Config) checkDelivery(p *problems) {
	if c.Delivery == DeliveryExactlyOnce {
		c.checkExactlyOnce(p)
	}
	if strings.TrimSpace(c.TransactionalID) != c.TransactionalID || len(c.TransactionalID) > 249 {
		p.bad("transactional_id", "%q must have no leading or trailing spaces and at most 249 characters", c.TransactionalID)
	}
	if err := validTopicName(c.PositionsTopic); err != nil {
		p.bad("positions_topic", "%v", err)
	}
}

// checkExactlyOnce checks what exactly-once cannot be combined with: what publishes outside
// Kafka transactions, a producer without idempotence, and a positions topic shared with events.
func (c *Config) checkExactlyOnce(p *problems) {
	if c.Source == "poll" {
		p.add("config key delivery (from %s) is exactly-once, but source (from %s) is poll: exactly-once records the replication slot's position in each Kafka transaction, and the poller has no such position; use source: wal, or delivery: at-least-once (with the idempotent producer a broker retry writes nothing twice; a crash between Kafka's acknowledgement and the row's mark publishes that batch again)",
			p.from("delivery"), p.from("source"))
	}
	if c.Backfill {
		p.add("config key backfill (from %s) cannot be used with delivery: exactly-once (from %s): the backfill publishes outside Kafka transactions, so a crash during it publishes rows twice. Start once with delivery: at-least-once and backfill: true (the slot ledger records that it completed), then restart with delivery: exactly-once and backfill: false",
			p.from("backfill"), p.from("delivery"))
	}
	if c.Kafka.Idempotence == "off" {
		p.add("config key kafka.idempotence (from %s) is off, but delivery: exactly-once (from %s) needs the idempotent producer (Kafka transactions are built on it): set kafka.idempotence to auto or on",
			p.from("kafka.idempotence"), p.from("delivery"))
	}
	// The positions partition and an event's (or dead letter's) partition of the same topic
	// would be numbered by one producer id and epoch twice from sequence 0: the broker takes
	// the second writer's first batch for a duplicate of the first's, acknowledges it and
	// writes nothing. A template with placeholders is checked per event (sink).
	if c.PositionsTopic == c.DeadLetterTopic {
		p.add("config key positions_topic (from %s) and dead_letter_topic (from %s) are both %q: the positions topic must hold positions only; choose another name for one of them",
			p.from("positions_topic"), p.from("dead_letter_topic"), c.PositionsTopic)
	}
	if c.TopicRegex == "" && c.PositionsTopic == c.TopicTemplate {
		p.add("config key positions_topic (from %s) and topic_template (from %s) are both %q: every event would go to the positions topic, which must hold positions only; choose another name for one of them",
			p.from("positions_topic"), p.from("topic_template"), c.PositionsTopic)
	}
	if c.TopicRegex != "" && c.PositionsTopic == c.TopicReplacement {
		p.add("config key positions_topic (from %s) and topic_replacement (from %s) are both %q: every event the topic regex matches would go to the positions topic, which must hold positions only; choose another name for one of them",
			p.from("positions_topic"), p.from("topic_replacement"), c.PositionsTopic)
	}
	if c.TransactionMaxEvents > c.MaxInFlight {
		p.add("config key transaction_max_events (from %s) is %d, more than max_in_flight_events (from %s), %d: events are acknowledged only once their Kafka transaction commits, so a transaction never holds more than max_in_flight_events; lower transaction_max_events or raise max_in_flight_events",
			p.from("transaction_max_events"), c.TransactionMaxEvents, p.from("max_in_flight_events"), c.MaxInFlight)
	}
}

// checkLeadership checks the leader lock's connection.
func (c *Config) checkLeadership(p *problems) {
	if c.LeaderDSN == "" {
		return
	}
	if !c.LeaderElection {
		p.bad("leader_dsn", "is set, but leader_election (from %s) is false: there is no leader lock to connect for; remove leader_dsn or turn leader_election on", p.from("leader_election"))
	}
	if err := checkDSN(c.LeaderDSN); err != nil {
		p.bad("leader_dsn", "%v", err)
	}
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

// checkOAuthBearer checks kafka.sasl.oauthbearer.*: one source of tokens, and the client
// credentials of a token endpoint.
func (c *Config) checkOAuthBearer(p *problems) {
	o := c.Kafka.SASL.OAuthBearer
	set := o != OAuthBearer{}
	if c.Kafka.SASL.Mechanism != "OAUTHBEARER" {
		if set {
			p.add("config keys kafka.sasl.oauthbearer.* are set but kafka.sasl.mechanism is %q: set it to OAUTHBEARER", c.Kafka.SASL.Mechanism)
		}
		return
	}
	switch {
	case o.TokenFile == "" && o.TokenEndpointURL == "":
		p.add("config key kafka.sasl.mechanism is OAUTHBEARER, so kafka.sasl.oauthbearer.token_file or kafka.sasl.oauthbearer.token_endpoint_url is required")
	case o.TokenFile != "" && o.TokenEndpointURL != "":
		p.add("config keys kafka.sasl.oauthbearer.token_file and kafka.sasl.oauthbearer.token_endpoint_url are both set: keep one source of tokens")
	case o.TokenEndpointURL != "" && (o.ClientID == "" || o.ClientSecretFile == ""):
		p.add("config key kafka.sasl.oauthbearer.token_endpoint_url is set, so kafka.sasl.oauthbearer.client_id and kafka.sasl.oauthbearer.client_secret_file are required")
	}
	if o.TokenEndpointURL != "" {
		if u, err := url.Parse(o.TokenEndpointURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			p.bad("kafka.sasl.oauthbearer.token_endpoint_url", "%q is not an http(s) URL", o.TokenEndpointURL)
		}
	}
	if c.Kafka.SASL.Username != "" || c.Kafka.SASL.Password != "" || c.Kafka.SASL.PasswordFile != "" {
		p.add("config key kafka.sasl.mechanism is OAUTHBEARER, which uses no kafka.sasl.username or password: remove them")
	}
}
