package config

import (
	"net/url"
	"strings"
)

// RedactDSN hides the password in a PostgreSQL connection string, in URL or key=value form, and
// the client key's passphrase (sslpassword).
func RedactDSN(dsn string) string {
	if isURL(dsn) {
		u, hosts, err := parseURL(dsn)
		if err != nil {
			return "<unparsable DSN>"
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		q := u.Query()
		for _, key := range urlSecrets {
			if q.Has(key) {
				q.Set(key, "xxxxx")
				u.RawQuery = q.Encode()
			}
		}
		return restoreHosts(u, hosts)
	}
	return kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
}

// urlSecrets are the query parameters of a URL DSN that hold secrets.
var urlSecrets = []string{"password", "sslpassword"}

// DSNHasSecret reports whether a connection string holds a password or a key passphrase.
func DSNHasSecret(dsn string) bool { return dsnPassword(dsn) != "" || dsnSSLPassword(dsn) != "" }

// Secrets returns the secret values of c, for scrubbing from error text that might quote them.
func (c *Config) Secrets() []string {
	var out []string
	for _, dsn := range []string{c.PGDSN, c.LeaderDSN, c.FailoverStandbyDSN, c.PrimaryDSN} {
		if pw := dsnPassword(dsn); pw != "" {
			out = append(out, pw)
		}
		if pw := dsnSSLPassword(dsn); pw != "" {
			out = append(out, pw)
		}
	}
	if c.Kafka.SASL.Password != "" {
		out = append(out, c.Kafka.SASL.Password)
	}
	return out
}

// Scrub replaces each secret in s.
func Scrub(s string, secrets ...string) string {
	for _, sec := range secrets {
		if len(sec) >= 3 { // shorter strings would redact ordinary words
			s = strings.ReplaceAll(s, sec, "xxxxx")
		}
	}
	return s
}
