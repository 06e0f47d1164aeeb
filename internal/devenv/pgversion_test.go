package devenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every major version of the matrix starts, runs logical decoding with pgoutput and reports the
// version asked for.
func TestPostgresVersions(t *testing.T) {
	for _, major := range []string{"14", "15", "16", "17", "18"} {
		t.Run(major, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			pg, err := StartPostgres(ctx, PostgresOptions{Version: major})
			if err != nil {
				t.Fatal(err)
			}
			defer pg.Close(context.Background())
			conn, err := pgx.Connect(ctx, pg.DSN(pg.Database()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var version string
			if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(version, major+".") {
				t.Fatalf("server_version %q, want %s.x", version, major)
			}
			for _, sql := range []string{"CREATE TABLE t (id int primary key)", "CREATE PUBLICATION p FOR TABLE t",
				"SELECT pg_create_logical_replication_slot('s', 'pgoutput')", "INSERT INTO t VALUES (1)"} {
				if _, err := conn.Exec(ctx, sql); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			var n int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_logical_slot_get_binary_changes('s', NULL, NULL, 'proto_version', '1', 'publication_names', 'p')").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n < 3 { // begin, relation, insert, commit
				t.Fatalf("pgoutput gave %d messages, want at least 3", n)
			}
		})
	}
}
