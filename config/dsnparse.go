package config

import (
	"net/url"
	"regexp"
	"strings"
)

// Reading a PostgreSQL connection string's parts, for checking (dsn.go) and redacting (redact.go)
// it: URL or libpq key=value form, with libpq's multi-host URLs and quoting.

// isURL reports whether dsn is in URL form rather than key=value.
func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// multiHost stands in for a URL's host list while net/url parses the rest: libpq's (and pgx's)
// multi-host form postgres://a:5432,b:5433/db is not a valid RFC 3986 authority.
const multiHost = "outbox-relay-multi-host"

// parseURL parses a postgres:// URL, also in the multi-host form; hosts is the URL's host list as
// written when it has several hosts ("" otherwise), which the returned URL then stands in for with
// multiHost (restoreHosts puts it back). The host list holds no secret.
func parseURL(dsn string) (u *url.URL, hosts string, err error) {
	scheme, rest, _ := strings.Cut(dsn, "://")
	// As in libpq, the user information ends at the last '@' before the path.
	authEnd := strings.IndexAny(rest, "/?")
	if authEnd < 0 {
		authEnd = len(rest)
	}
	hostStart := strings.LastIndexByte(rest[:authEnd], '@') + 1
	if list := rest[hostStart:authEnd]; strings.Contains(list, ",") {
		hosts = list
		dsn = scheme + "://" + rest[:hostStart] + multiHost + rest[authEnd:]
	}
	u, err = url.Parse(dsn)
	return u, hosts, err
}

// restoreHosts is u as text, with the host list parseURL took out put back.
func restoreHosts(u *url.URL, hosts string) string {
	s := u.String()
	if hosts == "" {
		return s
	}
	return strings.Replace(s, multiHost, hosts, 1)
}

// kvPassword matches password= and, as its suffix, sslpassword=.
var kvPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// dsnPassword is the password of a DSN, or "".
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
