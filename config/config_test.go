package config_test

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/config"
)

// load runs a Loader over args, a map-backed environment and, when yaml is not empty, a config file
// (whose path replaces "$FILE" in args, env values and the returned path).
func load(t *testing.T, yaml string, env map[string]string, args ...string) (*config.Config, string, error) {
	t.Helper()
	var file string
	if yaml != "" {
		file = filepath.Join(t.TempDir(), "relay.yaml")
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", file}, args...)
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := config.NewLoader(fs, func(name string) string { return env[name] })
	if err := fs.Parse(args); err != nil {
		t.Fatalf("flags %v: %v", args, err)
	}
	c, err := l.Load()
	return c, file, err
}

// required is the least environment that loads.
func required() map[string]string {
	return map[string]string{
		"OUTBOX_PG_DSN":        "postgres://relay@localhost:5432/app",
		"OUTBOX_KAFKA_BROKERS": "localhost:9092",
	}
}

func with(env map[string]string, kv ...string) map[string]string {
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return env
}

func TestDefaultsLoadWithOnlyTheRequiredKeys(t *testing.T) {
	c, _, err := load(t, "", required())
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"pg_dsn is taken from the environment", c.PGDSN, "postgres://relay@localhost:5432/app"},
		{"kafka_brokers is a list", c.KafkaBrokers, []string{"localhost:9092"}},
		{"slot", c.Slot, "outbox_relay"},
		{"publication", c.Publication, "outbox_relay"},
		{"the table's schema is public", c.Schema, "public"},
		{"the table is outbox_events", c.Table, "outbox_events"},
		{"create_slot", c.CreateSlot, true},
		{"create_publication", c.CreatePublication, true},
		{"columns.id", c.Columns.ID, "id"},
		{"columns.aggregate_type", c.Columns.AggregateType, "aggregate_type"},
		{"columns.aggregate_id", c.Columns.AggregateID, "aggregate_id"},
		{"columns.event_type", c.Columns.EventType, "event_type"},
		{"columns.payload", c.Columns.Payload, "payload"},
		{"columns.headers", c.Columns.Headers, "headers"},
		{"extra_headers is empty", len(c.ExtraHeaders), 0},
		{"topic_template", c.TopicTemplate, "outbox.event.{aggregate_type}"},
		{"on_failure", c.OnFailure, "dead-letter"},
		{"dead_letter_topic", c.DeadLetterTopic, "outbox.dead-letter"},
		{"status_interval", c.StatusInterval, time.Second},
		{"slot_busy_wait", c.SlotBusyWait, 30 * time.Second},
		{"shutdown_timeout", c.ShutdownTimeout, 30 * time.Second},
		{"max_in_flight_events", c.MaxInFlight, 10000},
		{"max_in_flight_bytes", c.MaxInFlightBytes, int64(64 << 20)},
		{"max_message_bytes", c.MaxMessageBytes, 1 << 20},
		{"heartbeat_interval", c.HeartbeatInterval, time.Duration(0)},
		{"outbox_shape is the table, as before messages existed", c.OutboxShape, "table"},
		{"messages_prefix", c.MessagesPrefix, "outbox"},
		{"payload_encoding", c.PayloadEncoding, "json"},
		{"metrics_addr", c.MetricsAddr, ""},
		{"log_level", c.LogLevel, "info"},
		{"log_format", c.LogFormat, "json"},
		{"kafka.batch_size", c.Kafka.BatchSize, 500},
		{"kafka.linger", c.Kafka.Linger, 15 * time.Millisecond},
		{"kafka.write_timeout", c.Kafka.WriteTimeout, 10 * time.Second},
		{"kafka.compression", c.Kafka.Compression, "none"},
		{"kafka.idempotence", c.Kafka.Idempotence, "auto"},
		{"kafka.client_id", c.Kafka.ClientID, "outbox-relay"},
		{"kafka.tls", c.Kafka.TLS, config.TLS{}},
		{"kafka.sasl", c.Kafka.SASL, config.SASL{}},
		{"delivery", c.Delivery, "at-least-once"},
		{"transactional_id is derived at start", c.TransactionalID, ""},
		{"transaction_interval", c.TransactionInterval, 100 * time.Millisecond},
		{"transaction_max_events", c.TransactionMaxEvents, 5000},
		{"positions_topic", c.PositionsTopic, "__outbox_relay_positions"},
		{"leader_dsn is empty: the lock uses pg_dsn", c.LeaderDSN, ""},
		{"leader_kafka_timeout", c.LeaderKafkaTimeout, time.Minute},
	}
	for _, tt := range checks {
		t.Run(tt.name+" has its default", func(t *testing.T) {
			if !reflect.DeepEqual(tt.got, tt.want) {
				t.Fatalf("got %#v, want %#v", tt.got, tt.want)
			}
		})
	}
}

