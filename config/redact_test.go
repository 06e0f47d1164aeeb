package config_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/config"
)

func TestRedactDSN(t *testing.T) {
	tests := []struct {
		name   string
		dsn    string
		want   string
		secret string // must not appear in the result
	}{
		{"a URL password is hidden", "postgres://relay:s3cret@db:5432/app?sslmode=require",
			"postgres://relay:xxxxx@db:5432/app?sslmode=require", "s3cret"},
		{"the postgresql scheme is recognised", "postgresql://relay:s3cret@db/app",
			"postgresql://relay:xxxxx@db/app", "s3cret"},
		{"a password query parameter is hidden", "postgres://relay@db/app?password=s3cret&sslmode=disable",
			"postgres://relay@db/app?password=xxxxx&sslmode=disable", "s3cret"},
		{"a password in both places is hidden twice", "postgres://relay:one1@db/app?password=two2",
			"postgres://relay:xxxxx@db/app?password=xxxxx", "two2"},
		{"a URL-encoded password is hidden", "postgres://relay:p%40ss%2Fword@db/app",
			"postgres://relay:xxxxx@db/app", "p%40ss"},
		{"a URL without a password is unchanged", "postgres://relay@db:5432/app", "postgres://relay@db:5432/app", ""},
		{"a URL with an empty password shows the mask", "postgres://relay:@db/app", "postgres://relay:xxxxx@db/app", ""},
		{"an unparsable URL is not echoed", "postgres://relay:s3cret@db/app%zz", "<unparsable DSN>", "s3cret"},
		{"an unquoted key=value password is hidden", "host=db user=relay password=s3cret dbname=app",
			"host=db user=relay password=xxxxx dbname=app", "s3cret"},
		{"a key=value password at the end is hidden", "host=db password=s3cret", "host=db password=xxxxx", "s3cret"},
		{"a key=value password with spaces around = is hidden", "host=db password = s3cret dbname=app",
			"host=db password = xxxxx dbname=app", "s3cret"},
		{"a quoted key=value password with spaces is hidden", "host=db password='s3 cr3t' dbname=app",
			"host=db password=xxxxx dbname=app", "cr3t"},
		{"a quoted key=value password with an escaped quote is hidden", `host=db password='it\'s s3cret' dbname=app`,
			"host=db password=xxxxx dbname=app", "s3cret"},
		{"a URL sslpassword is hidden", "postgres://relay@db/app?sslkey=/k.pem&sslpassword=k3ypass",
			"postgres://relay@db/app?sslkey=%2Fk.pem&sslpassword=xxxxx", "k3ypass"},
		{"a key=value sslpassword is hidden", "host=db sslkey=/k.pem sslpassword=k3ypass", "host=db sslkey=/k.pem sslpassword=xxxxx", "k3ypass"},
		{"a key=value DSN without a password is unchanged", "host=db user=relay dbname=app", "host=db user=relay dbname=app", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := config.RedactDSN(tt.dsn)
			if got != tt.want {
				t.Fatalf("RedactDSN(%q) = %q, want %q", tt.dsn, got, tt.want)
			}
			if tt.secret != "" && strings.Contains(got, tt.secret) {
				t.Fatalf("RedactDSN(%q) = %q shows %q", tt.dsn, got, tt.secret)
			}
		})
	}
}

