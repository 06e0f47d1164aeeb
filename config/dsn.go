package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

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
