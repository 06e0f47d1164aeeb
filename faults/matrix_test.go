package faults

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// matrixKills is the number of SIGKILLs per version: fewer than the full scenario's 10, which
// runs on the newest version.
const matrixKills = 4

// TestEveryPostgresVersion runs the scenarios that prove the guarantees against every supported
// major version the rest of the suite does not use (testenv.MatrixVersions: 14 to 17 unless
// OUTBOX_PG_VERSION says otherwise), one dedicated cluster per version: one broker outage with
// relays on every version at once (stopping a broker costs more than the relays), then per
// version in parallel the kill -9 scenario and a PostgreSQL fast restart (which also measures
// the duplicates of a clean restart: PostgreSQL 17 saves the slot's position at shutdown, older
// versions do not).
func TestEveryPostgresVersion(t *testing.T) {
	t.Parallel()
	versions := testenv.MatrixVersions(t)
	pgs := testenv.PostgresVersions(t, versions...)
	t.Run("broker outage", func(t *testing.T) {
		fb := newFaultBroker(t)
		all := make([]*devenv.Postgres, 0, len(versions))
		for _, v := range versions {
			all = append(all, pgs[v])
		}
		brokerOutage(t, fb, all...)
	})
	brokers := testenv.SharedKafka(t).Brokers()
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			t.Run("kill -9", func(t *testing.T) { kill9(t, pgs[v], brokers, matrixKills) })
			t.Run("PostgreSQL restart", func(t *testing.T) { postgresRestart(t, pgs[v], brokers) })
		})
	}
}
