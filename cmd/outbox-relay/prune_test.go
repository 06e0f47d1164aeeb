package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// `outbox-relay prune` as an operator runs it from cron: only the database in its environment (it
// never contacts Kafka), the age as a flag or from the configuration.
func TestPruneCommandDeletesRowsOlderThanTheGivenAge(t *testing.T) {
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"})
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// 25 rows two days old, 5 two hours old, 3 new.
	for _, age := range []struct {
		n   int
		ago string
	}{{25, "2 days"}, {5, "2 hours"}, {3, "0"}} {
		if _, err := pool.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
			SELECT 'order', i::text, 'Created', '{}', now() - $2::interval FROM generate_series(1, $1) i`, age.n, age.ago); err != nil {
			t.Fatal(err)
		}
	}
	left := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	env := map[string]string{"OUTBOX_PG_DSN": dsn, "GORACE": "atexit_sleep_ms=0"}
	prune := func(extraEnv map[string]string, args ...string) (int, string) {
		t.Helper()
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for k, v := range extraEnv {
			e[k] = v
		}
		return relayproc.Run(t, relayproc.Options{Subcommand: "prune", Args: args, Env: e}, time.Minute)
	}

	cases := []struct {
		name     string
		env      map[string]string
		args     []string
		wantCode int
		wantOut  string
		wantLeft int
	}{
		{"the default age (prune_older_than, 24h), in small batches", nil, []string{"--batch-size=4"}, 0, "deleted 25 rows created more than 24h0m0s ago", 8},
		{"a negative age is a usage error", nil, []string{"--older-than=-1h"}, 2, "must not be negative", 8},
		{"an unknown flag is a usage error", nil, []string{"--older-then=1h"}, 2, "unknown flag --older-then", 8},
		{"the age from the environment", map[string]string{"OUTBOX_PRUNE_OLDER_THAN": "1h"}, nil, 0, "deleted 5 rows created more than 1h0m0s ago", 3},
		{"--older-than wins over the environment; 0 deletes every committed row", map[string]string{"OUTBOX_PRUNE_OLDER_THAN": "1h"}, []string{"--older-than=0s"}, 0, "deleted 3 rows", 0},
	}
	for _, c := range cases {
		code, out := prune(c.env, c.args...)
		if code != c.wantCode || !strings.Contains(out, c.wantOut) || left() != c.wantLeft {
			t.Fatalf("%s: exit status %d, %d rows left, output:\n%s\nwant status %d, %d rows left and output containing %q",
				c.name, code, left(), out, c.wantCode, c.wantLeft, c.wantOut)
		}
		if strings.Contains(out, "outbox-test-secret") {
			t.Fatalf("%s: the output reveals the database password:\n%s", c.name, out)
		}
	}
}