func TestScrub(t *testing.T) {
	tests := []struct {
		name    string
		s       string
		secrets []string
		want    string
	}{
		{"a secret is replaced everywhere", "auth failed for s3cret (s3cret)", []string{"s3cret"}, "auth failed for xxxxx (xxxxx)"},
		{"several secrets are replaced", "a=one1 b=two2", []string{"one1", "two2"}, "a=xxxxx b=xxxxx"},
		{"secrets shorter than three characters are left alone", "a b ab", []string{"a", "ab"}, "a b ab"},
		{"a three-character secret is replaced", "pw is abc", []string{"abc"}, "pw is xxxxx"},
		{"no secrets leave the text alone", "nothing to hide", nil, "nothing to hide"},
		{"an empty secret is ignored", "text", []string{""}, "text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := config.Scrub(tt.s, tt.secrets...); got != tt.want {
				t.Fatalf("Scrub = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSecrets(t *testing.T) {
	tests := []struct {
		name string
		c    config.Config
		want []string
	}{
		{"a URL password", config.Config{PGDSN: "postgres://relay:s3cret@db/app"}, []string{"s3cret"}},
		{"a URL-encoded password is returned decoded", config.Config{PGDSN: "postgres://relay:p%40ss@db/app"}, []string{"p@ss"}},
		{"a password query parameter", config.Config{PGDSN: "postgres://relay@db/app?password=s3cret"}, []string{"s3cret"}},
		{"an unquoted key=value password", config.Config{PGDSN: "host=db password=s3cret user=relay"}, []string{"s3cret"}},
		{"a quoted key=value password", config.Config{PGDSN: "host=db password='s3 cret' user=relay"}, []string{"s3 cret"}},
		{"a quoted key=value password with escapes", config.Config{PGDSN: `host=db password='it\'s a \\ pw' user=relay`}, []string{`it's a \ pw`}},
		{"the SASL password", config.Config{PGDSN: "host=db", Kafka: config.Kafka{SASL: config.SASL{Password: "k4fka"}}}, []string{"k4fka"}},
		{"both passwords", config.Config{PGDSN: "postgres://relay:s3cret@db/app", Kafka: config.Kafka{SASL: config.SASL{Password: "k4fka"}}},
			[]string{"s3cret", "k4fka"}},
		{"a URL sslpassword", config.Config{PGDSN: "postgres://relay@db/app?sslpassword=k3ypass"}, []string{"k3ypass"}},
		{"a key=value sslpassword before the password", config.Config{PGDSN: "host=db sslpassword=k3ypass password=s3cret"}, []string{"s3cret", "k3ypass"}},
		{"no passwords", config.Config{PGDSN: "postgres://relay@db/app"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.Secrets(); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Secrets = %q, want %q", got, tt.want)
			}
		})
	}
	t.Run("scrubbing with the secrets hides a DSN's password", func(t *testing.T) {
		c := config.Config{PGDSN: "host=db password=s3cret"}
		msg := "connect to host=db password=s3cret failed"
		if got := config.Scrub(msg, c.Secrets()...); strings.Contains(got, "s3cret") {
			t.Fatalf("Scrub = %q", got)
		}
	})
}

func TestWhatTheConfigurationExposesIsWarnedAbout(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string // "" for no warning
	}{
		{"a DSN password given as a flag", nil, []string{"--pg-dsn=postgres://relay:s3cret@127.0.0.1/app"}, "pg_dsn holds a secret and was given on the command line (--pg-dsn)"},
		{"a SASL password given as a flag", map[string]string{"OUTBOX_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "OUTBOX_KAFKA_SASL_USERNAME": "u", "OUTBOX_KAFKA_TLS_ENABLED": "true"},
			[]string{"--kafka.sasl.password=s3cret"}, "kafka.sasl.password_file"},
		{"a DSN without a password given as a flag", nil, []string{"--pg-dsn=postgres://relay@127.0.0.1/app"}, ""},
		{"a password in the environment", map[string]string{"OUTBOX_PG_DSN": "postgres://relay:s3cret@127.0.0.1/app"}, nil, ""},
		{"a remote server with libpq's default sslmode", map[string]string{"OUTBOX_PG_DSN": "postgres://relay@db.example.com/app"}, nil, "pg_dsn connects over the network with sslmode prefer"},
		{"a remote server with sslmode require", map[string]string{"OUTBOX_PG_DSN": "host=db.example.com sslmode=require"}, nil, "sslmode require"},
		{"a remote server with sslmode verify-full", map[string]string{"OUTBOX_PG_DSN": "postgres://relay@db.example.com/app?sslmode=verify-full"}, nil, ""},
		{"a loopback server without TLS", map[string]string{"OUTBOX_PG_DSN": "postgres://relay@127.0.0.1/app?sslmode=disable"}, nil, ""},
		{"SASL PLAIN without TLS", map[string]string{"OUTBOX_KAFKA_SASL_MECHANISM": "PLAIN", "OUTBOX_KAFKA_SASL_USERNAME": "u", "OUTBOX_KAFKA_SASL_PASSWORD": "p4ss"}, nil, "PLAIN and kafka.tls.enabled is false"},
		{"OAUTHBEARER without TLS", map[string]string{"OUTBOX_KAFKA_SASL_MECHANISM": "OAUTHBEARER", "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_FILE": "/run/token"}, nil, "the bearer token crosses the network"},
		{"OAUTHBEARER from a token endpoint over plain HTTP", map[string]string{"OUTBOX_KAFKA_SASL_MECHANISM": "OAUTHBEARER", "OUTBOX_KAFKA_TLS_ENABLED": "true",
			"OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "http://idp.example.com/token", "OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "c",
			"OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE": "/run/secret"}, nil, "use https://"},
		{"OAUTHBEARER over TLS from an https token endpoint", map[string]string{"OUTBOX_KAFKA_SASL_MECHANISM": "OAUTHBEARER", "OUTBOX_KAFKA_TLS_ENABLED": "true",
			"OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "https://idp.example.com/token", "OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "c",
			"OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE": "/run/secret"}, nil, ""},
		{"SASL PLAIN over TLS", map[string]string{"OUTBOX_KAFKA_SASL_MECHANISM": "PLAIN", "OUTBOX_KAFKA_SASL_USERNAME": "u", "OUTBOX_KAFKA_SASL_PASSWORD": "p4ss", "OUTBOX_KAFKA_TLS_ENABLED": "true"}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"OUTBOX_PG_DSN": "postgres://relay@127.0.0.1/app", "OUTBOX_KAFKA_BROKERS": "127.0.0.1:9092"}
			for k, v := range tt.env {
				env[k] = v
			}
			fs := flag.NewFlagSet("run", flag.ContinueOnError)
			loader := config.NewLoader(fs, func(k string) string { return env[k] })
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			c, err := loader.Load()
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(c.Warnings, "\n")
			if tt.want == "" && len(c.Warnings) > 0 || tt.want != "" && !strings.Contains(all, tt.want) {
				t.Fatalf("warnings %q, want %q", c.Warnings, tt.want)
			}
			if strings.Contains(all, "s3cret") || strings.Contains(all, "p4ss") {
				t.Fatalf("a warning shows the secret: %q", all)
			}
		})
	}
}

