package main_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestEveryPostgresVersion runs the binary's end-to-end scenarios against every supported major
// version the rest of the suite does not use (testenv.MatrixVersions), versions in parallel, each
// on the binary's shared cluster of that version: the run with only the two environment
// variables, and SIGTERM restarts under load.
func TestEveryPostgresVersion(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	for _, v := range testenv.MatrixVersions(t) {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			pg := testenv.SharedPostgresVersion(t, v)
			t.Run("end to end", func(t *testing.T) { runWithOnlyTheTwoVariables(t, pg, k) })
			t.Run("SIGTERM restarts", func(t *testing.T) { sigtermRestarts(t, pg, k) })
		})
	}
}
