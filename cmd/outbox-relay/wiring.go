package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/credentials"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/poll"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// loadConfig parses a subcommand's flags and loads its configuration.
// Only run contacts Kafka; the other subcommands do not require kafka_brokers.
func loadConfig(name string, args []string, stderr io.Writer) (*config.Config, error) {
	fs, loader := newFlags(name, stderr)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	return loader.Load()
}

func newLogger(cfg *config.Config, stderr io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	var encoder zapcore.Encoder
	if cfg.LogFormat == "console" {
		enc.EncodeLevel = zapcore.CapitalLevelEncoder
		encoder = zapcore.NewConsoleEncoder(enc)
	} else {
		encoder = zapcore.NewJSONEncoder(enc)
	}
	core := zapcore.NewCore(encoder, zapcore.Lock(zapcore.AddSync(stderr)), level)
	// Sampling keeps a broker outage from flooding the log with identical retry lines.
	core = zapcore.NewSamplerWithOptions(core, 1e9, 5, 100)
	return zap.New(core), nil
}

// connect opens an ordinary connection for a one-shot subcommand.
func connect(ctx context.Context, cfg *config.Config) (*pgx.Conn, error) {
	conn, err := connectPostgres(ctx, cfg)
	if err != nil {
		return nil, scrubbed(cfg, err)
	}
	return conn, nil
}

func connectPostgres(ctx context.Context, cfg *config.Config) (*pgx.Conn, error) {
	conf, err := credentials.PostgresConfig(cfg.PGDSN, cfg.PGPasswordFile)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, conf)
	if err != nil {
		if line, ok := credentials.ExplainTLS(err, credentials.PostgresTLSKeys); ok {
			return nil, fmt.Errorf("connect to PostgreSQL: %s", line)
		}
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return conn, nil
}

// defaultTransactionalID asks PostgreSQL, with cfg's credentials, for the default transactional id.
func defaultTransactionalID(ctx context.Context, cfg *config.Config, log *zap.Logger) (string, error) {
	conf, err := credentials.PostgresConfig(cfg.PGDSN, cfg.PGPasswordFile)
	if err != nil {
		return "", err
	}
	return relay.TransactionalID(ctx, &conf.Config, cfg.Slot, log)
}

// scrubbed keeps cfg's secrets out of err: driver errors can quote connection parameters.
func scrubbed(cfg *config.Config, err error) error {
	if err == nil {
		return nil
	}
	return errors.New(config.Scrub(err.Error(), secrets(cfg)...))
}

// secrets are cfg's secret values, the passwords in the password files as they are now included.
func secrets(cfg *config.Config) []string {
	out := cfg.Secrets()
	for key, path := range map[string]string{"pg_password_file": cfg.PGPasswordFile, "kafka.sasl.password_file": cfg.Kafka.SASL.PasswordFile,
		"kafka.sasl.oauthbearer.token_file":         cfg.Kafka.SASL.OAuthBearer.TokenFile,
		"kafka.sasl.oauthbearer.client_secret_file": cfg.Kafka.SASL.OAuthBearer.ClientSecretFile} {
		if path == "" {
			continue
		}
		if pw, err := credentials.ReadSecret(key, path); err == nil {
			out = append(out, pw)
		}
	}
	return out
}

// eventColumns is the decoder's view of the mapped columns.
func eventColumns(c *config.Config) decoder.Columns {
	return decoder.Columns{
		ID: c.Columns.ID, AggregateType: c.Columns.AggregateType, AggregateID: c.Columns.AggregateID,
		EventType: c.Columns.EventType, Payload: c.Columns.Payload, Headers: c.Columns.Headers,
		AggregateVersion: c.Columns.AggregateVersion,
		Timestamp:        c.Columns.Timestamp, TracingSpanContext: c.Columns.TracingSpanContext,
	}
}

// relayConfig maps the loaded settings onto the pipeline's packages.
func relayConfig(c *config.Config) (relay.Config, error) {
	cols := eventColumns(c)
	extraCols, extraHeaders, placements := extraColumns(c)

	// The password and certificate files are read once now, so a missing one ends the start naming
	// its key, and again for every connection.
	if c.PGPasswordFile != "" {
		if _, err := credentials.ReadSecret("pg_password_file", c.PGPasswordFile); err != nil {
			return relay.Config{}, err
		}
	}
	sinkCfg, err := sinkConfig(c, extraHeaders, placements)
	if err != nil {
		return relay.Config{}, err
	}
	return relay.Config{
		Poll:              pollConfig(c, cols, extraCols),
		Backfill:          backfillConfig(c),
		Replication:       replicationConfig(c, decoder.Config{Columns: cols, Extra: extraCols}.RowColumns()),
		Recovery:          &relay.Recovery{Margin: c.SlotRecoveryMargin, CreatedColumn: c.Columns.CreatedAt, OrderColumn: c.BackfillOrder},
		Decoder:           decoderConfig(c, cols, extraCols),
		Sink:              sinkCfg,
		OnUpdate:          c.OnUpdate,
		ShutdownTimeout:   c.ShutdownTimeout,
		HeartbeatInterval: c.HeartbeatInterval,
	}, nil
}

