package config

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

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

// checkHosts refuses a DSN that lists several servers without asking for the writable one
// (target_session_attrs=read-write or primary). Otherwise each connection goes to the first server
// that answers, which may be a standby: the leader lock taken there does not exclude a relay
// holding it on the primary, and from PostgreSQL 16 a standby even accepts the slot.
func checkHosts(dsn string) error {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		// pgconn's message leaves the password out; Scrub covers what it might miss.
		var pce *pgconn.ParseConfigError
		if errors.As(err, &pce) {
			return errors.New(Scrub(pce.Error(), dsnPassword(dsn)))
		}
		return errors.New(Scrub(err.Error(), dsnPassword(dsn)))
	}
	addrs := []string{fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)}
	for _, fb := range cfg.Fallbacks {
		// pgconn adds a fallback for the same server without TLS (sslmode=prefer): not another host.
		if a := fmt.Sprintf("%s:%d", fb.Host, fb.Port); !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) < 2 {
		return nil
	}
	switch reflect.ValueOf(cfg.ValidateConnect).Pointer() {
	case reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsReadWrite).Pointer(),
		reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsPrimary).Pointer():
		return nil
	}
	return fmt.Errorf("lists %d servers (%s) but does not ask for the writable one, so the relay would connect to whichever answers first, maybe a standby (the leader lock taken there does not exclude a relay on the primary): add target_session_attrs=read-write",
		len(addrs), strings.Join(addrs, ", "))
}

// checkDSN catches a malformed DSN early, without echoing the password, and a multi-host DSN
// that could lead to a standby.
func checkDSN(dsn string) error {
	if isURL(dsn) {
		if _, _, err := parseURL(dsn); err != nil {
			return fmt.Errorf("not a valid URL (%s)", RedactDSN(dsn))
		}
	}
	return checkHosts(dsn)
}