func TestRequiredKeysAreNamed(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"without pg_dsn", map[string]string{"OUTBOX_KAFKA_BROKERS": "k:9092"}, []string{"pg_dsn", "OUTBOX_PG_DSN", "--pg-dsn"}},
		{"without kafka_brokers", map[string]string{"OUTBOX_PG_DSN": "host=db"}, []string{"kafka_brokers", "OUTBOX_KAFKA_BROKERS", "--kafka-brokers"}},
		{"with only commas for kafka_brokers", map[string]string{"OUTBOX_PG_DSN": "host=db", "OUTBOX_KAFKA_BROKERS": " , "}, []string{"kafka_brokers"}},
		{"without either", map[string]string{}, []string{"pg_dsn", "kafka_brokers"}},
	}
	for _, tt := range tests {
		t.Run(tt.name+" the error names the missing key", func(t *testing.T) {
			_, _, err := load(t, "", tt.env)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestPrecedenceIsFileThenEnvironmentThenFlags(t *testing.T) {
	const file = "slot: from_file\nmax_in_flight_events: 111\nkafka:\n  linger: 111ms\nkafka_brokers: [file:1]\n"
	type got struct {
		slot    string
		max     int
		linger  time.Duration
		brokers string
	}
	read := func(c *config.Config) got {
		return got{c.Slot, c.MaxInFlight, c.Kafka.Linger, strings.Join(c.KafkaBrokers, ",")}
	}
	tests := []struct {
		name string
		yaml string
		env  map[string]string
		args []string
		want got
	}{
		{"defaults apply when nothing is set", "", required(), nil,
			got{"outbox_relay", 10000, 15 * time.Millisecond, "localhost:9092"}},
		{"the file overrides the defaults", file, map[string]string{"OUTBOX_PG_DSN": "host=db"}, nil,
			got{"from_file", 111, 111 * time.Millisecond, "file:1"}},
		{"the environment overrides the file", file,
			map[string]string{"OUTBOX_PG_DSN": "host=db", "OUTBOX_SLOT": "from_env", "OUTBOX_MAX_IN_FLIGHT_EVENTS": "222",
				"OUTBOX_KAFKA_LINGER": "222ms", "OUTBOX_KAFKA_BROKERS": "env:1,env:2"}, nil,
			got{"from_env", 222, 222 * time.Millisecond, "env:1,env:2"}},
		{"flags override the environment and the file", file,
			map[string]string{"OUTBOX_PG_DSN": "host=db", "OUTBOX_SLOT": "from_env", "OUTBOX_MAX_IN_FLIGHT_EVENTS": "222",
				"OUTBOX_KAFKA_LINGER": "222ms", "OUTBOX_KAFKA_BROKERS": "env:1"},
			[]string{"--slot", "from_flag", "--max-in-flight-events=333", "--kafka.linger", "333ms", "--kafka-brokers", "flag:1, flag:2"},
			got{"from_flag", 333, 333 * time.Millisecond, "flag:1,flag:2"}},
		{"each key comes from the highest source that sets it", file,
			map[string]string{"OUTBOX_PG_DSN": "host=db", "OUTBOX_MAX_IN_FLIGHT_EVENTS": "222"},
			[]string{"--kafka.linger=333ms"},
			got{"from_file", 222, 333 * time.Millisecond, "file:1"}},
		{"an empty environment variable does not override the file", file,
			map[string]string{"OUTBOX_PG_DSN": "host=db", "OUTBOX_SLOT": ""}, nil,
			got{"from_file", 111, 111 * time.Millisecond, "file:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := load(t, tt.yaml, tt.env, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if g := read(c); g != tt.want {
				t.Fatalf("got %+v, want %+v", g, tt.want)
			}
		})
	}
}

func TestInvalidValuesNameTheKeyAndTheirSource(t *testing.T) {
	type source int
	const (
		file source = iota
		env
		flagged
	)
	tests := []struct {
		name  string
		key   string
		value string
		from  source
	}{
		{"a boolean that is not true or false", "create_slot", "maybe", env},
		{"a boolean from a flag", "create_publication", "yes please", flagged},
		{"a duration without a unit", "status_interval", "10", file},
		{"a negative duration", "shutdown_timeout", "-1s", env},
		// Zero would be taken for "not set" and replaced by the default (30 s for a stop).
		{"a zero shutdown timeout", "shutdown_timeout", "0s", flagged},
		{"a zero write timeout", "kafka.write_timeout", "0", file},
		{"a zero slot busy wait", "slot_busy_wait", "0s", env},
		{"a duration that is not one", "kafka.linger", "soon", flagged},
		{"a zero count", "max_in_flight_events", "0", env},
		{"a count that is not a number", "kafka.batch_size", "many", file},
		{"a size with an unknown unit", "max_in_flight_bytes", "64 parsecs", flagged},
		{"a fractional size", "max_in_flight_bytes", "1.5MiB", env},
		{"a size that overflows", "max_in_flight_bytes", "17179869185GiB", env},
		{"a message size over 1 GiB", "max_message_bytes", "2GiB", file},
		{"a zero message size", "max_message_bytes", "0", flagged},
		{"an unknown failure policy", "on_failure", "ignore", env},
		{"an unknown log level", "log_level", "verbose", flagged},
		{"an unknown log format", "log_format", "xml", file},
		{"an unknown compression", "kafka.compression", "brotli", env},
		{"an idempotence that is not auto, on or off", "kafka.idempotence", "yes", file},
		{"an unknown SASL mechanism", "kafka.sasl.mechanism", "GSSAPI", file},
		{"a table with two dots", "table", "a.b.c", flagged},
		{"a table with an empty schema", "table", ".outbox", env},
		{"a table with an empty name", "table", "app.", file},
		{"a slot name with capitals and a dash", "slot", "Bad-Slot", flagged},
		{"a publication name that is too long", "publication", strings.Repeat("p", 64), env},
		{"a broker without a port", "kafka_brokers", "kafka-1", flagged},
		{"a status interval that is too short", "status_interval", "10ms", env},
		{"an empty payload column", "columns.payload", "", file},
		{"an empty topic template", "topic_template", "", file},
		{"a malformed URL DSN", "pg_dsn", "postgres://user:secret@db/app%zz", env},
		{"a malformed failover standby DSN", "failover_standby_dsn", "postgres://user:secret@db2/app%zz", file},
		{"a malformed leader DSN", "leader_dsn", "postgres://user:secret@pooler/app%zz", file},
		{"a leader Kafka timeout under 1s", "leader_kafka_timeout", "500ms", env},
		{"a negative leader Kafka timeout", "leader_kafka_timeout", "-1s", flagged},
		{"an unknown delivery mode", "delivery", "at-most-once", file},
		{"a transaction interval under 10ms", "transaction_interval", "1ms", env},
		{"a zero transaction size", "transaction_max_events", "0", flagged},
		{"a positions topic with a slash", "positions_topic", "positions/a", env},
		{"a dead-letter topic in topic_deny (a row's failed event would land in Kafka Connect's configuration)", "dead_letter_topic", "connect-configs", file},
		{"a dead-letter topic starting with an underscore", "dead_letter_topic", "_schemas", env},
		{"a transactional id with a trailing space", "transactional_id", "relay-1 ", flagged},
		{"an unknown outbox shape", "outbox_shape", "queue", flagged},
		{"an unknown payload encoding", "payload_encoding", "hex", env},
		{"an extra field without a placement", "extra_fields", "tenant", flagged},
		{"an extra field with an unknown placement", "extra_fields", "tenant:body", env},
		{"two partition columns", "extra_fields", "a:partition,b:partition", file},
		{"a topic regex that does not compile", "topic_regex", "(unclosed", env},
		{"a topic regex whose replacement names a group it lacks", "topic_regex", "(?<a>.*)", flagged},
		{"an unknown on_update", "on_update", "ignore", env},
		{"an unknown value encoding", "value_encoding", "xml", env},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is rejected with the key and the source", func(t *testing.T) {
			e := required()
			var yaml, from string
			var args []string
			switch tt.from {
			case file:
				yaml = quoteYAML(tt.key, tt.value)
			case env:
				if tt.value == "" {
					t.Fatal("an empty environment variable means unset")
				}
				e[config.EnvName(tt.key)] = tt.value
				from = config.EnvName(tt.key)
			case flagged:
				args = []string{"--" + config.FlagName(tt.key) + "=" + tt.value}
				from = "--" + config.FlagName(tt.key)
			}
			c, path, err := load(t, yaml, e, args...)
			if err == nil {
				t.Fatalf("loaded %+v", c)
			}
			if tt.from == file {
				from = path
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.key) || !strings.Contains(msg, from) {
				t.Fatalf("error %q does not name key %s and source %s", msg, tt.key, from)
			}
			if (tt.key == "pg_dsn" || tt.key == "failover_standby_dsn") && strings.Contains(msg, "secret") {
				t.Fatalf("error %q shows the password", msg)
			}
		})
	}
}

