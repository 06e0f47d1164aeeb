package config_test

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/config"
)

func TestMultiHostDSNs(t *testing.T) {
	tests := []struct {
		name string
		dsn  string
		ok   bool
	}{
		{"a URL with two hosts and target_session_attrs=read-write loads",
			"postgres://relay:s3cret@db-a:5432,db-b:5433/app?target_session_attrs=read-write", true},
		{"a URL with two hosts and no ports loads", "postgres://relay:s3cret@db-a,db-b/app?target_session_attrs=primary", true},
		{"a URL with two hosts, one with a port, loads", "postgres://relay:s3cret@db-a:5432,db-b/app?target_session_attrs=read-write", true},
		{"key=value with two hosts and target_session_attrs=read-write loads",
			"host=db-a,db-b port=5432,5433 user=relay password=s3cret dbname=app target_session_attrs=read-write", true},
		{"key=value with one host on two ports and target_session_attrs=primary loads",
			"host=db,db port=5432,5433 user=relay password=s3cret dbname=app target_session_attrs=primary", true},
		{"ports that do not match the hosts are refused without the password",
			"host=db port=5432,5433 user=relay password=s3cret dbname=app target_session_attrs=primary", false},
		{"a single host needs no target_session_attrs", "host=db user=relay password=s3cret dbname=app", true},
		{"a single host with sslmode=prefer (a fallback without TLS to the same server) needs none",
			"postgres://relay:s3cret@db/app?sslmode=prefer", true},
		{"a URL with two hosts and no target_session_attrs is refused", "postgres://relay:s3cret@db-a,db-b/app", false},
		{"key=value with two hosts and target_session_attrs=any is refused",
			"host=db-a,db-b user=relay password=s3cret dbname=app target_session_attrs=any", false},
		{"two hosts with target_session_attrs=prefer-standby are refused",
			"postgres://relay:s3cret@db-a,db-b/app?target_session_attrs=prefer-standby", false},
		{"an unknown target_session_attrs is refused", "host=db password=s3cret target_session_attrs=writable", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := load(t, "", with(required(), "OUTBOX_PG_DSN", tt.dsn))
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
				if c.PGDSN != tt.dsn {
					t.Fatalf("pg_dsn = %q, want %q", c.PGDSN, tt.dsn)
				}
				return
			}
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			if !strings.Contains(msg, "pg_dsn") {
				t.Fatalf("error %q does not name pg_dsn", msg)
			}
			if strings.Contains(msg, "s3cret") {
				t.Fatalf("error %q shows the password", msg)
			}
		})
	}
}

func TestRedactDSNWithSeveralHosts(t *testing.T) {
	tests := []struct {
		name, dsn, want string
	}{
		{"the password of a multi-host URL is hidden and the hosts kept",
			"postgres://relay:s3cret@db-a:5432,db-b:5433/app?target_session_attrs=read-write",
			"postgres://relay:xxxxx@db-a:5432,db-b:5433/app?target_session_attrs=read-write"},
		{"a multi-host URL's password parameter is hidden",
			"postgresql://relay@db-a,db-b/app?password=s3cret",
			"postgresql://relay@db-a,db-b/app?password=xxxxx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := config.RedactDSN(tt.dsn); got != tt.want {
				t.Fatalf("RedactDSN = %q, want %q", got, tt.want)
			}
			if got := (&config.Config{PGDSN: tt.dsn}).Secrets(); len(got) != 1 || got[0] != "s3cret" {
				t.Fatalf("Secrets = %q, want the password", got)
			}
		})
	}
}
