package config

import (
	"net/url"
	"regexp"
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

// kvPassword matches password= and, as its suffix, sslpassword=.
var kvPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// urlSecrets are the query parameters of a URL DSN that hold secrets.
var urlSecrets = []string{"password", "sslpassword"}

// DSNHasSecret reports whether a connection string holds a password or a key passphrase.
func DSNHasSecret(dsn string) bool { return dsnPassword(dsn) != "" || dsnSSLPassword(dsn) != "" }

// Secrets returns the secret values of c, for scrubbing from error text that might quote them.
func (c *Config) Secrets() []string {
	var out []string
	for _, dsn := range []string{c.PGDSN, c.LeaderDSN, c.FailoverStandbyDSN} {
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

func dsnPassword(dsn string) string {
	if isURL(dsn) {
		u, _, err := parseURL(dsn)
		if err != nil {
			return ""
		}
		if pw, ok := u.User.Password(); ok {
			return pw
		}
		return u.Query().Get("password")
	}
	for _, m := range kvPassword.FindAllStringSubmatchIndex(dsn, -1) {
		if start := m[2]; start < 3 || dsn[start-3:start] != "ssl" { // password=, not sslpassword=
			return unquoteKV(dsn[m[4]:m[5]])
		}
	}
	return ""
}

// unquoteKV undoes libpq's quoting of a key=value value ('it\'s' is it's), so the secret matches
// what a server or driver might echo.
func unquoteKV(v string) string {
	if len(v) < 2 || v[0] != '\'' || v[len(v)-1] != '\'' {
		return v
	}
	v = v[1 : len(v)-1]
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// dsnSSLPassword is the sslpassword of a DSN (the client key's passphrase), or "".
func dsnSSLPassword(dsn string) string {
	if isURL(dsn) {
		u, _, err := parseURL(dsn)
		if err != nil {
			return ""
		}
		return u.Query().Get("sslpassword")
	}
	for _, m := range kvPassword.FindAllStringSubmatchIndex(dsn, -1) {
		if start := m[2]; start >= 3 && dsn[start-3:start] == "ssl" {
			return unquoteKV(dsn[m[4]:m[5]])
		}
	}
	return ""
}
