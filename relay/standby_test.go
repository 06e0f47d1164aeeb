package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// standbyPair is a primary with the fixture's outbox database and a hot standby of it that
// decodes (PostgreSQL 16+): a physical slot on the primary and hot_standby_feedback, so the
// primary keeps the catalog rows the standby's logical slot needs.
type standbyPair struct {
	primary, standby *devenv.Postgres
	standbyDSN       string // the outbox database on the standby
}

func newStandbyPair(t *testing.T, f *fixture, primary *devenv.Postgres) standbyPair {
	t.Helper()
	ctx := context.Background()
	// A standby cannot create the publication: it is made on the primary (outbox-relay migrate).
	if _, err := f.outbox.Pool().Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox_events WITH (publish = 'insert', publish_via_partition_root = true)", f.slot)); err != nil {
		t.Fatal(err)
	}
	if err := primary.Exec(ctx, "postgres", "SELECT pg_create_physical_replication_slot('decoding_standby', true)"); err != nil {
		t.Fatal(err)
	}
	standby := testenv.Standby(t, primary, devenv.PostgresOptions{Settings: map[string]string{
		"primary_slot_name": "decoding_standby", "hot_standby_feedback": "on",
	}})
	cfg, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	return standbyPair{primary: primary, standby: standby, standbyDSN: standby.DSN(cfg.Database)}
}

// standbySlot reads the relay's slot on the standby: whether it is streamed, and its confirmed
// position as a number (0 while it has none).
func (p standbyPair) standbySlot(ctx context.Context, slot string) (active bool, confirmed uint64, err error) {
	conn, err := pgx.Connect(ctx, p.standbyDSN)
	if err != nil {
		return false, 0, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT active, coalesce((confirmed_flush_lsn - '0/0')::bigint, 0)
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active, &confirmed)
	return active, confirmed, err
}

// The relay decodes from a hot standby (pg_dsn) and keeps its ledger and heartbeats on the
// primary (primary_dsn): it creates the slot on the standby, delivers every event of a load
// written on the primary once and in per-aggregate order, and, once the outbox is idle, the
// standby's slot still moves up to the primary's end of WAL (the heartbeats written on the
// primary and replayed on the standby give it a position to confirm).
func TestRelayStreamsFromAHotStandby(t *testing.T) {
	for _, version := range []string{"16", "18"} {
		t.Run("PostgreSQL "+version, func(t *testing.T) {
			ctx := context.Background()
			primary := testenv.Postgres(t, devenv.PostgresOptions{Version: version})
			f := newFixture(t, primary, testenv.SharedKafka(t).Brokers(), 2)
			pair := newStandbyPair(t, f, primary)

			cfg := f.config()
			cfg.Replication.DSN = pair.standbyDSN
			cfg.Replication.PrimaryDSN = f.dsn
			cfg.Replication.CreatePublication = false
			cfg.HeartbeatInterval = 200 * time.Millisecond
			done := f.run(cfg)
			await.True(t, 2*time.Minute, "the relay to stream its slot on the standby", func() bool {
				select {
				case err := <-done:
					t.Fatalf("the relay stopped: %v", err)
				default:
				}
				active, confirmed, err := pair.standbySlot(ctx, f.slot)
				return err == nil && active && confirmed > 0
			})

			f.writeMany(ctx, rand.New(rand.NewPCG(4, 4)), 200, 5, 20)
			rep := f.verify(2*time.Minute, false)
			t.Logf("delivered from the standby: %s", rep)

			// Idle outbox: the standby's slot reaches the primary's end of WAL as of now.
			end := f.currentLSN()
			await.True(t, time.Minute, "the standby's slot to be confirmed up to the primary's end of WAL", func() bool {
				_, confirmed, err := pair.standbySlot(ctx, f.slot)
				return err == nil && confirmed >= end
			})
		})
	}
}
