package relay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
)

// standbyPair is a primary with the fixture's outbox database and a hot standby of it that
// decodes (PostgreSQL 16+): a physical slot on the primary and hot_standby_feedback, so the
// primary keeps the catalog rows the standby's logical slot needs.
type standbyPair struct {
	primary, standby *devenv.Postgres
	standbyDSN       string // the outbox database on the standby
	primaryDSN       string // primary_dsn: the outbox database on whichever of the two is writable
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
	// The copy restarted the primary: the outbox's pooled connections are gone.
	f.outbox.Pool().Reset()
	cfg, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	// primary_dsn as docs/operations.md advises: both servers, the writable one wanted, so that
	// the ledger, heartbeats and the leader lock follow a promotion.
	primaryDSN := strings.Replace(f.dsn, fmt.Sprintf("127.0.0.1:%d", primary.Port()),
		fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", primary.Port(), standby.Port()), 1) + "&target_session_attrs=read-write"
	return standbyPair{primary: primary, standby: standby, standbyDSN: standby.DSN(cfg.Database), primaryDSN: primaryDSN}
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

// waitStreaming waits until a relay (done: its Run's result) streams slot on the standby, so that
// what is written from then on is after the slot's consistent point.
func (p standbyPair) waitStreaming(t *testing.T, slot string, done <-chan error) {
	t.Helper()
	await.True(t, 2*time.Minute, "the relay to stream its slot on the standby", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the relay stopped: %v", err)
		default:
		}
		active, confirmed, err := p.standbySlot(context.Background(), slot)
		return err == nil && active && confirmed > 0
	})
}