// backfillConfig is the backfill of the rows written before the slot existed; nil without backfill.
func backfillConfig(c *config.Config) *relay.Backfill {
	if !c.Backfill {
		return nil
	}
	return &relay.Backfill{Since: c.BackfillFrom(time.Now()), CreatedColumn: c.Columns.CreatedAt, Where: c.BackfillWhere,
		OrderColumn: c.BackfillOrder}
}

// pollConfig is the polling source (source: poll); nil for the WAL.
func pollConfig(c *config.Config, cols decoder.Columns, extra []string) *poll.Config {
	if c.Source != "poll" {
		return nil
	}
	return &poll.Config{
		DSN: c.PGDSN, PasswordFile: c.PGPasswordFile, Schema: c.Schema, Table: c.Table, Columns: cols, Extra: extra, CreatedColumn: c.Columns.CreatedAt,
		BatchSize: c.PollBatchSize, Interval: c.PollInterval, MaxAttempts: c.PollMaxAttempts, RetryBackoff: c.PollRetryBackoff,
		Workers: c.PollWorkers, StatsInterval: c.SlotPollInterval,
	}
}

// replicationConfig is the slot, the publication and the stream; required are the outbox table's
// columns the relay reads.
func replicationConfig(c *config.Config, required []string) replication.Config {
	return replication.Config{
		DSN:               c.PGDSN,
		PasswordFile:      c.PGPasswordFile,
		Slot:              c.Slot,
		Publication:       c.Publication,
		Schema:            c.Schema,
		Table:             c.Table,
		Columns:           required,
		CreateSlot:        c.CreateSlot,
		CreatePublication: c.CreatePublication,
		StatusInterval:    c.StatusInterval,
		SlotBusyWait:      c.SlotBusyWait,
		Messages:          c.HeartbeatInterval > 0,
		Failover:          c.Failover,
		OnSlotLost:        c.OnSlotLost,
	}
}

// kafkaConnection is how every subcommand reaches Kafka: the brokers, TLS, SASL, client id and
// request timeout of the sink's client.
func kafkaConnection(c *config.Config) (sink.Config, error) {
	tlsCfg, err := tlsConfig(c.Kafka.TLS)
	if err != nil {
		return sink.Config{}, err
	}
	mech, err := saslMechanism(c.Kafka.SASL)
	if err != nil {
		return sink.Config{}, err
	}
	return sink.Config{Brokers: c.KafkaBrokers, TLS: tlsCfg, SASL: mech, ClientID: c.Kafka.ClientID, WriteTimeout: c.Kafka.WriteTimeout}, nil
}

// sinkConfig is the sink: kafkaConnection, how records are built and routed, batching, limits and
// the failure policy.
func sinkConfig(c *config.Config, extraHeaders []string, placements []record.Placement) (sink.Config, error) {
	s, err := kafkaConnection(c)
	if err != nil {
		return sink.Config{}, err
	}
	// Registry encodings: record builds the key and value raw, the sink frames them. The client
	// reports nothing (run swaps in one with metrics); every caller gets one, so nothing built
	// from this configuration publishes unframed.
	valueEnc, keyEnc := recordEncodings(c)
	if s.Serializer, _, err = newSerializer(c, nil, nil); err != nil {
		return sink.Config{}, err
	}
	s.Record = record.Options{
		TopicTemplate:           c.TopicTemplate,
		BuiltinHeaders:          c.BuiltinHeaders,
		ExtraHeaders:            extraHeaders,
		ValueEncoding:           valueEnc,
		KeyEncoding:             keyEnc,
		ExtraPlacement:          placements,
		TopicRegex:              c.TopicRegex,
		TopicReplacement:        c.TopicReplacement,
		TombstoneOnEmptyPayload: c.TombstoneOnEmptyPayload,
		CloudEvents:             c.RecordCloudEvents(),
		PayloadField:            c.Columns.Payload,
		TopicRegexPassthrough:   c.TopicRegexPassthrough,
		TopicAllow:              c.TopicAllow,
		// The positions topic is refused in every delivery mode: a position written by a row
		// would be trusted once exactly-once is turned on.
		TopicDeny: append(append([]string(nil), c.TopicDeny...), c.PositionsTopic),
	}
	s.MaxMessageBytes = c.MaxMessageBytes
	s.BatchSize = c.Kafka.BatchSize
	s.Linger = linger(c.Kafka.Linger)
	s.MaxInFlight = c.MaxInFlight
	s.MaxInFlightSize = c.MaxInFlightBytes
	s.Compression = compression(c.Kafka.Compression)
	s.Policy = sink.Policy(c.OnFailure)
	s.DeadLetterTopic = c.DeadLetterTopic
	s.Transactions = transactions(c)
	s.Idempotence = sink.Idempotence(c.Kafka.Idempotence)
	// Only on request: a row inventing aggregate types would otherwise create topics.
	s.NoAutoCreateTopics = !c.Kafka.AutoCreateTopics
	return s, nil
}

