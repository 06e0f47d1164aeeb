package workload

import (
	"errors"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// safeToRetry is an error the driver reports as "nothing was sent", as pgx's "conn closed" does.
type safeToRetry struct{}

func (safeToRetry) Error() string     { return "conn closed" }
func (safeToRetry) SafeToRetry() bool { return true }

// TestCommitOutcome: only a COMMIT the server answered is settled by the writer; every other
// failure is in doubt until the marker row is looked up. A COMMIT the driver called unsent was
// once taken for rolled back, and the nemesis then called the relay's publication of that
// transaction (committed just before the primary was killed) a violation.
func TestCommitOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want history.Outcome
	}{
		{"answered", nil, history.Committed},
		{"answered ROLLBACK", pgx.ErrTxCommitRollback, history.RolledBack},
		{"refused with an ERROR", &pgconn.PgError{Severity: "ERROR", Code: "40001"}, history.RolledBack},
		{"FATAL", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, history.InDoubt},
		{"connection lost", io.ErrUnexpectedEOF, history.InDoubt},
		{"driver says not sent", safeToRetry{}, history.InDoubt},
		{"wrapped, driver says not sent", errors.Join(errors.New("commit"), safeToRetry{}), history.InDoubt},
	} {
		if got, _ := commitOutcome(tc.err); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
