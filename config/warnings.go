package config

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// securityWarnings lists what the configuration exposes without being wrong: a secret on the
// command line (any user of the machine reads it in ps or /proc/<pid>/cmdline), a PostgreSQL
// connection over the network that does not verify the server (sslmode short of verify-full), and
// a SASL PLAIN password sent without TLS, a secret file other users may read. from says where
// each key's value came from.
func (c *Config) securityWarnings(from func(key string) string) []string {
	var out []string
	alternative := map[string]string{
		"pg_dsn":               "pg_password_file, or " + EnvName("pg_dsn"),
		"leader_dsn":           "pg_password_file, or " + EnvName("leader_dsn"),
		"failover_standby_dsn": "pg_password_file, or " + EnvName("failover_standby_dsn"),
		"kafka.sasl.password":  "kafka.sasl.password_file, or " + EnvName("kafka.sasl.password"),
	}
	for _, s := range settings {
		if !s.secret || !strings.HasPrefix(from(s.key), "--") {
			continue
		}
		var secret bool
		switch s.key {
		case "kafka.sasl.password":
			secret = c.Kafka.SASL.Password != ""
		case "pg_dsn":
			secret = dsnPassword(c.PGDSN) != "" || dsnSSLPassword(c.PGDSN) != ""
		case "leader_dsn":
			secret = dsnPassword(c.LeaderDSN) != "" || dsnSSLPassword(c.LeaderDSN) != ""
		case "failover_standby_dsn":
			secret = dsnPassword(c.FailoverStandbyDSN) != "" || dsnSSLPassword(c.FailoverStandbyDSN) != ""
		}
		if secret {
			out = append(out, fmt.Sprintf("config key %s holds a secret and was given on the command line (%s), where every user of the machine can read it (ps, /proc): use %s instead",
				s.key, from(s.key), alternative[s.key]))
		}
	}
	for key, dsn := range map[string]string{"pg_dsn": c.PGDSN, "leader_dsn": c.LeaderDSN, "failover_standby_dsn": c.FailoverStandbyDSN} {
		if w := sslModeWarning(key, dsn); w != "" {
			out = append(out, w)
		}
	}
	if strings.EqualFold(c.Kafka.SASL.Mechanism, "PLAIN") && !c.Kafka.TLS.Enabled {
		out = append(out, "config key kafka.sasl.mechanism is PLAIN and kafka.tls.enabled is false: the SASL password crosses the network as it is; enable TLS (kafka.tls.enabled) or use SCRAM-SHA-512")
	}
	if c.Kafka.SASL.Mechanism == "OAUTHBEARER" && !c.Kafka.TLS.Enabled {
		out = append(out, "config key kafka.sasl.mechanism is OAUTHBEARER and kafka.tls.enabled is false: the bearer token crosses the network as it is, and is a credential until it expires; enable TLS (kafka.tls.enabled)")
	}
	if u, err := url.Parse(c.Kafka.SASL.OAuthBearer.TokenEndpointURL); err == nil && u.Scheme == "http" && !localHost(u.Hostname()) {
		out = append(out, "config key kafka.sasl.oauthbearer.token_endpoint_url is http:// to another machine: the client secret and the tokens cross the network as they are; use https://")
	}
	for _, f := range []struct{ key, path string }{
		{"pg_password_file", c.PGPasswordFile},
		{"kafka.sasl.password_file", c.Kafka.SASL.PasswordFile},
		{"kafka.sasl.oauthbearer.token_file", c.Kafka.SASL.OAuthBearer.TokenFile},
		{"kafka.sasl.oauthbearer.client_secret_file", c.Kafka.SASL.OAuthBearer.ClientSecretFile},
		{"kafka.tls.key_file", c.Kafka.TLS.KeyFile},
	} {
		if w := secretFileWarning(f.key, f.path); w != "" {
			out = append(out, w)
		}
	}
	return out
}

// secretFileWarning warns of a secret file that users other than its owner and group may read or
// write (a Kubernetes Secret volume's default mode, 0644, is one). A file that cannot be read is
// left to the first connection, which says so.
func secretFileWarning(key, path string) string {
	if path == "" {
		return ""
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o007 == 0 {
		return ""
	}
	return fmt.Sprintf("config key %s names %s, whose mode %#o lets every user of the machine read it: chmod 0600 or 0440 (Kubernetes: the Secret volume's defaultMode 0440 with the pod's fsGroup, as deploy/kubernetes does)",
		key, path, fi.Mode().Perm())
}

var kvSSLMode = regexp.MustCompile(`(?:^|\s)sslmode\s*=\s*'?([a-z-]+)`)

// sslModeWarning warns of a DSN that reaches a server over the network without verifying it:
// sslmode disable, allow, prefer (libpq's default), require or verify-ca let whoever is on the path
// pose as the server (and, below require, read the traffic). Local connections (a Unix socket, a
// loopback address) are not warned about.
func sslModeWarning(key, dsn string) string {
	if dsn == "" {
		return ""
	}
	mode := "prefer"
	if isURL(dsn) {
		if u, _, err := parseURL(dsn); err == nil && u.Query().Get("sslmode") != "" {
			mode = u.Query().Get("sslmode")
		}
	} else if m := kvSSLMode.FindStringSubmatch(dsn); m != nil {
		mode = m[1]
	}
	if mode == "verify-full" {
		return ""
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "" // validate reports it
	}
	hosts := []string{cfg.Host}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	remote := false
	for _, h := range hosts {
		remote = remote || !localHost(h)
	}
	if !remote {
		return ""
	}
	return fmt.Sprintf("config key %s connects over the network with sslmode %s: the server is not verified, so whoever is on the path can pose as it; use sslmode=verify-full with sslrootcert (docs/operations.md, Security)", key, mode)
}

// localHost reports whether h is a Unix socket directory or a loopback address.
func localHost(h string) bool {
	if strings.HasPrefix(h, "/") || h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
