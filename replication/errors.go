package replication

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/credentials"
)

// ErrSlotActive means another process is streaming the slot: another relay instance (the leader),
// Debezium, or this relay's previous connection that PostgreSQL has not reaped yet.
var ErrSlotActive = errors.New("replication slot is active for another process")

// ErrSlotLost means the slot the relay was streaming is gone or has lost required WAL. Events
// committed in the gap may never be published; an operator has to decide how to recover.
var ErrSlotLost = errors.New("replication slot lost")

// fatalError is a problem that retrying cannot fix: configuration, permissions, schema. The relay
// reports it and exits instead of reconnecting.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

func fatalf(format string, args ...any) error {
	return &fatalError{fmt.Errorf(format, args...)}
}

// Fatal marks err as a problem retrying cannot fix, for code outside this package that runs inside a
// session (such as a backfill).
func Fatal(err error) error { return &fatalError{err} }

// IsFatal reports whether err is a problem retrying cannot fix.
func IsFatal(err error) bool {
	var f *fatalError
	return errors.As(err, &f) || errors.Is(err, ErrSlotLost)
}

// classifyConnect maps a connection failure to an actionable error: bad credentials, a missing
// database, a role without REPLICATION or a certificate the relay does not trust are fatal;
// anything else (server down, restarting, network) is worth retrying.
func classifyConnect(err error, what string) error {
	if line, ok := credentials.ExplainTLS(err, credentials.PostgresTLSKeys); ok {
		return fatalf("connect to PostgreSQL for %s: %s", what, line)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("connect to PostgreSQL for %s: %w", what, err)
	}
	tlsRule := pgErr.Code[:2] == "28" && (strings.Contains(pgErr.Message, "no encryption") || strings.Contains(pgErr.Message, "certificate"))
	switch {
	case tlsRule:
		return fatalf("PostgreSQL refused the relay's login (%s): %s", pgErr.Message, credentials.PostgresRefusalFix(pgErr.Message))
	case pgErr.Code == "42501" || pgErr.Code == "28000" && strings.Contains(pgErr.Message, "replication"):
		return fatalf("the PostgreSQL role may not open a replication connection (%s): grant it with ALTER ROLE <role> REPLICATION, or use a role that has it", pgErr.Message)
	case pgErr.Code[:2] == "28":
		return fatalf("PostgreSQL refused the relay's credentials (%s): %s", pgErr.Message, credentials.PostgresRefusalFix(pgErr.Message))
	case pgErr.Code == "3D000":
		return fatalf("PostgreSQL has no such database (%s): fix the database in pg_dsn", pgErr.Message)
	case pgErr.Code == "53300":
		return fmt.Errorf("connect to PostgreSQL for %s: too many connections: %w", what, err)
	}
	return fmt.Errorf("connect to PostgreSQL for %s: %w", what, err)
}

// streamError maps errors of START_REPLICATION and of the stream to actionable ones.
func (s *Stream) streamError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("replication stream: %w", err)
	}
	switch pgErr.Code {
	case "55006": // object_in_use: "replication slot ... is active for PID n"
		return fmt.Errorf("%w: %s", ErrSlotActive, pgErr.Message)
	case "42704": // undefined_object: the slot or the publication
		if strings.HasPrefix(pgErr.Message, "publication ") && s.cfg.NoTable {
			return fatalf("%s: publication %q was dropped while the relay was streaming; pgoutput needs it, although messages do not depend on what it publishes: recreate it (CREATE PUBLICATION %s) and restart",
				pgErr.Message, s.cfg.Publication, pgx.Identifier{s.cfg.Publication}.Sanitize())
		}
		if strings.HasPrefix(pgErr.Message, "publication ") {
			return fatalf("%s: publication %q was dropped while the relay was streaming, so outbox rows written since are not in the replication stream: recreate it (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)), republish the rows written meanwhile (backfill_since), and restart",
				pgErr.Message, s.cfg.Publication, pgx.Identifier{s.cfg.Publication}.Sanitize(), s.cfg.qualifiedTable())
		}
		return s.slotGoneError(pgErr, false)
	case "55000": // object_not_in_prerequisite_state: e.g. the slot's WAL was removed
		return s.slotGoneError(pgErr, true)
	case "57P01", "57P02", "57P03": // server shutting down or restarting
		return fmt.Errorf("PostgreSQL is shutting down: %w", err)
	}
	if pgErr.Code[:2] == "42" || pgErr.Code[:2] == "22" {
		return fatalf("replication stream: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("replication stream: %w", err)
}