func TestASecretFileOtherUsersMayReadIsWarnedAbout(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		mode os.FileMode
		warn bool
	}{
		{0o600, false},
		{0o440, false},
		{0o640, false},
		{0o644, true}, // a Kubernetes Secret volume's default
		{0o604, true},
		{0o666, true},
	} {
		t.Run(fmt.Sprintf("%#o", tt.mode), func(t *testing.T) {
			file := filepath.Join(dir, fmt.Sprintf("pg-password-%o", tt.mode))
			if err := os.WriteFile(file, []byte("s3cret"), tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, tt.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			env := map[string]string{"OUTBOX_PG_DSN": "postgres://relay@127.0.0.1/app", "OUTBOX_KAFKA_BROKERS": "127.0.0.1:9092",
				"OUTBOX_PG_PASSWORD_FILE": file}
			loader := config.NewLoader(flag.NewFlagSet("run", flag.ContinueOnError), func(k string) string { return env[k] })
			c, err := loader.Load()
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(c.Warnings, "\n")
			if got := strings.Contains(all, "pg_password_file names "+file); got != tt.warn {
				t.Fatalf("mode %#o: warnings %q, want a warning naming the file: %v", tt.mode, c.Warnings, tt.warn)
			}
			if strings.Contains(all, "s3cret") {
				t.Fatalf("a warning shows the secret: %q", all)
			}
		})
	}
}
