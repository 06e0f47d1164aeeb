package relay_test

import (
	"context"
	"fmt"
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
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
)

// A failover to an asynchronous standby that was behind: the new primary's timeline reuses LSNs the
// old primary had already passed, and the relay had published and confirmed up to one of those.
// Every event committed on the new primary must still be published, and no position learned on the
// old timeline may be confirmed to the new primary.
//
// Logical slots exist on a promoted standby only as failover slots (PostgreSQL 17); on older
// servers the test creates the slot on the promoted standby itself, as a failover slot synchronised
// before the old primary's last writes would be.
func TestFailoverToAStandbyThatWasBehindPublishesTheNewTimeline(t *testing.T) {
	ctx := context.Background()
	primary := testenv.Postgres(t)
	f := newFixture(t, primary, testenv.SharedKafka(t).Brokers(), 1)
	standby := testenv.Standby(t, primary)
	f.start(f.config())

	write := func(ob *harness.Outbox, n int, prefix string) {
		t.Helper()
		for i := range n {
			if err := ob.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: fmt.Sprintf("%s-%d", prefix, i%3)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(f.outbox, 3, "before")
	f.verify(time.Minute, false)
	caughtUp := f.currentLSN()
	await.True(t, time.Minute, "the standby to replay the relay's slot ledger and the first events", func() bool {
		var replayed uint64
		err := queryOn(ctx, standby, f.dsn, "SELECT (pg_last_wal_replay_lsn() - '0/0')::bigint", &replayed)
		return err == nil && replayed >= caughtUp
	})

	// The standby falls behind; the relay publishes and confirms the primary's further writes.
	if err := standby.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	write(f.outbox, 10, "lost")
	if _, err := f.outbox.Pool().Exec(ctx, "CREATE TABLE filler AS SELECT g, repeat('x', 500) AS note FROM generate_series(1, 4000) g"); err != nil {
		t.Fatal(err)
	}
	write(f.outbox, 2, "lost-late")
	end := f.currentLSN()
	await.True(t, time.Minute, "the relay to confirm the primary's writes", func() bool { return f.confirmedLSN() >= end })
	oldConfirmed := f.confirmedLSN()
	lostWritten := len(f.outbox.Written())

	// Failover: the primary goes away, the standby is promoted (timeline 2) with the slot, and takes
	// over the primary's address.
	if err := primary.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var created string
	if err := queryOn(ctx, standby, f.dsn, fmt.Sprintf("SELECT lsn::text FROM pg_create_logical_replication_slot('%s', 'pgoutput')", f.slot), &created); err != nil {
		t.Fatal(err)
	}
	if err := standby.MovePort(ctx, primary.Port()); err != nil {
		t.Fatal(err)
	}
	ob, err := harness.NewOutbox(ctx, f.dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	f.waitSlotActiveOn(ob)
	write(ob, 5, "after")
	after, err := harness.CurrentLSN(ctx, ob.Pool())
	if err != nil {
		t.Fatal(err)
	}
	if after >= oldConfirmed {
		t.Fatalf("the new primary's writes end at %X, past the old timeline's confirmed %X: the test no longer reuses old LSNs", after, oldConfirmed)
	}

	// Every event the new primary has arrives: the ones from before the divergence (maybe again),
	// and the new ones, although their LSNs are below what the relay had confirmed on the old timeline.
	all := append(f.outbox.Written()[:3:3], ob.Written()...)
	c := harness.NewConsumer(f.brokers, harness.Topics(all, nil)...)
	defer c.Close()
	readCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	readErr := c.ReadUntil(readCtx, time.Second, func(recs []harness.Record) bool {
		return harness.Verify(ob.Written(), recs, nil).Missing == 0
	})
	if rep := harness.Verify(ob.Written(), c.Records(), nil); readErr != nil || rep.Missing > 0 {
		t.Fatalf("events committed on the new primary were not all published (read error: %v): %s", readErr, rep)
	}
	t.Logf("%d events written on the old primary only, %d on the new one", lostWritten-3, len(ob.Written()))

	// The slot on the new primary is confirmed up to its own writes, never to the old timeline's.
	var confirmed uint64
	await.True(t, 30*time.Second, "the new primary's slot to be confirmed past its writes", func() bool {
		var err error
		confirmed, err = harness.ConfirmedFlushLSN(ctx, ob.Pool(), f.slot)
		if err != nil {
			t.Fatal(err)
		}
		if confirmed > after {
			current, _ := harness.CurrentLSN(ctx, ob.Pool())
			if confirmed > current {
				t.Fatalf("the new primary's slot was confirmed at %X, beyond its own WAL (%X): a position of the old timeline (confirmed there: %X)", confirmed, current, oldConfirmed)
			}
		}
		return confirmed >= after
	})
}

// waitSlotActiveOn waits until the relay streams the slot of the server ob writes to.
func (f *fixture) waitSlotActiveOn(ob *harness.Outbox) {
	f.t.Helper()
	await.True(f.t, 2*time.Minute, "the relay to stream from the new primary", func() bool {
		var active bool
		err := ob.Pool().QueryRow(context.Background(), "SELECT active AND confirmed_flush_lsn IS NOT NULL FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&active)
		return err == nil && active
	})
}

// queryOn runs a one-row query on pg, in the database of dsn.
func queryOn(ctx context.Context, pg *devenv.Postgres, dsn string, sql string, dest ...any) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, pg.DSN(cfg.Database))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// When pg_dsn comes to lead to another database cluster (a DNS or configuration mistake, a
// restored copy), a slot of the same name there is not the slot the relay streamed: it must stop
// with an error that says so, and confirm nothing to that slot.
func TestRelayRefusesToStreamFromAnotherCluster(t *testing.T) {
	ctx := context.Background()
	first := testenv.Postgres(t)
	f := newFixture(t, first, testenv.SharedKafka(t).Brokers(), 1)
	r, err := relay.New(f.config(), zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	f.waitSlotActive()
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "a"}); err != nil {
		t.Fatal(err)
	}
	f.verify(time.Minute, false)
	end := f.currentLSN()
	await.True(t, time.Minute, "the relay to confirm its writes", func() bool { return f.confirmedLSN() >= end })

	// Another cluster, with the same database, outbox table and slot name, takes the address.
	second := testenv.Postgres(t)
	cfg, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	secondDSN, err := second.CreateDatabase(ctx, cfg.Database)
	if err != nil {
		t.Fatal(err)
	}
	var created uint64
	if err := func() error {
		conn, err := pgx.Connect(ctx, secondDSN)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		// Another cluster's outbox table rarely has the OID of the first one's: a table created
		// before it shifts the OIDs, so the relay cannot mistake the other cluster for a recreated
		// outbox table.
		if _, err := conn.Exec(ctx, "CREATE TABLE shifts_the_oids (id int)"); err != nil {
			return err
		}
		if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
			return err
		}
		if _, err = conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
			return err
		}
		created, err = harness.ConfirmedFlushLSN(ctx, conn, f.slot)
		return err
	}(); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.MovePort(ctx, first.Port()); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	deadline := time.After(2 * time.Minute)
	for {
		select {
		case err := <-done:
			if !replication.IsFatal(err) || !strings.Contains(err.Error(), "another database cluster") {
				t.Fatalf("Run = %v, want a fatal error saying pg_dsn leads to another database cluster", err)
			}
			if got, err := harness.ConfirmedFlushLSN(ctx, conn, f.slot); err != nil || got != created {
				t.Fatalf("the other cluster's slot is confirmed at %X (%v), want it untouched at %X", got, err, created)
			}
			return
		case <-deadline:
			t.Fatal("the relay kept running against another cluster")
		case <-time.After(100 * time.Millisecond):
			if got, err := harness.ConfirmedFlushLSN(ctx, conn, f.slot); err == nil && got != created {
				t.Fatalf("the relay confirmed %X to another cluster's slot (created at %X)", got, created)
			}
		}
	}
}
