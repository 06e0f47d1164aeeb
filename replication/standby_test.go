package replication_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
)

// Decoding on a standby, the slot ledger is the primary's and the standby's copy of it lags by
// its replay. A process that takes over a lost slot's recovery (the recovery lock, on the
// primary) decides again whether the recovery is still under way: from the primary's ledger,
// not from the standby's copy, which may still show under way a recovery the previous owner has
// ended, and whose replacement slot it would then drop and make again, publishing the whole gap
// twice. The standby's replay is paused across the end of the recovery: the stream streams the
// replacement slot, untouched (the replay paused, a new slot could not even be created there).
func TestARecoveryOnAStandbyDecidesFromThePrimarysLedgerNotTheStandbysLaggingCopy(t *testing.T) {
	ctx := context.Background()
	primary := testenv.Postgres(t, devenv.PostgresOptions{Version: devenv.NewestPGVersion}) // decoding on a standby: 16 and later
	dsn := testenv.OutboxDatabase(t, primary)
	slot := testenv.UniqueName(t, "slot")
	if err := primary.Exec(ctx, "postgres", "SELECT pg_create_physical_replication_slot('decoding_standby', true)"); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := primary.Exec(ctx, cfg.Database, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox_events WITH (publish = 'insert')", slot)); err != nil {
		t.Fatal(err)
	}
	standby := testenv.Standby(t, primary, devenv.PostgresOptions{Settings: map[string]string{
		"primary_slot_name": "decoding_standby", "hot_standby_feedback": "on",
	}})
	standbyDSN := standby.DSN(cfg.Database)
	onStandby, err := pgx.Connect(ctx, standbyDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer onStandby.Close(ctx)

	// The replacement slot, on the standby: its creation waits for a running-transactions record
	// of the primary in the replayed WAL, which the primary is asked to log.
	created := make(chan error, 1)
	var lsn pglogrepl.LSN
	go func() {
		var s string
		err := onStandby.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", slot).Scan(&s)
		if err == nil {
			lsn, err = pglogrepl.ParseLSN(s)
		}
		created <- err
	}()
	await.True(t, time.Minute, "the slot's creation on the standby", func() bool {
		select {
		case err := <-created:
			if err != nil {
				t.Fatal(err)
			}
			return true
		default:
			_ = primary.Exec(ctx, "postgres", "SELECT pg_log_standby_snapshot()")
			return false
		}
	})

	// The ledger: a recovery under way with that replacement, as the standby replays it; then,
	// with the replay paused, the recovery ended on the primary (as its owner records it).
	onPrimary, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer onPrimary.Close(ctx)
	if _, err := onPrimary.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot, consistent_lsn, confirmed_commit_time, recovery_since, recovery_from_creation)
		VALUES ($1, $2::pg_lsn, now() - interval '1 hour', now() - interval '1 hour', false)`, replication.LedgerTable), slot, lsn.String()); err != nil {
		t.Fatal(err)
	}
	await.True(t, time.Minute, "the standby to replay the recovery under way", func() bool {
		var underWay bool
		err := onStandby.QueryRow(ctx, fmt.Sprintf("SELECT recovery_since IS NOT NULL FROM %s WHERE slot = $1", replication.LedgerTable), slot).Scan(&underWay)
		return err == nil && underWay
	})
	if _, err := onStandby.Exec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = onStandby.Exec(context.Background(), "SELECT pg_wal_replay_resume()") }()
	if _, err := onPrimary.Exec(ctx, fmt.Sprintf("UPDATE %s SET recovery_since = NULL, recovery_from_creation = NULL, recovered_at = now() WHERE slot = $1",
		replication.LedgerTable), slot); err != nil {
		t.Fatal(err)
	}

	recovered := make(chan struct{}, 1)
	ended, stop, sessions := relayLikeStreamSessions(t, replication.Config{
		DSN: standbyDSN, PrimaryDSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
		OnSlotLost: replication.SlotLostRecover,
		Recover: func(context.Context, string, replication.LostSlot) (replication.Recovery, error) {
			recovered <- struct{}{}
			return replication.Recovery{}, nil
		},
	})
	defer stop()
	select {
	case <-sessions:
	case err := <-ended:
		t.Fatalf("the stream ended before streaming: %v", err)
	case <-time.After(45 * time.Second):
		t.Fatal("the stream did not stream the replacement slot within 45 s (it took the standby's lagging ledger for a recovery under way, and dropped the slot to make it again)")
	}
	select {
	case <-recovered:
		t.Fatal("the gap of a recovery the primary's ledger records as ended was published again")
	default:
	}
	var same bool
	if err := onStandby.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn >= $2::pg_lsn)", slot, lsn.String()).Scan(&same); err != nil {
		t.Fatal(err)
	}
	if !same {
		t.Fatal("the replacement slot is gone from the standby")
	}
}
