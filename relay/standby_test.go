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
	physicalSlot     string // the standby's slot on the primary
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
	return pairOf(t, f, primary, standby, "decoding_standby")
}

// pairOf describes primary and standby, which streams through the physical slot physicalSlot.
func pairOf(t *testing.T, f *fixture, primary, standby *devenv.Postgres, physicalSlot string) standbyPair {
	t.Helper()
	cfg, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	// primary_dsn as docs/operations.md advises: both servers, the writable one wanted, so that
	// the ledger, heartbeats and the leader lock follow a promotion.
	primaryDSN := strings.Replace(f.dsn, fmt.Sprintf("127.0.0.1:%d", primary.Port()),
		fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", primary.Port(), standby.Port()), 1) + "&target_session_attrs=read-write"
	return standbyPair{primary: primary, standby: standby, physicalSlot: physicalSlot, standbyDSN: standby.DSN(cfg.Database), primaryDSN: primaryDSN}
}

// replaceStandby is the standby lost and a new one cloned from the primary (an online base
// backup, as pg_basebackup takes one) through a physical slot of its own: the relay's logical
// slot is not on it. The lost standby's physical slot is dropped on the primary.
func (p standbyPair) replaceStandby(t *testing.T, f *fixture) standbyPair {
	t.Helper()
	ctx := context.Background()
	if err := p.standby.StopImmediate(ctx); err != nil {
		t.Fatal(err)
	}
	next := p.physicalSlot + "_next"
	for _, sql := range []string{"SELECT pg_drop_replication_slot('" + p.physicalSlot + "')",
		"SELECT pg_create_physical_replication_slot('" + next + "', true)"} {
		if err := p.primary.Exec(ctx, "postgres", sql); err != nil {
			t.Fatal(err)
		}
	}
	clone := testenv.StandbyOnline(t, p.primary, devenv.PostgresOptions{Settings: map[string]string{
		"primary_slot_name": next, "hot_standby_feedback": "on",
	}})
	return pairOf(t, f, p.primary, clone, next)
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
//     it a position to confirm). The standby restarted under it (fast, then immediate) while
//     the primary takes writes: it reconnects and loses nothing, in order. Restarted, it streams
//     the existing slot on. The standby lost while it streams (slot and all) and the relay pointed
//     at a new standby cloned from the primary: on_slot_lost at its default refuses in one line,
//     recover publishes the gap from the table (the restarts and the loss on standbyFaultsOn only).
//  2. A recovery conflict invalidates the slot (hot_standby_feedback turned off, and the primary's
//     vacuum removing catalog rows the slot still needs): a lost slot, so with on_slot_lost at its
//     default (stop) the relay stops with replication.ErrSlotLost, loudly, and names the conflict
//     (on PostgreSQL 16, wal_status "lost" alone read as WAL removed). With on_slot_lost: recover
//     it drops the invalidated slot on the standby, replaces it, and publishes the gap written
//     meanwhile from the table, losing nothing and repeating only rows at or past the ledger's
//     horizon.
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
			dups := 0 // delivered twice so far
			if version == standbyFaultsOn {
				dups = pair.restartUnderLoad(t, f, first)
			}
			stopFirst()
			if err := <-first; err != nil {
				t.Fatalf("the first run ended with %v", err)
			}
			// A restart streams the existing slot on the standby.
			again, stopAgain := runUntilStopped(t, cfg)
			f.writeMany(ctx, rng, 20, 3, 20)
			if rep := f.verify(2*time.Minute, true); rep.Duplicates > dups {
				t.Fatalf("the restarted relay delivered events twice: %s", rep)
			}
			if version == standbyFaultsOn {
				// 1c. The standby lost while the relay streams; it is pointed at a new one.
				pair, dups = pair.lose(t, f, &cfg, again, stopAgain, rng, dups)
			} else {
				stopAgain()
				if err := <-again; err != nil {
					t.Fatalf("the restarted run ended with %v", err)
				}
			}

			// 2. The conflict.
			pair.setFeedback(t, "off")
			await.True(t, time.Minute, "the primary to forget the standby's xmin", func() bool {
				var held bool
				err := f.outbox.Pool().QueryRow(ctx, "SELECT xmin IS NOT NULL OR catalog_xmin IS NOT NULL FROM pg_replication_slots WHERE slot_name = $1", pair.physicalSlot).Scan(&held)
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
			// With on_slot_lost: recover the invalidated slot is dropped (on the standby, where it
			// is) and replaced, and its gap, written meanwhile, published from the table.
			pair.setFeedback(t, "on")
			mayRepeat := f.fromHorizon(ctx)
			f.writeMany(ctx, rng, 20, 3, 20)
			recovering := cfg
			recovering.Replication.OnSlotLost = replication.SlotLostRecover
			recovered, stopRecovered := runUntilStopped(t, recovering)
			pair.waitStreaming(t, f.slot, recovered)
			rep = f.verify(2*time.Minute, true)
			t.Logf("recovered the invalidated slot's gap: %s", rep)
			if rep.Duplicates-dups > mayRepeat {
				t.Fatalf("the recovery delivered %d events twice, more than the %d acknowledged ones at or past the horizon in the slot ledger: %s", rep.Duplicates-dups, mayRepeat, rep)
			}
			stopRecovered()
			if err := <-recovered; err != nil {
				t.Fatalf("the recovering run ended with %v", err)
			}

			// 3. A new slot, then the promotion. The primary goes away, the standby (slot and all)
			// takes the writes, and the relay goes on streaming the same slot from it (the same
			// cluster, its next timeline); the old primary's heartbeats and ledger fail meanwhile,
			// which costs warnings, not events.
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

// standbyFaultsOn is the version the standby's own failures run on (restarts, loss), once: what
// they exercise (reconnecting to the standby, a slot missing from a new standby, recovery from
// the table) asks nothing of the server that differs between 16 and 18, and the differences that
// matter (how a conflict shows in pg_replication_slots) are covered on both by phase 2.
const standbyFaultsOn = "18"

// restartUnderLoad restarts the standby under the relay (done: its Run's result), in fast then in
// immediate mode, while writers go on on the primary: the relay reconnects to it, loses nothing,
// keeps each aggregate's order, and publishes again at most what was written meanwhile.
func (p standbyPair) restartUnderLoad(t *testing.T, f *fixture, done <-chan error) (duplicates int) {
	t.Helper()
	ctx := context.Background()
	before := f.outbox.Count()
	load := harness.StartLoad(f.outbox, harness.LoadConfig{Types: f.types, Writers: 2, Aggregates: 10, MaxPerTx: 3, TxPerSecond: 20, Seed: 7})
	for _, restart := range []struct {
		mode string
		stop func(context.Context) error
	}{{"fast", p.standby.Stop}, {"immediate", p.standby.StopImmediate}} {
		f.outbox.AwaitMore(t, 20, "before the standby's "+restart.mode+" restart")
		if err := restart.stop(ctx); err != nil {
			t.Fatalf("stop the standby (%s): %v", restart.mode, err)
		}
		f.outbox.AwaitMore(t, 20, "while the standby is down") // the primary takes writes
		if err := p.standby.Start(ctx); err != nil {
			t.Fatalf("start the standby again (%s): %v", restart.mode, err)
		}
		p.waitStreaming(t, f.slot, done)
	}
	f.outbox.AwaitMore(t, 20, "after the standby's restarts")
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := f.verify(2*time.Minute, true)
	during := f.outbox.Count() - before
	t.Logf("across the standby's restarts (%s): %s", stats, rep)
	if rep.Duplicates > during {
		t.Fatalf("%d duplicates across the standby's restarts, more than the %d events written across them", rep.Duplicates, during)
	}
	return rep.Duplicates
}

// lose loses the standby (and the relay's slot with it) under the relay (done, stop: its run),
// while the primary takes writes, and points the relay (cfg) at a new standby cloned from the
// primary, where the slot does not exist: with on_slot_lost at its default the relay refuses in
// one line naming the lost slot; with recover it publishes the gap from the outbox table, losing
// nothing, and republishes at most the events at or past the horizon the slot ledger recorded
// (dups: the duplicates delivered before). It returns the new pair, with cfg leading to it, and the
// duplicates delivered so far.
func (p standbyPair) lose(t *testing.T, f *fixture, cfg *relay.Config, done <-chan error, stop func(), rng *rand.Rand, dups int) (standbyPair, int) {
	t.Helper()
	ctx := context.Background()
	// The ledger (on the primary) records how far Kafka acknowledged every few seconds; the
	// recovery publishes again from there (and from the oldest transaction then running). A last
	// transaction, once recorded, makes that point known: everything before the loss.
	before := f.currentLSN()
	f.writeMany(ctx, rng, 1, 1, 20)
	await.True(t, time.Minute, "the ledger to record the last transaction as acknowledged", func() bool {
		var recorded uint64
		err := f.outbox.Pool().QueryRow(ctx, "SELECT coalesce((confirmed_end_lsn - '0/0')::bigint, 0) FROM "+replication.LedgerTable+" WHERE slot = $1", f.slot).Scan(&recorded)
		return err == nil && recorded > before
	})
	mayRepeat := f.fromHorizon(ctx)
	next := p.replaceStandby(t, f)
	f.writeMany(ctx, rng, 30, 3, 20) // the gap: committed while no standby decodes it
	stop()
	t.Logf("the relay on the lost standby ended with %v", <-done)

	cfg.Replication.DSN, cfg.Replication.PrimaryDSN = next.standbyDSN, next.primaryDSN
	refused, _ := runUntilStopped(t, *cfg)
	select {
	case err := <-refused:
		if !errors.Is(err, replication.ErrSlotLost) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), f.slot) ||
			!strings.Contains(err.Error(), "a new or rebuilt standby") || !strings.Contains(err.Error(), "on_slot_lost: recover") {
			t.Fatalf("on a new standby without the slot the relay stopped with %q; want one line of replication.ErrSlotLost naming slot %s, the new standby as a cause and on_slot_lost: recover as a fix", err, f.slot)
		}
		t.Logf("on the new standby, on_slot_lost stop: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("on a new standby without the slot the relay did not stop within 2 minutes")
	}

	rcfg := *cfg
	rcfg.Replication.OnSlotLost = replication.SlotLostRecover
	recovering, stopRecovering := runUntilStopped(t, rcfg)
	next.waitStreaming(t, f.slot, recovering)
	rep := f.verify(2*time.Minute, true)
	t.Logf("recovered on the new standby: %s", rep)
	if rep.Duplicates-dups > mayRepeat {
		t.Fatalf("the recovery delivered %d events twice, more than the %d acknowledged ones at or past the horizon in the slot ledger: %s", rep.Duplicates-dups, mayRepeat, rep)
	}
	stopRecovering()
	if err := <-recovering; err != nil {
		t.Fatalf("the recovering run ended with %v", err)
	}
	return next, rep.Duplicates
}

// fromHorizon counts the outbox rows at or past the horizon the slot ledger records with the
// last acknowledged commit: written by that transaction id or a later one. Once Kafka holds them
// all, a recovery publishes no more than these again.
func (f *fixture) fromHorizon(ctx context.Context) int {
	f.t.Helper()
	var n int
	err := f.outbox.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE xmin::text::bigint >=
		(SELECT confirmed_xmin::text::bigint % 4294967296 FROM `+replication.LedgerTable+` WHERE slot = $1)`, f.slot).Scan(&n)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}
