package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
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
)

// loadConfig parses a subcommand's flags and loads its configuration.
// Only run contacts Kafka; the other subcommands do not require kafka_brokers.
func loadConfig(name string, args []string, stderr io.Writer) (*config.Config, error) {
	fs := flag.NewFlagSet("outbox-relay "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	loader := config.NewLoader(fs, nil)
	if name != "run" {
		loader.WithoutKafka()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outbox-relay %s: unexpected argument %q\n", name, fs.Arg(0))
		return nil, errUsage
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
	for key, path := range map[string]string{"pg_password_file": cfg.PGPasswordFile, "kafka.sasl.password_file": cfg.Kafka.SASL.PasswordFile} {
		if path == "" {
			continue
		}
		if pw, err := credentials.ReadSecret(key, path); err == nil {
			out = append(out, pw)
		}
	}
	return out
}

// pollColumns is the decoder's view of the mapped columns.
func pollColumns(c *config.Config) decoder.Columns {
	return decoder.Columns{
		ID: c.Columns.ID, AggregateType: c.Columns.AggregateType, AggregateID: c.Columns.AggregateID,
		EventType: c.Columns.EventType, Payload: c.Columns.Payload, Headers: c.Columns.Headers,
		AggregateVersion: c.Columns.AggregateVersion,
	}
}

// relayConfig maps the loaded settings onto the pipeline's packages.
func relayConfig(c *config.Config) (relay.Config, error) {
	cols := pollColumns(c)
	var extraCols, extraHeaders []string
	for _, e := range c.ExtraHeaders {
		col, header, ok := strings.Cut(e, ":")
		if !ok {
			header = col
		}
		extraCols = append(extraCols, col)
		extraHeaders = append(extraHeaders, header)
	}
	required := []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload}
	if cols.Headers != "" {
		required = append(required, cols.Headers)
	}
	if cols.AggregateVersion != "" {
		required = append(required, cols.AggregateVersion)
	}
	required = append(required, extraCols...)

	// The password and certificate files are read once now, so a missing one ends the start naming
	// its key, and again for every connection.
	if c.PGPasswordFile != "" {
		if _, err := credentials.ReadSecret("pg_password_file", c.PGPasswordFile); err != nil {
			return relay.Config{}, err
		}
	}
	tlsCfg, err := tlsConfig(c.Kafka.TLS)
	if err != nil {
		return relay.Config{}, err
	}
	mech, err := saslMechanism(c.Kafka.SASL)
	if err != nil {
		return relay.Config{}, err
	}
	var backfill *relay.Backfill
	if c.Backfill {
		backfill = &relay.Backfill{Since: c.BackfillFrom(time.Now()), CreatedColumn: c.Columns.CreatedAt, Where: c.BackfillWhere,
			OrderColumn: c.BackfillOrder}
	}
	var pollCfg *poll.Config
	if c.Source == "poll" {
		pollCfg = &poll.Config{
			DSN: c.PGDSN, PasswordFile: c.PGPasswordFile, Schema: c.Schema, Table: c.Table, Columns: cols, Extra: extraCols, CreatedColumn: c.Columns.CreatedAt,
			BatchSize: c.PollBatchSize, Interval: c.PollInterval, MaxAttempts: c.PollMaxAttempts, RetryBackoff: c.PollRetryBackoff,
			Workers: c.PollWorkers, StatsInterval: c.SlotPollInterval,
		}
	}
	return relay.Config{
		Poll:     pollCfg,
		Backfill: backfill,
		Replication: replication.Config{
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
		},
		Decoder: decoder.Config{Schema: c.Schema, Table: c.Table, Columns: cols, Extra: extraCols},
		Sink: sink.Config{
			Brokers:         c.KafkaBrokers,
			TopicTemplate:   c.TopicTemplate,
			BuiltinHeaders:  c.BuiltinHeaders,
			ExtraHeaders:    extraHeaders,
			ValueEncoding:   sink.ValueEncoding(c.ValueEncoding),
			KeyEncoding:     sink.ValueEncoding(c.KeyEncoding),
			MaxMessageBytes: c.MaxMessageBytes,
			BatchSize:       c.Kafka.BatchSize,
			Linger:          linger(c.Kafka.Linger),
			WriteTimeout:    c.Kafka.WriteTimeout,
			MaxInFlight:     c.MaxInFlight,
			MaxInFlightSize: c.MaxInFlightBytes,
			Compression:     compression(c.Kafka.Compression),
			Policy:          sink.Policy(c.OnFailure),
			DeadLetterTopic: c.DeadLetterTopic,
			TLS:             tlsCfg,
			SASL:            mech,
			ClientID:        c.Kafka.ClientID,
			Transactions:    transactions(c),
			Idempotence:     sink.Idempotence(c.Kafka.Idempotence),
		},
		ShutdownTimeout:   c.ShutdownTimeout,
		HeartbeatInterval: c.HeartbeatInterval,
	}, nil
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
		Password: c.Password, PasswordFile: c.PasswordFile})
}
