package config_test

import (
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