// quoteYAML writes key: value as YAML, nesting dotted keys.
func quoteYAML(key, value string) string {
	parts := strings.Split(key, ".")
	var b strings.Builder
	for i, p := range parts[:len(parts)-1] {
		b.WriteString(strings.Repeat("  ", i) + p + ":\n")
	}
	b.WriteString(strings.Repeat("  ", len(parts)-1) + parts[len(parts)-1] + ": '" + strings.ReplaceAll(value, "'", "''") + "'\n")
	return b.String()
}

func TestConfigFile(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		check     func(t *testing.T, c *config.Config)
		wantError []string
	}{
		{"nested keys set dotted settings",
			"pg_dsn: host=db\nkafka_brokers: k:9092\nkafka:\n  batch_size: 42\n  sasl:\n    mechanism: scram-sha-512\n    username: relay\n    password: s3cret\n  tls:\n    enabled: true\ncolumns:\n  id: event_id\n",
			func(t *testing.T, c *config.Config) {
				if c.Kafka.BatchSize != 42 || c.Kafka.SASL != (config.SASL{Mechanism: "SCRAM-SHA-512", Username: "relay", Password: "s3cret"}) ||
					!c.Kafka.TLS.Enabled || c.Columns.ID != "event_id" {
					t.Fatalf("got %+v", c)
				}
			}, nil},
		{"dotted keys work at the top level too",
			"pg_dsn: host=db\nkafka_brokers: k:9092\nkafka.sasl.password: s3cret\nkafka.sasl.username: relay\nkafka.sasl.mechanism: PLAIN\n",
			func(t *testing.T, c *config.Config) {
				if c.Kafka.SASL.Password != "s3cret" || c.Kafka.SASL.Mechanism != "PLAIN" {
					t.Fatalf("got %+v", c.Kafka.SASL)
				}
			}, nil},
		{"a YAML list gives several brokers",
			"pg_dsn: host=db\nkafka_brokers:\n  - k1:9092\n  - k2:9092\n  - k3:9093\n",
			func(t *testing.T, c *config.Config) {
				if want := []string{"k1:9092", "k2:9092", "k3:9093"}; !reflect.DeepEqual(c.KafkaBrokers, want) {
					t.Fatalf("brokers %q, want %q", c.KafkaBrokers, want)
				}
			}, nil},
		{"a flow list gives several extra headers",
			"pg_dsn: host=db\nkafka_brokers: k:9092\nextra_headers: [trace_id, 'tenant:x-tenant']\n",
			func(t *testing.T, c *config.Config) {
				if want := []string{"trace_id", "tenant:x-tenant"}; !reflect.DeepEqual(c.ExtraHeaders, want) {
					t.Fatalf("extra headers %q, want %q", c.ExtraHeaders, want)
				}
			}, nil},
		{"a comma-separated string also gives several brokers",
			"pg_dsn: host=db\nkafka_brokers: 'k1:9092, k2:9092'\n",
			func(t *testing.T, c *config.Config) {
				if want := []string{"k1:9092", "k2:9092"}; !reflect.DeepEqual(c.KafkaBrokers, want) {
					t.Fatalf("brokers %q, want %q", c.KafkaBrokers, want)
				}
			}, nil},
		{"YAML booleans and numbers are read as their text",
			"pg_dsn: host=db\nkafka_brokers: k:9092\ncreate_slot: false\nmax_in_flight_events: 7\n",
			func(t *testing.T, c *config.Config) {
				if c.CreateSlot || c.MaxInFlight != 7 {
					t.Fatalf("create_slot %v, max_in_flight_events %d", c.CreateSlot, c.MaxInFlight)
				}
			}, nil},
		{"an unknown top-level key is rejected by name",
			"pg_dsn: host=db\nkafka_brokers: k:9092\nslots: s\n", nil, []string{"unknown key", "slots"}},
		{"an unknown nested key is rejected by its dotted name",
			"pg_dsn: host=db\nkafka_brokers: k:9092\nkafka:\n  sasl:\n    pasword: x\n", nil, []string{"unknown key", "kafka.sasl.pasword"}},
		{"a section given for a plain key is rejected",
			"pg_dsn: host=db\nkafka_brokers: k:9092\nslot:\n  name: s\n", nil, []string{"unknown key", "slot.name"}},
		{"malformed YAML is an error naming the file",
			"pg_dsn: [unclosed\n", nil, []string{"config file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, path, err := load(t, tt.yaml, nil)
			if tt.wantError != nil {
				if err == nil {
					t.Fatalf("loaded %+v", c)
				}
				for _, w := range append(tt.wantError, path) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
	t.Run("a missing file is an error", func(t *testing.T) {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		l := config.NewLoader(fs, func(string) string { return "" })
		missing := filepath.Join(t.TempDir(), "nope.yaml")
		if err := fs.Parse([]string{"--config", missing}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Load(); err == nil || !strings.Contains(err.Error(), "nope.yaml") {
			t.Fatalf("Load = %v, want an error naming the file", err)
		}
	})
}

func TestTable(t *testing.T) {
	tests := []struct {
		name          string
		value         string
		schema, table string
	}{
		{"a bare table is in the public schema", "outbox", "public", "outbox"},
		{"a qualified table keeps its schema", "app.outbox", "app", "outbox"},
		{"the default is public.outbox_events", "", "public", "outbox_events"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := required()
			if tt.value != "" {
				e["OUTBOX_TABLE"] = tt.value
			}
			c, _, err := load(t, "", e)
			if err != nil {
				t.Fatal(err)
			}
			if c.Schema != tt.schema || c.Table != tt.table {
				t.Fatalf("schema %q table %q, want %q %q", c.Schema, c.Table, tt.schema, tt.table)
			}
		})
	}
}

func TestCaseInsensitiveChoicesAreCanonical(t *testing.T) {
	c, _, err := load(t, "", with(required(), "OUTBOX_ON_FAILURE", "HALT", "OUTBOX_KAFKA_COMPRESSION", "ZSTD",
		"OUTBOX_LOG_LEVEL", "Debug", "OUTBOX_KAFKA_SASL_MECHANISM", "plain", "OUTBOX_KAFKA_SASL_USERNAME", "u",
		"OUTBOX_KAFKA_SASL_PASSWORD", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if c.OnFailure != "halt" || c.Kafka.Compression != "zstd" || c.LogLevel != "debug" || c.Kafka.SASL.Mechanism != "PLAIN" {
		t.Fatalf("got %q %q %q %q", c.OnFailure, c.Kafka.Compression, c.LogLevel, c.Kafka.SASL.Mechanism)
	}
}

func TestSizesAcceptUnits(t *testing.T) {
	tests := []struct {
		value string
		want  int64
	}{
		{"67108864", 67108864},
		{"64MiB", 64 << 20},
		{"64 MiB", 64 << 20},
		{"1MB", 1000 * 1000},
		{"2KiB", 2048},
		{"3KB", 3000},
		{"1GiB", 1 << 30},
		{"10B", 10},
	}
	for _, tt := range tests {
		t.Run(tt.value+" is understood", func(t *testing.T) {
			c, _, err := load(t, "", with(required(), "OUTBOX_MAX_IN_FLIGHT_BYTES", tt.value))
			if err != nil {
				t.Fatal(err)
			}
			if c.MaxInFlightBytes != tt.want {
				t.Fatalf("max_in_flight_bytes = %d, want %d", c.MaxInFlightBytes, tt.want)
			}
		})
	}
}

func TestCrossKeyChecks(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"a SASL mechanism needs a user name and password",
			with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "PLAIN", "OUTBOX_KAFKA_SASL_USERNAME", "u"), "kafka.sasl.password"},
		{"a SASL mechanism without a password names both places it may come from",
			with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "PLAIN", "OUTBOX_KAFKA_SASL_USERNAME", "u"), "kafka.sasl.password_file"},
		{"a SASL password in two places is refused",
			with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "PLAIN", "OUTBOX_KAFKA_SASL_USERNAME", "u",
				"OUTBOX_KAFKA_SASL_PASSWORD", "p", "OUTBOX_KAFKA_SASL_PASSWORD_FILE", "/run/secrets/kafka"), "kafka.sasl.password_file"},
		{"OAUTHBEARER needs a token file or a token endpoint",
			with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "OAUTHBEARER"), "kafka.sasl.oauthbearer.token_file or kafka.sasl.oauthbearer.token_endpoint_url is required"},
		{"OAUTHBEARER with both a token file and a token endpoint is refused",
			with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "OAUTHBEARER", "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_FILE", "/run/token",
				"OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL", "https://idp/token"), "keep one source of tokens"},
		{"a token endpoint needs the client id and the secret file",
			with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "OAUTHBEARER", "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL", "https://idp/token"),
			"kafka.sasl.oauthbearer.client_id and kafka.sasl.oauthbearer.client_secret_file are required"},
		{"a token endpoint that is not an http(s) URL is refused",
			with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "OAUTHBEARER", "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL", "idp:443/token",
				"OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "c", "OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE", "/run/secret"), "not an http(s) URL"},
		{"OAUTHBEARER keys without the mechanism are refused",
			with(required(), "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_FILE", "/run/token"), "set it to OAUTHBEARER"},
		{"OAUTHBEARER with a SASL password is refused",
			with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "OAUTHBEARER", "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_FILE", "/run/token",
				"OUTBOX_KAFKA_SASL_PASSWORD", "p"), "uses no kafka.sasl.username or password"},
		{"a PostgreSQL password in pg_dsn and in a file is refused",
			with(required(), "OUTBOX_PG_DSN", "postgres://relay:in-dsn@db/app", "OUTBOX_PG_PASSWORD_FILE", "/run/secrets/pg"), "pg_password_file"},
		{"a PostgreSQL password in leader_dsn and in a file is refused",
			with(required(), "OUTBOX_LEADER_DSN", "postgres://relay:in-dsn@pooler/app", "OUTBOX_PG_PASSWORD_FILE", "/run/secrets/pg"), "leader_dsn (from OUTBOX_LEADER_DSN) holds a password too"},
		{"a leader DSN without the election has no lock to connect for",
			with(required(), "OUTBOX_LEADER_DSN", "postgres://relay@pooler/app", "OUTBOX_LEADER_ELECTION", "false"), "leader_dsn (from OUTBOX_LEADER_DSN): is set, but leader_election"},
		{"a client certificate needs its key",
			with(required(), "OUTBOX_KAFKA_TLS_CERT_FILE", "/tls/cert.pem"), "kafka.tls.key_file"},
		{"a client key needs its certificate",
			with(required(), "OUTBOX_KAFKA_TLS_KEY_FILE", "/tls/key.pem"), "kafka.tls.cert_file"},
		{"the heartbeat's prefix is not an outbox prefix",
			with(required(), "OUTBOX_OUTBOX_SHAPE", "messages", "OUTBOX_MESSAGES_PREFIX", "outbox-relay-heartbeat"), "messages_prefix"},
		{"payload_encoding base64 without messages does nothing, so it is refused",
			with(required(), "OUTBOX_PAYLOAD_ENCODING", "base64"), "payload_encoding (from OUTBOX_PAYLOAD_ENCODING): applies to logical decoding messages only"},
		{"messages only: there is nothing to backfill",
			with(required(), "OUTBOX_OUTBOX_SHAPE", "messages", "OUTBOX_BACKFILL", "true"), "backfill (from OUTBOX_BACKFILL): outbox_shape messages stores nothing"},
		{"messages only: backfill_since is refused too",
			with(required(), "OUTBOX_OUTBOX_SHAPE", "messages", "OUTBOX_BACKFILL_SINCE", "24h"), "backfill_since"},
		{"messages only: backfill_where is refused too",
			with(required(), "OUTBOX_OUTBOX_SHAPE", "messages", "OUTBOX_BACKFILL_WHERE", "true"), "backfill_where"},
		{"a topic regex and a topic template both route",
			with(required(), "OUTBOX_TOPIC_REGEX", "(?<routedByValue>.*)", "OUTBOX_TOPIC_TEMPLATE", "x.{aggregate_type}"), "topic_regex (from OUTBOX_TOPIC_REGEX): and topic_template (from OUTBOX_TOPIC_TEMPLATE) both route"},
		{"a topic replacement without a regex does nothing, so it is refused",
			with(required(), "OUTBOX_TOPIC_REPLACEMENT", "x.${routedByValue}"), "topic_replacement"},
		{"a template that starts with the aggregate type needs an allowlist",
			with(required(), "OUTBOX_TOPIC_TEMPLATE", "{aggregate_type}"), "topic_allow (from default): must be set: topic_template {aggregate_type} starts with a placeholder"},
		{"a replacement that starts with a group needs an allowlist",
			with(required(), "OUTBOX_TOPIC_REGEX", "(?<t>.*)", "OUTBOX_TOPIC_REPLACEMENT", "${t}"), "topic_allow (from default): must be set: topic_replacement ${t}"},
		{"the regex passthrough without a regex does nothing, so it is refused",
			with(required(), "OUTBOX_TOPIC_REGEX_PASSTHROUGH", "true"), "topic_regex_passthrough"},
		{"an allowlist entry that is no topic name is refused",
			with(required(), "OUTBOX_TOPIC_ALLOW", "orders.*,bad name"), "topic_allow"},
		{"json-with-schema cannot carry envelope fields",
			with(required(), "OUTBOX_VALUE_ENCODING", "json-with-schema", "OUTBOX_EXTRA_FIELDS", "type:envelope"), "value_encoding"},
		{"messages only: there is nothing to prune",
			with(required(), "OUTBOX_OUTBOX_SHAPE", "messages", "OUTBOX_PRUNE_INTERVAL", "1h"), "prune_interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := load(t, "", tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

func TestPasswordsMayComeFromFiles(t *testing.T) {
	c, _, err := load(t, "", with(required(), "OUTBOX_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512", "OUTBOX_KAFKA_SASL_USERNAME", "relay",
		"OUTBOX_KAFKA_SASL_PASSWORD_FILE", "/run/secrets/kafka-password", "OUTBOX_PG_PASSWORD_FILE", "/run/secrets/pg-password"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.SASL.PasswordFile != "/run/secrets/kafka-password" || c.PGPasswordFile != "/run/secrets/pg-password" {
		t.Fatalf("password files %q and %q", c.Kafka.SASL.PasswordFile, c.PGPasswordFile)
	}
}

func TestOutboxShapes(t *testing.T) {
	tests := []struct {
		name             string
		env              map[string]string
		table, messages  bool
		prefix, encoding string
	}{
		{"the default reads the table only", required(), true, false, "outbox", "json"},
		{"messages only", with(required(), "OUTBOX_OUTBOX_SHAPE", "Messages"), false, true, "outbox", "json"},
		{"both, with a prefix and base64 payloads", with(required(), "OUTBOX_OUTBOX_SHAPE", "both", "OUTBOX_MESSAGES_PREFIX", "orders.outbox",
			"OUTBOX_PAYLOAD_ENCODING", "base64"), true, true, "orders.outbox", "base64"},
		{"both keeps the backfill of the table", with(required(), "OUTBOX_OUTBOX_SHAPE", "both", "OUTBOX_BACKFILL", "true"), true, true, "outbox", "json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := load(t, "", tt.env)
			if err != nil {
				t.Fatal(err)
			}
			if c.UsesTable() != tt.table || c.UsesMessages() != tt.messages || c.MessagesPrefix != tt.prefix || c.PayloadEncoding != tt.encoding {
				t.Errorf("table %t messages %t prefix %q encoding %q, want %t %t %q %q",
					c.UsesTable(), c.UsesMessages(), c.MessagesPrefix, c.PayloadEncoding, tt.table, tt.messages, tt.prefix, tt.encoding)
			}
		})
	}
}

func TestRouterOptions(t *testing.T) {
	c, _, err := load(t, "", with(required(), "OUTBOX_PROFILE", "debezium", "OUTBOX_TOPIC_REGEX", `(?<routedByValue>[a-z]+)_.*`,
		"OUTBOX_EXTRA_FIELDS", "type:envelope:eventType,partitionno:partition,tenant:header",
		"OUTBOX_COLUMNS_TIMESTAMP", "ts", "OUTBOX_COLUMNS_TRACING_SPAN_CONTEXT", "tracingspancontext",
		"OUTBOX_TOMBSTONE_ON_EMPTY_PAYLOAD", "true", "OUTBOX_ON_UPDATE", "fatal", "OUTBOX_VALUE_ENCODING", "json-expanded"))
	if err != nil {
		t.Fatal(err)
	}
	if c.TopicReplacement != "outbox.event.${routedByValue}" || c.TopicTemplate != "outbox.event.{aggregate_type}" || len(c.ExtraFields) != 3 ||
		c.Columns.Timestamp != "ts" || c.Columns.TracingSpanContext != "tracingspancontext" || !c.TombstoneOnEmptyPayload || c.OnUpdate != "fatal" {
		t.Errorf("loaded %+v", c)
	}
	b, _, err := load(t, "", with(required(), "OUTBOX_TOPIC_TEMPLATE", "{aggregate_type}", "OUTBOX_TOPIC_ALLOW", "orders.*, customers"))
	if err != nil || len(b.TopicAllow) != 2 || b.TopicAllow[1] != "customers" || len(b.TopicDeny) != 3 {
		t.Errorf("a bare template with an allowlist: %v, allow %q, deny %q", err, b.TopicAllow, b.TopicDeny)
	}
	d, _, err := load(t, "", required())
	if err != nil || d.OnUpdate != "warn" || d.TombstoneOnEmptyPayload || d.Columns.Timestamp != "" || d.TopicRegex != "" {
		t.Errorf("defaults %+v (%v): on_update warn, no tombstones, no timestamp column, no regex", d, err)
	}
}

func TestMessagesAreRefusedWithThePollingSource(t *testing.T) {
	for _, shape := range []string{"messages", "both"} {
		_, _, err := load(t, "", with(required(), "OUTBOX_SOURCE", "poll", "OUTBOX_OUTBOX_SHAPE", shape))
		if err == nil || !strings.Contains(err.Error(), "outbox_shape (from OUTBOX_OUTBOX_SHAPE)") || !strings.Contains(err.Error(), "source (from OUTBOX_SOURCE) is poll") {
			t.Errorf("outbox_shape %s with source poll: Load = %v, want an error naming both keys", shape, err)
		}
	}
	if _, _, err := load(t, "", with(required(), "OUTBOX_SOURCE", "poll", "OUTBOX_OUTBOX_SHAPE", "table")); err != nil {
		t.Errorf("outbox_shape table with source poll: %v", err)
	}
}

func TestMessagesNeedAPrefix(t *testing.T) {
	_, _, err := load(t, "", with(required(), "OUTBOX_OUTBOX_SHAPE", "both"), "--messages-prefix=")
	if err == nil || !strings.Contains(err.Error(), "messages_prefix (from --messages-prefix): must not be empty") {
		t.Fatalf("Load = %v, want an error naming messages_prefix", err)
	}
}

func TestNames(t *testing.T) {
	tests := []struct {
		key, env, flag string
	}{
		{"pg_dsn", "OUTBOX_PG_DSN", "pg-dsn"},
		{"max_in_flight_events", "OUTBOX_MAX_IN_FLIGHT_EVENTS", "max-in-flight-events"},
		{"kafka.sasl.password", "OUTBOX_KAFKA_SASL_PASSWORD", "kafka.sasl.password"},
		{"kafka.tls.ca_file", "OUTBOX_KAFKA_TLS_CA_FILE", "kafka.tls.ca-file"},
	}
	for _, tt := range tests {
		t.Run(tt.key+" has its environment variable and flag", func(t *testing.T) {
			if got := config.EnvName(tt.key); got != tt.env {
				t.Errorf("EnvName = %q, want %q", got, tt.env)
			}
			if got := config.FlagName(tt.key); got != tt.flag {
				t.Errorf("FlagName = %q, want %q", got, tt.flag)
			}
		})
	}
}

func TestACommandWithoutPostgresDoesNotNeedPgDSNButStillNeedsKafka(t *testing.T) {
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	env := map[string]string{"OUTBOX_KAFKA_BROKERS": "k:9092"}
	l := config.NewLoader(fs, func(name string) string { return env[name] }).WithoutPostgres()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if c, err := l.Load(); err != nil || c.KafkaBrokers[0] != "k:9092" {
		t.Fatalf("Load = %v, %v; want it to load without pg_dsn", c, err)
	}
	delete(env, "OUTBOX_KAFKA_BROKERS")
	if _, err := l.Load(); err == nil || !strings.Contains(err.Error(), "kafka_brokers") || strings.Contains(err.Error(), "pg_dsn") {
		t.Fatalf("Load without kafka_brokers: %v; want only kafka_brokers named", err)
	}
}

func TestExactlyOnceSettings(t *testing.T) {
	tests := []struct {
		name      string
		env       map[string]string
		args      []string
		wantError []string // empty: loads
	}{
		{"exactly-once loads with its defaults", with(required(), "OUTBOX_DELIVERY", "exactly-once"), nil, nil},
		{"the mode is matched without regard to case", with(required(), "OUTBOX_DELIVERY", "Exactly-Once"), nil, nil},
		{"every exactly-once key has a flag", required(),
			[]string{"--delivery=exactly-once", "--transactional-id=orders-relay", "--transaction-interval=250ms",
				"--transaction-max-events=500", "--positions-topic=relay.positions"}, nil},
		{"a backfill is refused, naming both keys and the way to do it", with(required(), "OUTBOX_DELIVERY", "exactly-once", "OUTBOX_BACKFILL", "true"), nil,
			[]string{"backfill", "delivery", "OUTBOX_BACKFILL", "at-least-once"}},
		{"a transaction larger than the in-flight window is refused", required(),
			[]string{"--delivery=exactly-once", "--transaction-max-events=50000"},
			[]string{"transaction_max_events", "max_in_flight_events", "--transaction-max-events"}},
		{"a transaction larger than a window set lower is refused", required(),
			[]string{"--delivery=exactly-once", "--transaction-max-events=20000", "--max-in-flight-events=15000"},
			[]string{"transaction_max_events", "max_in_flight_events", "--transaction-max-events", "--max-in-flight-events"}},
		{"the window check applies only to exactly-once", required(), []string{"--transaction-max-events=50000"}, nil},
		{"the idempotent producer cannot be turned off", with(required(), "OUTBOX_KAFKA_IDEMPOTENCE", "off"), []string{"--delivery=exactly-once"},
			[]string{"kafka.idempotence", "OUTBOX_KAFKA_IDEMPOTENCE", "delivery", "--delivery"}},
		{"polling has no slot position to record", required(), []string{"--delivery=exactly-once", "--source=poll"},
			[]string{"delivery", "source", "poll", "--source", "at-least-once"}},
		{"a positions topic that is the dead-letter topic is refused, naming both keys", required(),
			[]string{"--delivery=exactly-once", "--positions-topic=relay.dlq", "--dead-letter-topic=relay.dlq"},
			[]string{"positions_topic", "dead_letter_topic", "--dead-letter-topic", "relay.dlq"}},
		{"a positions topic that every event is routed to is refused, naming both keys", required(),
			[]string{"--delivery=exactly-once", "--positions-topic=orders", "--topic-template=orders"},
			[]string{"positions_topic", "topic_template", "--topic-template", "orders"}},
		{"the default positions topic as the dead-letter topic is refused too", required(),
			[]string{"--delivery=exactly-once", "--dead-letter-topic=__outbox_relay_positions"},
			[]string{"positions_topic", "dead_letter_topic"}},
		{"a positions topic that every event matching the topic regex goes to is refused, naming both keys", required(),
			[]string{"--delivery=exactly-once", "--positions-topic=orders", "--topic-regex=.*", "--topic-replacement=orders"},
			[]string{"positions_topic", "topic_replacement", "--topic-replacement", "orders"}},
		{"a positions topic that a template with placeholders may produce loads (checked per event)", required(),
			[]string{"--delivery=exactly-once", "--positions-topic=outbox.event.Order"}, nil},
		{"at-least-once writes no positions, so their topic may be anything", required(),
			[]string{"--positions-topic=relay.dlq", "--dead-letter-topic=relay.dlq"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := load(t, "", tt.env, tt.args...)
			if len(tt.wantError) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded %+v", c)
			}
			for _, w := range tt.wantError {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	c, _, err := load(t, "", required(), "--delivery=exactly-once", "--transactional-id=orders-relay",
		"--transaction-interval=250ms", "--transaction-max-events=500", "--positions-topic=relay.positions")
	if err != nil {
		t.Fatal(err)
	}
	if !c.ExactlyOnce() || c.TransactionalID != "orders-relay" || c.TransactionInterval != 250*time.Millisecond ||
		c.TransactionMaxEvents != 500 || c.PositionsTopic != "relay.positions" {
		t.Fatalf("flags not applied: %+v", c)
	}
}

// Exactly-once holds events until their Kafka transaction commits, so its in-flight window and
// its transactions are larger by default; a value set anywhere wins, and a transaction defaults to
// half the window (the sink's own cap: one fills while the one before commits).
func TestExactlyOnceWindowDefaults(t *testing.T) {
	tests := []struct {
		name              string
		args              []string
		inFlight, txnSize int
	}{
		{"at-least-once", nil, 10000, 5000},
		{"exactly-once", []string{"--delivery=exactly-once"}, 40000, 20000},
		{"exactly-once with a window set", []string{"--delivery=exactly-once", "--max-in-flight-events=20000"}, 20000, 10000},
		{"exactly-once with a larger window set", []string{"--delivery=exactly-once", "--max-in-flight-events=100000"}, 100000, 20000},
		{"exactly-once with a window of one", []string{"--delivery=exactly-once", "--max-in-flight-events=1"}, 1, 1},
		{"exactly-once with a transaction size set", []string{"--delivery=exactly-once", "--transaction-max-events=500"}, 40000, 500},
		{"at-least-once with a window set (its transaction size is unused)", []string{"--max-in-flight-events=20000"}, 20000, 10000},
		{"auto, said so", []string{"--delivery=exactly-once", "--max-in-flight-events=auto", "--transaction-max-events=AUTO"}, 40000, 20000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := load(t, "", required(), tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if c.MaxInFlight != tt.inFlight || c.TransactionMaxEvents != tt.txnSize {
				t.Errorf("max_in_flight_events %d, transaction_max_events %d; want %d, %d", c.MaxInFlight, c.TransactionMaxEvents, tt.inFlight, tt.txnSize)
			}
		})
	}
	c, _, err := load(t, "max_in_flight_events: 30000\n", with(required(), "OUTBOX_DELIVERY", "exactly-once"))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxInFlight != 30000 || c.TransactionMaxEvents != 15000 {
		t.Errorf("a window from the file: max_in_flight_events %d, transaction_max_events %d; want 30000 and 15000", c.MaxInFlight, c.TransactionMaxEvents)
	}
}

func TestLeaderKafkaTimeoutZeroTurnsTheHandoverOff(t *testing.T) {
	c, _, err := load(t, "", with(required(), "OUTBOX_LEADER_KAFKA_TIMEOUT", "0"))
	if err != nil {
		t.Fatal(err)
	}
	if c.LeaderKafkaTimeout != 0 {
		t.Fatalf("leader_kafka_timeout = %s, want 0 (off)", c.LeaderKafkaTimeout)
	}
}

func TestRegistryEncodingsNeedARegistry(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string // "" when valid
	}{
		{"avro values without a registry URL are refused naming the key",
			map[string]string{"OUTBOX_VALUE_ENCODING": "avro"}, "schema_registry.urls"},
		{"avro keys without a registry URL are refused naming the key",
			map[string]string{"OUTBOX_KEY_ENCODING": "avro"}, "schema_registry.urls"},
		{"frame-only mode with auto-registration is refused",
			map[string]string{"OUTBOX_VALUE_ENCODING": "avro", "OUTBOX_SCHEMA_REGISTRY_URLS": "http://r:8081", "OUTBOX_SCHEMA_REGISTRY_FRAME_ONLY": "bytes"}, "schema_registry.frame_only"},
		{"avro values with a registry are valid, registering what they infer by default",
			map[string]string{"OUTBOX_VALUE_ENCODING": "avro", "OUTBOX_KEY_ENCODING": "avro", "OUTBOX_SCHEMA_REGISTRY_URLS": "http://r:8081"}, ""},
		{"protobuf values without a registry URL are refused naming the key",
			map[string]string{"OUTBOX_VALUE_ENCODING": "protobuf"}, "schema_registry.urls"},
		{"json-schema values without a registry URL are refused naming the key",
			map[string]string{"OUTBOX_VALUE_ENCODING": "json-schema"}, "schema_registry.urls"},
		{"protobuf keys are refused (a key is an Avro string or JSON)",
			map[string]string{"OUTBOX_KEY_ENCODING": "protobuf", "OUTBOX_SCHEMA_REGISTRY_URLS": "http://r:8081"}, "key_encoding"},
		{"protobuf values with a registry are valid",
			map[string]string{"OUTBOX_VALUE_ENCODING": "protobuf", "OUTBOX_SCHEMA_REGISTRY_URLS": "http://r:8081"}, ""},
		{"a protobuf message name without strict protobuf values is refused",
			map[string]string{"OUTBOX_VALUE_ENCODING": "avro", "OUTBOX_SCHEMA_REGISTRY_URLS": "http://r:8081", "OUTBOX_SCHEMA_REGISTRY_PROTOBUF_MESSAGE": "shop.v1.Order"}, "schema_registry.protobuf_message"},
		{"a protobuf message name with auto-registration is refused",
			map[string]string{"OUTBOX_VALUE_ENCODING": "protobuf", "OUTBOX_SCHEMA_REGISTRY_URLS": "http://r:8081", "OUTBOX_SCHEMA_REGISTRY_PROTOBUF_MESSAGE": "shop.v1.Order"}, "schema_registry.protobuf_message"},
		{"json-schema values with a registry and avro keys are valid",
			map[string]string{"OUTBOX_VALUE_ENCODING": "json-schema", "OUTBOX_KEY_ENCODING": "avro", "OUTBOX_SCHEMA_REGISTRY_URLS": "http://r:8081"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := required()
			for k, v := range tt.env {
				env[k] = v
			}
			cfg, _, err := load(t, "", env)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !cfg.SchemaRegistry.AutoRegister || cfg.SchemaRegistry.SubjectStrategy != "topic" {
					t.Fatalf("defaults %+v", cfg.SchemaRegistry)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "config key "+tt.want) {
				t.Fatalf("error %v, want one naming %s", err, tt.want)
			}
		})
	}
}