// The relay decodes from a hot standby (pg_dsn) and keeps its ledger and heartbeats on the
// primary (primary_dsn), on PostgreSQL 16 and 18, one primary and standby pair each, in phases:
//
//  0. A primary_dsn leading to the standby itself is refused at the start, fatally, naming it.
//  1. It creates the slot on the standby, backfills the rows written before it (from the slot's
//     snapshot, on the standby) and delivers every event of a load written on the primary once and
//     in per-aggregate order; once the outbox is idle, the standby's slot still moves up to the
//     primary's end of WAL (the heartbeats written on the primary and replayed on the standby give
//     it a position to confirm). Restarted, it streams the existing slot on.
//  2. A recovery conflict invalidates the slot (hot_standby_feedback turned off, and the primary's
//     vacuum removing catalog rows the slot still needs): a lost slot, so with on_slot_lost at its
//     default (stop) the relay stops with replication.ErrSlotLost, loudly, and names the conflict
//     (on PostgreSQL 16, wal_status "lost" alone read as WAL removed).
//  3. With the feedback back and a new slot, the standby is promoted mid-stream: the relay goes on
//     streaming the same slot from it and publishes what is written there.
func TestRelayDecodesFromAHotStandby(t *testing.T) {
	for _, version := range []string{"16", "18"} {
		t.Run("PostgreSQL "+version, func(t *testing.T) {
			t.Parallel() // each version has its own primary and standby; they share only the broker
			ctx := context.Background()
			primary := testenv.Postgres(t, devenv.PostgresOptions{Version: version})
			f := newFixture(t, primary, testenv.SharedKafka(t).Brokers(), 2)
			pair := newStandbyPair(t, f, primary)

			// 0. primary_dsn leading to the standby by mistake: refused at once, in one line.
			cfg := f.config()
			cfg.Replication.DSN = pair.standbyDSN
			cfg.Replication.PrimaryDSN = pair.standbyDSN
			mistaken, _ := runUntilStopped(t, cfg)
			select {
			case err := <-mistaken:
				if !replication.IsFatal(err) || !strings.Contains(err.Error(), "primary_dsn leads to a standby") {
					t.Fatalf("with primary_dsn leading to the standby, the relay stopped with %v; want a fatal error naming primary_dsn", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("with primary_dsn leading to the standby, the relay did not stop within a minute")
			}

			// 1. Load, then idle.
			cfg.Replication.PrimaryDSN = pair.primaryDSN
			cfg.Replication.CreatePublication = false
			cfg.HeartbeatInterval = 200 * time.Millisecond
			cfg.Backfill = &relay.Backfill{}
			rng := rand.New(rand.NewPCG(4, 4))
			f.writeMany(ctx, rng, 10, 3, 20) // before the slot: the backfill's, read on the standby
			first, stopFirst := runUntilStopped(t, cfg)
			pair.waitStreaming(t, f.slot, first)
			f.writeMany(ctx, rng, 200, 5, 20)
			rep := f.verify(2*time.Minute, false)
			t.Logf("delivered from the standby: %s", rep)
			end := f.currentLSN()
			await.True(t, time.Minute, "the standby's slot to be confirmed up to the primary's end of WAL", func() bool {
				_, confirmed, err := pair.standbySlot(ctx, f.slot)
				return err == nil && confirmed >= end
			})
			stopFirst()
			if err := <-first; err != nil {
				t.Fatalf("the first run ended with %v", err)
			}
			// A restart streams the existing slot on the standby.
			again, stopAgain := runUntilStopped(t, cfg)
			f.writeMany(ctx, rng, 20, 3, 20)
			f.verify(2*time.Minute, false)
			stopAgain()
			if err := <-again; err != nil {
				t.Fatalf("the restarted run ended with %v", err)
			}

			// 2. The conflict.
			pair.setFeedback(t, "off")
			await.True(t, time.Minute, "the primary to forget the standby's xmin", func() bool {
				var held bool
				err := f.outbox.Pool().QueryRow(ctx, "SELECT xmin IS NOT NULL OR catalog_xmin IS NOT NULL FROM pg_replication_slots WHERE slot_name = 'decoding_standby'").Scan(&held)
				return err == nil && !held
			})
			f.exec(ctx, "CREATE TABLE conflict_victim (id int)", "DROP TABLE conflict_victim", "VACUUM pg_class, pg_attribute, pg_type")
			await.True(t, time.Minute, "the standby to invalidate the slot", func() bool {
				var conflicting bool
				err := queryOn(ctx, pair.standby, f.dsn, "SELECT coalesce(conflicting, false) FROM pg_replication_slots WHERE slot_name = '"+f.slot+"'", &conflicting)
				return err == nil && conflicting
			})
			second, _ := runUntilStopped(t, cfg)
			select {
			case err := <-second:
				if !errors.Is(err, replication.ErrSlotLost) {
					t.Fatalf("the relay stopped with %v; want replication.ErrSlotLost", err)
				}
				if !strings.Contains(err.Error(), "rows_removed") {
					t.Fatalf("the relay stopped with %v, which does not name the recovery conflict (rows_removed)", err)
				}
				t.Logf("the relay stopped: %v", err)
			case <-time.After(2 * time.Minute):
				t.Fatal("the relay did not stop within 2 minutes on a slot the standby invalidated")
			}

			// 3. A new slot, then the promotion. The primary goes away, the standby (slot and all)
			// takes the writes, and the relay goes on streaming the same slot from it (the same
			// cluster, its next timeline); the old primary's heartbeats and ledger fail meanwhile,
			// which costs warnings, not events.
			pair.setFeedback(t, "on")
			cfg.Replication.Slot = f.slot + "_2"
			cfg.Backfill = nil // the rows are in Kafka already
			pair.waitStreaming(t, cfg.Replication.Slot, f.run(cfg))
			if err := primary.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if err := pair.standby.Promote(ctx); err != nil {
				t.Fatal(err)
			}
			promoted, err := harness.NewOutbox(ctx, pair.standbyDSN, "public.outbox_events")
			if err != nil {
				t.Fatal(err)
			}
			defer promoted.Close()
			for i := range 30 {
				if err := promoted.WriteTx(ctx, harness.Spec{AggregateType: f.types[i%2], AggregateID: fmt.Sprintf("promoted-%d", i%5)}); err != nil {
					t.Fatal(err)
				}
			}
			c := harness.NewConsumer(f.brokers, harness.Topics(promoted.Written(), nil)...)
			defer c.Close()
			readCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			readErr := c.ReadUntil(readCtx, time.Second, func(recs []harness.Record) bool {
				return harness.Verify(promoted.Written(), recs, nil).Missing == 0
			})
			if rep := harness.Verify(promoted.Written(), c.Records(), nil); readErr != nil || rep.Missing > 0 || rep.OrderViolations > 0 {
				t.Fatalf("events written on the promoted standby (read error: %v): %s", readErr, rep)
			}
		})
	}
}

// setFeedback turns the standby's hot_standby_feedback on or off.
func (p standbyPair) setFeedback(t *testing.T, value string) {
	t.Helper()
	for _, sql := range []string{"ALTER SYSTEM SET hot_standby_feedback = " + value, "SELECT pg_reload_conf()"} {
		if err := p.standby.Exec(context.Background(), "postgres", sql); err != nil {
			t.Fatal(err)
		}
	}
}

// runUntilStopped runs a relay until stop is called (or the test ends); done receives Run's result.
func runUntilStopped(t *testing.T, cfg relay.Config) (done <-chan error, stop func()) {
	t.Helper()
	r, err := relay.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- r.Run(ctx) }()
	t.Cleanup(cancel)
	return ch, cancel
}
