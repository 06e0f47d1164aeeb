package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/decoder"
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
	conn, err := pgx.Connect(ctx, cfg.PGDSN)
	if err != nil {
		return nil, scrubbed(cfg, fmt.Errorf("connect to PostgreSQL: %w", err))
	}
	return conn, nil
}

// scrubbed keeps cfg's secrets out of err: driver errors can quote connection parameters.
func scrubbed(cfg *config.Config, err error) error {
	if err == nil {
		return nil
	}
	return errors.New(config.Scrub(err.Error(), cfg.Secrets()...))
}

// relayConfig maps the loaded settings onto the pipeline's packages.
func relayConfig(c *config.Config) (relay.Config, error) {
	cols := decoder.Columns{
		ID: c.Columns.ID, AggregateType: c.Columns.AggregateType, AggregateID: c.Columns.AggregateID,
		EventType: c.Columns.EventType, Payload: c.Columns.Payload, Headers: c.Columns.Headers,
		Timestamp: c.Columns.Timestamp, TracingSpanContext: c.Columns.TracingSpanContext,
	}
	extraCols, extraHeaders, placements := extraColumns(c)
	required := []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload}
	for _, optional := range []string{cols.Headers, cols.Timestamp, cols.TracingSpanContext} {
		if optional != "" {
			required = append(required, optional)
		}
	}
	required = append(required, extraCols...)

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
	return relay.Config{
		Backfill: backfill,
		Replication: replication.Config{
			DSN:               c.PGDSN,
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
		},
		Decoder: decoderConfig(c, cols, extraCols),
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

			ExtraPlacement:          placements,
			TopicRegex:              c.TopicRegex,
			TopicReplacement:        c.TopicReplacement,
			TombstoneOnEmptyPayload: c.TombstoneOnEmptyPayload,
			PayloadField:            c.Columns.Payload,
		},
		OnUpdate:          c.OnUpdate,
		ShutdownTimeout:   c.ShutdownTimeout,
		HeartbeatInterval: c.HeartbeatInterval,
	}, nil
}

// extraColumns lists the further columns (or message members) that travel with an event: those of
// extra_headers (column[:header]) as headers, then those of extra_fields (column:placement[:alias]),
// each with the name it is sent under and its placement.
func extraColumns(c *config.Config) (cols, names []string, placements []sink.Placement) {
	for _, e := range c.ExtraHeaders {
		col, header, ok := strings.Cut(e, ":")
		if !ok {
			header = col
		}
		cols, names, placements = append(cols, col), append(names, header), append(placements, sink.PlaceHeader)
	}
	for _, f := range c.ExtraFields {
		parts := strings.Split(f, ":") // checked by config
		alias := parts[0]
		if len(parts) == 3 {
			alias = parts[2]
		}
		p := sink.PlaceHeaderOrNull // as Debezium's router: a NULL column is a header with a null value
		switch parts[1] {
		case "envelope":
			p = sink.PlaceEnvelope
		case "partition":
			p = sink.PlacePartition
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

func tlsConfig(c config.TLS) (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	out := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.InsecureSkipVerify}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("config key kafka.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("config key kafka.tls.ca_file: %s holds no PEM certificate", c.CAFile)
		}
		out.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("config keys kafka.tls.cert_file/key_file: %w", err)
		}
		out.Certificates = []tls.Certificate{cert}
	}
	return out, nil
}

func saslMechanism(c config.SASL) (sasl.Mechanism, error) {
	switch c.Mechanism {
	case "":
		return nil, nil
	case "PLAIN":
		return plain.Mechanism{Username: c.Username, Password: c.Password}, nil
	case "SCRAM-SHA-256", "SCRAM-SHA-512":
		algo := scram.SHA256
		if c.Mechanism == "SCRAM-SHA-512" {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, c.Username, c.Password)
		if err != nil {
			return nil, fmt.Errorf("config key kafka.sasl.mechanism: %w", err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("config key kafka.sasl.mechanism: unsupported %q", c.Mechanism)
}
