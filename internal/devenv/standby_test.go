package devenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// On every major version a standby made without pg_basebackup streams the primary's changes,
// keeps none of its slots, and is promoted to a writable primary on a new timeline.
func TestStandbyOnEveryVersion(t *testing.T) {
	for _, major := range []string{"14", "15", "16", "17", "18"} {
		t.Run(major, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			primary, err := StartPostgres(ctx, PostgresOptions{Version: major})
			if err != nil {
				t.Fatal(err)
			}
			defer primary.Close(context.Background())
			for _, sql := range []string{"CREATE TABLE t (id int primary key); INSERT INTO t VALUES (1)",
				"SELECT pg_create_logical_replication_slot('copied_not', 'pgoutput')"} {
				if err := primary.Exec(ctx, primary.Database(), sql); err != nil {
					t.Fatal(err)
				}
			}
			standby, err := StartStandby(ctx, primary, PostgresOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer standby.Close(context.Background())
			if err := primary.Exec(ctx, primary.Database(), "INSERT INTO t VALUES (2)"); err != nil {
				t.Fatalf("primary after the copy: %v", err)
			}
			conn, err := pgx.Connect(ctx, standby.DSN(standby.Database()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			var inRecovery bool
			var slots int
			if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), (SELECT count(*) FROM pg_replication_slots)").Scan(&inRecovery, &slots); err != nil {
				t.Fatal(err)
			}
			if !inRecovery || slots != 0 {
				t.Fatalf("standby: in recovery %v with %d slots, want true with 0", inRecovery, slots)
			}
			for n := 0; n != 2; {
				if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 2 {
					select {
					case <-ctx.Done():
						t.Fatalf("standby has %d rows, want 2: %v", n, ctx.Err())
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
			if err := standby.Promote(ctx); err != nil {
				t.Fatal(err)
			}
			var tli int
			if err := conn.QueryRow(ctx, "INSERT INTO t VALUES (3) RETURNING (SELECT timeline_id FROM pg_control_checkpoint())").Scan(&tli); err != nil {
				t.Fatalf("write after promotion: %v", err)
			}
			if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
				t.Fatalf("after promotion: in recovery %v (%v)", inRecovery, err)
			}
		})
	}
}

// An online copy leaves the primary running: a session opened before the copy still works after
// it, and the standby streams from the slot reserved for it (on 14, pg_start_backup's variant).
func TestStandbyOnlineKeepsThePrimaryServing(t *testing.T) {
	for _, major := range []string{"14", "18"} {
		t.Run(major, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			primary, err := StartPostgres(ctx, PostgresOptions{Version: major})
			if err != nil {
				t.Fatal(err)
			}
			defer primary.Close(context.Background())
			session, err := pgx.Connect(ctx, primary.DSN(primary.Database()))
			if err != nil {
				t.Fatal(err)
			}
			defer session.Close(context.Background())
			if _, err := session.Exec(ctx, "CREATE TABLE t (id int primary key); INSERT INTO t VALUES (1); SELECT pg_create_physical_replication_slot('online', true)"); err != nil {
				t.Fatal(err)
			}
			if _, err := StartStandbyOnline(ctx, primary, PostgresOptions{}); err == nil {
				t.Fatal("an online copy without a slot started")
			}
			standby, err := StartStandbyOnline(ctx, primary, PostgresOptions{Settings: map[string]string{"primary_slot_name": "online"}})
			if err != nil {
				t.Fatal(err)
			}
			defer standby.Close(context.Background())
			if _, err := session.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
				t.Fatalf("the session opened before the copy: %v", err)
			}
			conn, err := pgx.Connect(ctx, standby.DSN(standby.Database()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			for n := 0; n != 2; {
				if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 2 {
					select {
					case <-ctx.Done():
						t.Fatalf("standby has %d rows, want 2: %v", n, ctx.Err())
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
			var active bool
			if err := session.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'online'").Scan(&active); err != nil || !active {
				t.Fatalf("slot online active %v (%v), want true", active, err)
			}
		})
	}
}