// transactions is the sink's exactly-once setting: nil for at-least-once. An empty ID is resolved
// by resolveTransactionalID before the relay is built.
func transactions(c *config.Config) *sink.Transactions {
	if !c.ExactlyOnce() {
		return nil
	}
	return &sink.Transactions{
		ID:             c.TransactionalID,
		Interval:       c.TransactionInterval,
		MaxEvents:      c.TransactionMaxEvents,
		PositionsTopic: c.PositionsTopic,
	}
}

// extraColumns lists the further columns (or message members) that travel with an event: those of
// extra_headers (column[:header]) as headers, then those of extra_fields (column:placement[:alias]),
// each with the name it is sent under and its placement.
func extraColumns(c *config.Config) (cols, names []string, placements []record.Placement) {
	for _, e := range c.ExtraHeaders {
		col, header, ok := strings.Cut(e, ":")
		if !ok {
			header = col
		}
		cols, names, placements = append(cols, col), append(names, header), append(placements, record.PlaceHeader)
	}
	for _, f := range c.ExtraFields {
		parts := strings.Split(f, ":") // checked by config
		alias := parts[0]
		if len(parts) == 3 {
			alias = parts[2]
		}
		p := record.PlaceHeaderOrNull // as Debezium's router: a NULL column is a header with a null value
		switch parts[1] {
		case "envelope":
			p = record.PlaceEnvelope
		case "partition":
			p = record.PlacePartition
		}
		cols, names, placements = append(cols, parts[0]), append(names, alias), append(placements, p)
	}
	return cols, names, placements
}

// decoderConfig says which outbox shapes become events: the table's rows, logical decoding
// messages with the prefix, or both.
func decoderConfig(c *config.Config, cols decoder.Columns, extra []string) decoder.Config {
	d := decoder.Config{Schema: c.Schema, Table: c.Table, Columns: cols, Extra: extra}
	if c.UsesMessages() {
		d.MessagePrefix = c.MessagesPrefix
		d.NoTable = !c.UsesTable()
		d.PayloadBase64 = c.PayloadEncoding == "base64"
	}
	return d
}

// linger maps the setting to the sink's convention, where zero means its default.
func linger(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func compression(name string) kafka.Compression {
	switch name {
	case "gzip":
		return kafka.Gzip
	case "snappy":
		return kafka.Snappy
	case "lz4":
		return kafka.Lz4
	case "zstd":
		return kafka.Zstd
	}
	return 0
}

// tlsConfig and saslMechanism are how every subcommand that talks to Kafka encrypts and
// authenticates: one construction (package credentials), which reads the client certificate and
// the password file again for every connection.
func tlsConfig(c config.TLS) (*tls.Config, error) {
	return credentials.KafkaTLS{Enabled: c.Enabled, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		InsecureSkipVerify: c.InsecureSkipVerify}.Config()
}

func saslMechanism(c config.SASL) (sasl.Mechanism, error) {
	return credentials.KafkaMechanism(credentials.KafkaSASL{Mechanism: c.Mechanism, Username: c.Username,
		Password: c.Password, PasswordFile: c.PasswordFile, OAuthBearer: credentials.OAuthBearer{
			TokenFile: c.OAuthBearer.TokenFile, TokenEndpointURL: c.OAuthBearer.TokenEndpointURL,
			ClientID: c.OAuthBearer.ClientID, ClientSecretFile: c.OAuthBearer.ClientSecretFile, Scope: c.OAuthBearer.Scope}})
}
