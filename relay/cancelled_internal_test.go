package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/replication"
)

// TestCancelledReadsOfTheOutboxTableEndTheRelayOnceTheyRepeat pins the counting's corners; against
// real servers, faults' TestARecoveryOutlastsTheRelayRolesStatementTimeout (the role's timeouts no
// longer cancel the read) and TestARecoveryCancelledAgainAndAgainStopsTheRelay (a watchdog's).
func TestCancelledReadsOfTheOutboxTableEndTheRelayOnceTheyRepeat(t *testing.T) {
	cancelled := fmt.Errorf("publish the gap: %w", &pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"})
	idle := &pgconn.PgError{Code: "25P03", Message: "terminating connection due to idle-in-transaction timeout"}
	other := &pgconn.PgError{Code: "08006", Message: "connection failure"}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	type step struct {
		ctx   context.Context
		err   error
		fatal bool
	}
	live := context.Background()
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"three cancellations in a row are fatal", []step{{live, cancelled, false}, {live, idle, false}, {live, cancelled, true}}},
		{"a success between them starts the count again", []step{{live, cancelled, false}, {live, cancelled, false}, {live, nil, false}, {live, cancelled, false}, {live, cancelled, false}}},
		{"other errors are not counted", []step{{live, cancelled, false}, {live, other, false}, {live, other, false}, {live, cancelled, false}}},
		{"a stop's cancellation is not counted", []step{{stopped, cancelled, false}, {stopped, cancelled, false}, {stopped, cancelled, false}, {live, cancelled, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c cancelledReads
			for i, s := range tc.steps {
				err := c.note(s.ctx, "the lost slot's gap", s.err)
				if !errors.Is(err, s.err) {
					t.Fatalf("step %d: note returned %v, want it to wrap %v", i, err, s.err)
				}
				if got := replication.IsFatal(err); got != s.fatal {
					t.Fatalf("step %d: fatal %v, want %v (%v)", i, got, s.fatal, err)
				}
				if s.fatal && !strings.Contains(err.Error(), "cancelled the read of the lost slot's gap from the outbox table 3 times in a row") {
					t.Errorf("step %d: the fatal line does not say what repeats: %v", i, err)
				}
			}
		})
	}
}
