package replication

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// A publication whose publish option leaves out INSERTs for a moment between two checks (OID and
// membership unchanged) makes PostgreSQL skip the rows inserted meanwhile, and a replay from the
// slot skips them again: the check must see the ALTER (the pg_publication row changed) and stop
// before the horizon passes the rows. An ALTER that leaves the publication's own row alone
// (another table added or dropped) and a VACUUM FREEZE of the catalog are no such change.
func TestAPublicationAlteredBetweenTwoChecksStopsTheRelayBeforeItsRows(t *testing.T) {
	publicationAltered(t, testenv.SharedPostgres(t))
}

// PostgreSQL 14 freezes and updates catalog rows as newer versions do; the same cases hold there.
func TestAPublicationAlteredBetweenTwoChecksOnPostgres14(t *testing.T) {
	publicationAltered(t, testenv.SharedPostgresVersion(t, "14"))
}

func publicationAltered(t *testing.T, pg *devenv.Postgres) {
	const interval = 50 * time.Millisecond
	tests := []struct {
		name   string
		change string // rows are inserted into alt_outbox between its statements where it says ROWS
		stops  bool
	}{
		{"publish switched to update and back", `ALTER PUBLICATION alt_pub SET (publish = 'update'); ROWS; ALTER PUBLICATION alt_pub SET (publish = 'insert')`, true},
		{"publish switched to nothing and back", `ALTER PUBLICATION alt_pub SET (publish = ''); ROWS; ALTER PUBLICATION alt_pub SET (publish = 'insert, update')`, true},
		{"publish set to what it was", `ROWS; ALTER PUBLICATION alt_pub SET (publish = 'insert')`, true},
		{"another table added and dropped", `ALTER PUBLICATION alt_pub ADD TABLE alt_other; ROWS; ALTER PUBLICATION alt_pub DROP TABLE alt_other`, false},
		{"pg_publication frozen", `ROWS; VACUUM (FREEZE) pg_catalog.pg_publication`, false},
		{"pg_publication rewritten", `ROWS; VACUUM (FULL, FREEZE) pg_catalog.pg_publication`, false},
	}
	// One database for all cases (creating one is most of a case's cost): each case has a schema,
	// a table and a publication of its own.
	dsn, admin := horizonDBOn(t, pg)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			schema := fmt.Sprintf("alt%d", i)
			names := strings.NewReplacer("alt_outbox", schema+".outbox", "alt_other", schema+".other", "alt_pub", schema+"_pub")
			mustExec(t, admin, names.Replace(`CREATE SCHEMA `+schema+`; CREATE TABLE alt_outbox `+outboxColumns+`; CREATE TABLE alt_other (id int);
				CREATE PUBLICATION alt_pub FOR TABLE alt_outbox WITH (publish = 'insert')`))
			tt.change = names.Replace(tt.change)
			h, c := startedHorizon(t, dsn, admin, schema, "outbox", schema+"_pub", interval)
			// Two checks an interval apart: the first one's position is verified.
			for range 2 {
				if err := c.check(ctx, h); err != nil {
					t.Fatal(err)
				}
				anIntervalPasses(h)
			}
			before := h.Verified()
			if before == 0 {
				t.Fatal("two checks an interval apart verified nothing")
			}
			var rows pglogrepl.LSN
			for _, stmt := range strings.Split(tt.change, ";") {
				if stmt = strings.TrimSpace(stmt); stmt != "ROWS" {
					mustExec(t, admin, stmt)
					continue
				}
				mustExec(t, admin, names.Replace(`INSERT INTO alt_outbox VALUES (1, 'a', 'a', 'x', '{}'), (2, 'a', 'a', 'x', '{}')`))
				var lsn string
				if err := admin.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
					t.Fatal(err)
				}
				var err error
				if rows, err = pglogrepl.ParseLSN(lsn); err != nil {
					t.Fatal(err)
				}
			}
			// Two more checks an interval apart would verify a position past the rows.
			var err error
			for i := 0; i < 2 && err == nil; i++ {
				err = c.check(ctx, h)
				anIntervalPasses(h)
			}
			if !tt.stops {
				if err != nil {
					t.Fatalf("%s is no change of what the publication publishes, but the check failed: %v", tt.name, err)
				}
				if h.Verified() < rows {
					t.Fatalf("verified %s after two more checks, want past the rows at %s", h.Verified(), rows)
				}
				return
			}
			if !IsFatal(err) || !strings.Contains(err.Error(), `publication "`+schema+`_pub" was altered`) || !strings.Contains(err.Error(), "outbox-relay replay --since") {
				t.Fatalf("after the publication was altered between two checks, want a fatal error naming it and the replay, got %v (verified %s, rows at %s)", err, h.Verified(), rows)
			}
			if v := h.Verified(); v > before || v >= rows {
				t.Fatalf("verified %s after the ALTER (before it: %s; rows at %s): the slot could be confirmed past rows PostgreSQL may have skipped", v, before, rows)
			}
			t.Log(err)
		})
	}
}
