package replication_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
)

// observed is a test logger whose entries the test can also search.
func observed(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core)), logs
}

// waitLogged waits until an entry containing msg was logged.
func waitLogged(t *testing.T, logs *observer.ObservedLogs, msg string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if logs.FilterMessageSnippet(msg).Len() > 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing logged containing %q", msg)
}

// slotFailover waits until slot is streamed on dsn's server and returns its failover flag.
func slotFailover(t *testing.T, dsn, slot string) bool {
	t.Helper()
	walsenderPID(t, dsn, slot)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var failover bool
	if err := conn.QueryRow(context.Background(), "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&failover); err != nil {
		t.Fatal(err)
	}
	return failover
}

// failover: true makes the slot a failover slot where PostgreSQL has them (17+): a new slot is
// created with FAILOVER, an existing one is altered, and the relay warns about what the primary's
// synchronized_standby_slots leaves unprotected. Before 17 the setting is a configuration error
// that names the key.
func TestFailoverSetting(t *testing.T) {
	for _, version := range []string{"16", "17", "18"} {
		t.Run("PostgreSQL "+version, func(t *testing.T) {
			t.Parallel()
			pg := testenv.Postgres(t, devenv.PostgresOptions{Version: version})
			config := func(dsn, slot string) replication.Config {
				return replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
					CreateSlot: true, CreatePublication: true, Failover: true}
			}
			if version < "17" {
				dsn := testenv.OutboxDatabase(t, pg)
				log, _ := observed(t)
				_, stop, ended := runStreamConfig(t, config(dsn, testenv.UniqueName(t, "slot")), log)
				select {
				case <-ended:
				case <-time.After(time.Minute):
					t.Fatal("the stream did not stop on failover: true")
				}
				err := stop()
				if !replication.IsFatal(err) || !strings.Contains(err.Error(), "config key failover") || !strings.Contains(err.Error(), "PostgreSQL "+version) {
					t.Fatalf("Run = %v, want a fatal error naming config key failover and the server's version", err)
				}
				return
			}

			// stream runs a stream with failover: true until the slot streams, and checks that
			// it is a failover slot and what was logged. A slot it creates exports its snapshot
			// (for the backfill) as without failover.
			stream := func(t *testing.T, dsn, slot, logged string) {
				log, logs := observed(t)
				cfg := config(dsn, slot)
				cfg.ExportSnapshot = true
				snapshots := make(chan string, 1)
				cfg.BeforeStream = func(_ context.Context, snapshot string) error {
					snapshots <- snapshot
					return nil
				}
				_, stop, _ := runStreamConfig(t, cfg, log)
				defer stop()
				if !slotFailover(t, dsn, slot) {
					t.Fatal("the slot is not a failover slot")
				}
				waitLogged(t, logs, logged)
				if created := logs.FilterMessage("created replication slot").Len() > 0; created != (<-snapshots != "") {
					t.Fatalf("created the slot: %v, but exported a snapshot: %v", created, !created)
				}
			}
			t.Run("a new slot is created as a failover slot", func(t *testing.T) {
				stream(t, testenv.OutboxDatabase(t, pg), testenv.UniqueName(t, "slot"), "synchronized_standby_slots is empty")
			})
			t.Run("an existing slot is made a failover slot", func(t *testing.T) {
				dsn, slot := testenv.OutboxDatabase(t, pg), testenv.UniqueName(t, "slot")
				conn, err := pgx.Connect(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(context.Background())
				if _, err := conn.Exec(context.Background(), "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
					t.Fatal(err)
				}
				stream(t, dsn, slot, "made the existing slot a failover slot")
			})
			t.Run("a standby slot that nothing streams is reported", func(t *testing.T) {
				dsn, slot := testenv.OutboxDatabase(t, pg), testenv.UniqueName(t, "slot")
				standbySlot := testenv.UniqueName(t, "standby")
				for _, sql := range []string{
					fmt.Sprintf("SELECT pg_create_physical_replication_slot('%s')", standbySlot),
					fmt.Sprintf("ALTER SYSTEM SET synchronized_standby_slots = '%s'", standbySlot),
					"SELECT pg_reload_conf()",
				} {
					if err := pg.Exec(context.Background(), "postgres", sql); err != nil {
						t.Fatal(err)
					}
				}
				log, logs := observed(t)
				_, stop, _ := runStreamConfig(t, config(dsn, slot), log)
				defer stop()
				waitLogged(t, logs, "standby slots of synchronized_standby_slots are not streamed now")
			})
		})
	}
}

