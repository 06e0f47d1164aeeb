package faults

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// matrixKills is the number of SIGKILLs per version: fewer than the full scenario's 10, which
// runs on the suite's version.
const matrixKills = 4

// TestEveryPostgresVersion runs a PostgreSQL fast restart against every supported major version the
// rest of the suite does not use (testenv.MatrixVersions: 14 to 17 unless OUTBOX_PG_VERSION says
// otherwise), versions in parallel, and the kill -9 scenario on the oldest of them. The restart
// also measures the duplicates of a clean restart: PostgreSQL 17 saves the slot's position at
// shutdown, older versions do not. A relay's kill -9 is the same on every version but for
// pgoutput's protocol, whose oldest form the oldest version speaks. The broker outage runs on the
// oldest version inside TestBrokerFaults, in its one outage (a broker restart costs more than the
// relays).
func TestEveryPostgresVersion(t *testing.T) {
	t.Parallel()
	brokers := testenv.SharedKafka(t).Brokers()
	for i, v := range testenv.MatrixVersions(t) {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			if i == 0 { // oldest first
				t.Run("kill -9", func(t *testing.T) { kill9(t, newDB(t, testenv.SharedPostgresVersion(t, v), 3), brokers, matrixKills) })
			}
			t.Run("PostgreSQL restart", func(t *testing.T) {
				postgresRestart(t, testenv.Postgres(t, devenv.PostgresOptions{Version: v}), brokers)
			})
		})
	}
}
