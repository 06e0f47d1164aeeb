package credentials

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PostgresConfig parses dsn (pg_dsn) and, when passwordFile (pg_password_file) is set, takes the
// password from that file. Call it for every connection: the file is read each time, and so are the
// TLS files pg_dsn names (sslrootcert, sslcert, sslkey), which pgconn reads while parsing.
// The config serves pgconn too (its embedded pgconn.Config).
func PostgresConfig(dsn, passwordFile string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("config key pg_dsn: %w", err) // pgconn's message hides the password
	}
	if passwordFile != "" {
		pw, err := ReadSecret("pg_password_file", passwordFile)
		if err != nil {
			return nil, err
		}
		cfg.Password = pw
	}
	return cfg, nil
}

// PostgresTLSKeys names what fixes a TLS failure of a connection to PostgreSQL.
var PostgresTLSKeys = TLSKeys{
	Peer:    "the PostgreSQL server",
	CA:      "sslrootcert in pg_dsn",
	Cert:    "sslcert and sslkey in pg_dsn",
	Address: "the host in pg_dsn",
	Enabled: "sslmode in pg_dsn",
}

// PostgresRefusalFix says what to change in the relay's settings when PostgreSQL refused the login
// (SQLSTATE class 28) with message msg: pg_hba.conf asking for TLS or a client certificate is
// fixed in pg_dsn's ssl parameters, anything else in the user or the password.
func PostgresRefusalFix(msg string) string {
	switch {
	case strings.Contains(msg, "no encryption"):
		return "the server accepts this login only over TLS: set sslmode=verify-full and sslrootcert in pg_dsn"
	case strings.Contains(msg, "certificate"):
		return "the server wants a client certificate it trusts, for this user: set sslcert and sslkey in pg_dsn (the certificate's CN is the user name)"
	}
	return "fix the user or the password (pg_dsn, pg_password_file)"
}