// A multi-host pg_dsn with target_session_attrs=read-write must lead every connection to the
// primary, whichever host is listed first: pgconn's check (SHOW transaction_read_only) also runs on
// a replication connection, where the walsender answers SHOW, and it tells a hot standby from the
// primary there. From PostgreSQL 16 a standby would even accept the slot, so picking it would not
// fail loudly.
func TestMultiHostDSNFindsThePrimary(t *testing.T) {
	ctx := context.Background()
	primary := testenv.Postgres(t, devenv.PostgresOptions{Version: "17"})
	dsn := testenv.OutboxDatabase(t, primary)
	standby := testenv.Standby(t, primary)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	multi := func(first, second *devenv.Postgres) string {
		return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres password=%s dbname=%s sslmode=disable target_session_attrs=read-write",
			first.Port(), second.Port(), cfg.Password, cfg.Database)
	}
	replicationConnect := func(dsn string) (*pgconn.PgConn, error) {
		rcfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		rcfg.RuntimeParams["replication"] = "database"
		return pgconn.ConnectConfig(ctx, rcfg)
	}

	t.Run("a replication connection to the standby alone is refused as read-only", func(t *testing.T) {
		single := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres password=%s dbname=%s sslmode=disable target_session_attrs=read-write",
			standby.Port(), cfg.Password, cfg.Database)
		conn, err := replicationConnect(single)
		if err == nil {
			conn.Close(ctx)
			t.Fatal("connected to the standby")
		}
		if !errors.Is(err, pgconn.ErrReadOnlyConnection) {
			t.Fatalf("connect = %v, want the read-only check to refuse the standby", err)
		}
	})
	for _, order := range []struct {
		name          string
		first, second *devenv.Postgres
	}{{"standby listed first", standby, primary}, {"primary listed first", primary, standby}} {
		t.Run(order.name, func(t *testing.T) {
			dsn := multi(order.first, order.second)
			rconn, err := replicationConnect(dsn)
			if err != nil {
				t.Fatal(err)
			}
			rport := rconn.Conn().RemoteAddr().(*net.TCPAddr).Port
			rconn.Close(ctx)
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			port := conn.PgConn().Conn().RemoteAddr().(*net.TCPAddr).Port
			conn.Close(ctx)
			if rport != primary.Port() || port != primary.Port() {
				t.Fatalf("the replication connection reached port %d and an ordinary one port %d; the primary is on %d", rport, port, primary.Port())
			}

			// The stream creates its slot on the primary and streams it there.
			slot := testenv.UniqueName(t, "slot")
			_, stop, _ := runStreamConfig(t, replication.Config{DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
				CreateSlot: true, CreatePublication: true}, zaptest.NewLogger(t))
			defer stop()
			walsenderPID(t, primary.DSN(cfg.Database), slot)
		})
	}
}

// syncedSlot makes standby (sync_replication_slots off) copy primary's failover slots by hand
// (pg_sync_replication_slots) until its copy of slot is synced and persistent: a promotion keeps it.
func syncedSlot(t *testing.T, primary, standby *devenv.Postgres, database, slot string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		// The copy becomes persistent once the primary's slot passes where the standby reserved WAL
		// for it, which moves at running-transactions records: log one rather than wait for one, and
		// move the slot past it (nothing streams it yet).
		if err := primary.Exec(ctx, database, fmt.Sprintf(`SELECT pg_log_standby_snapshot();
			SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn())`, slot)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		conn, err := pgx.Connect(ctx, standby.DSN(database))
		if err != nil {
			t.Fatal(err)
		}
		var ready bool
		_, syncErr := conn.Exec(ctx, "SELECT pg_sync_replication_slots()")
		err = conn.QueryRow(ctx, "SELECT coalesce(bool_and(synced AND NOT temporary), false) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&ready)
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby's copy of slot %s never became ready (last pg_sync_replication_slots: %v)", slot, syncErr)
		}
	}
}

// A pg_dsn that leads to a standby still in recovery (a single host whose address the failover
// moves before the promotion has finished, or a mistake) must not end the relay: on PostgreSQL 17 the
// standby's synchronised copy of the failover slot refuses decoding until the promotion, and that
// refusal is no lost slot. The relay waits, without creating or touching a slot there, and streams
// the same synchronised slot once the standby is promoted.
func TestAStandbyInRecoveryIsWaitedForNotTakenForALostSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := testenv.Postgres(t, devenv.PostgresOptions{Version: "17"})
	dsn := testenv.OutboxDatabase(t, primary)
	database := strings.TrimPrefix(must(url.Parse(dsn)).Path, "/")
	slot := testenv.UniqueName(t, "slot")
	if err := primary.Exec(ctx, "postgres", "SELECT pg_create_physical_replication_slot('standby1', true)"); err != nil {
		t.Fatal(err)
	}
	standby := testenv.Standby(t, primary, devenv.PostgresOptions{Settings: map[string]string{
		"primary_slot_name": "standby1", "hot_standby_feedback": "on"}})
	for _, sql := range []string{
		fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox_events WITH (publish = 'insert', publish_via_partition_root = true)", slot),
		fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput', false, false, true)", slot),
	} {
		if err := primary.Exec(ctx, database, sql); err != nil {
			t.Fatal(err)
		}
	}
	syncedSlot(t, primary, standby, database, slot)

	log, logs := observed(t)
	_, stop, ended := runStreamConfig(t, replication.Config{DSN: standby.DSN(database), Slot: slot, Publication: slot,
		Table: "outbox_events", CreateSlot: true, CreatePublication: true, Failover: true}, log)
	deadline := time.After(time.Minute)
	for logs.FilterMessage("replication interrupted; reconnecting").Len() < 2 {
		select {
		case <-ended:
			t.Fatalf("the relay stopped on a standby in recovery: %v", stop())
		case <-deadline:
			t.Fatal("the relay did not retry on a standby in recovery")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got := logs.FilterMessage("replication interrupted; reconnecting").All()[0].ContextMap()["error"]; !strings.Contains(fmt.Sprint(got), "in recovery") {
		t.Errorf("the retried error does not say the server is in recovery: %v", got)
	}

	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	walsenderPID(t, standby.DSN(database), slot)
	select {
	case <-ended:
		t.Fatalf("the relay stopped after the promotion: %v", stop())
	default:
	}
	conn, err := pgx.Connect(ctx, standby.DSN(database))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var synced bool
	if err := conn.QueryRow(ctx, "SELECT synced FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&synced); err != nil || !synced {
		t.Fatalf("the promoted standby streams slot %s synced=%v (%v): the relay must stream the synchronised copy, not a slot of its own", slot, synced, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
