package main_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestEveryPostgresVersion runs the binary's end-to-end scenarios against every supported major
// version the rest of the suite does not use (testenv.MatrixVersions), versions in parallel, each
// on the binary's shared cluster of that version: the run with only the two environment
// variables, and on the oldest version SIGTERM restarts under load. (A SIGTERM's final status
// update is the same on every version; the fault suite's kill -9 and PostgreSQL restarts run on
// each of them.)
func TestEveryPostgresVersion(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	for i, v := range testenv.MatrixVersions(t) {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			pg := testenv.SharedPostgresVersion(t, v)
			t.Run("end to end", func(t *testing.T) { runWithOnlyTheTwoVariables(t, pg, k) })
			if i == 0 { // oldest first
				t.Run("SIGTERM restarts", func(t *testing.T) { sigtermRestarts(t, pg, k) })
			}
		})
	}
}
