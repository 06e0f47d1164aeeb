package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Exactly-once across a failover to an asynchronous standby that was behind, with leader election
// on (the default) and no synchronized_standby_slots. The relay published and committed in Kafka
// transactions the standby never received, so the position in Kafka names an LSN of the old
// timeline that the new one reuses for other transactions. The relay that streams the new primary
// is a new one: the leader's next term (its lock session ended with the old primary) or a process
// started afresh before anything committed on the new timeline. Every event committed on the
// surviving timeline must reach a read_committed consumer: the old timeline's position may skip
// only what lies below the point where the new timeline forked (TIMELINE_HISTORY).
//
// The promoted standby gets the slot the way relay/failover_test.go gives it (created there after
// the promotion, below the old timeline's position), so the test runs on every version.
func TestExactlyOnceAfterAFailoverToALaggingStandbyDeliversEveryEventOfTheNewTimeline(t *testing.T) {
	t.Parallel()
	brokers := testenv.SharedKafka(t).Brokers()
	for _, restart := range []bool{false, true} {
		name := "the leader's next term streams the new primary"
		if restart {
			name = "a relay restarted before the first commit on the new timeline"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eosFailover(t, brokers, restart)
		})
	}
}

func eosFailover(t *testing.T, brokers string, restart bool) {
	ctx := context.Background()
	primary := testenv.Postgres(t)
	f := newHAFixture(t, primary, brokers, 1)
	standby := testenv.Standby(t, primary)
	write := func(ob *harness.Outbox, n int, prefix string) {
		t.Helper()
		for i := range n {
			if err := ob.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: fmt.Sprintf("%s-%d", prefix, i%3)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	current := func(ob *harness.Outbox) uint64 {
		t.Helper()
		lsn, err := harness.CurrentLSN(ctx, ob.Pool())
		if err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	confirmed := func() uint64 {
		lsn, _ := harness.ConfirmedFlushLSN(ctx, f.pool, f.slot)
		return lsn
	}

	a := f.start("relay-a", eosEnv(nil))
	f.waitStreamer(t, a, haStartTimeout)
	write(f.outbox, 3, "before")
	caughtUp := current(f.outbox)
	await.True(t, haDeliverTimeout, "the relay to commit the first events and confirm them", func() bool { return confirmed() >= caughtUp })
	caughtUp = current(f.outbox) // the slot ledger's record of the first commit included
	await.True(t, time.Minute, "the standby to replay the first events and the slot ledger", func() bool {
		conn, err := pgx.Connect(ctx, standby.DSN(f.dbName))
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var replayed uint64
		return conn.QueryRow(ctx, "SELECT (pg_last_wal_replay_lsn() - '0/0')::bigint").Scan(&replayed) == nil && replayed >= caughtUp
	})

	// The standby falls behind; the relay publishes the primary's further writes, commits their
	// position in Kafka and confirms them.
	if err := standby.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	write(f.outbox, 6, "lost")
	if _, err := f.outbox.Pool().Exec(ctx, "CREATE TABLE filler AS SELECT g, repeat('x', 500) AS note FROM generate_series(1, 4000) g"); err != nil {
		t.Fatal(err)
	}
	write(f.outbox, 2, "lost-late")
	end := current(f.outbox)
	await.True(t, haDeliverTimeout, "the relay to commit and confirm the primary's writes", func() bool { return confirmed() >= end })
	oldConfirmed := confirmed()

	// Failover: the primary dies, the standby is promoted (timeline 2), gets the slot and takes
	// over the primary's address.
	if restart {
		a.Kill()
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Exec(ctx, f.dbName, fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", f.slot)); err != nil {
		t.Fatal(err)
	}
	if err := standby.MovePort(ctx, primary.Port()); err != nil {
		t.Fatal(err)
	}
	streaming := a
	if restart {
		streaming = f.start("relay-b", eosEnv(nil))
	}
	f.waitStreamer(t, streaming, 2*haStartTimeout)

	ob, err := harness.NewOutbox(ctx, f.dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	write(ob, 6, "after")
	if after := current(ob); after >= oldConfirmed {
		t.Fatalf("the new primary's writes end at %X, past the old timeline's confirmed %X: the test no longer reuses the old timeline's LSNs", after, oldConfirmed)
	}

	// Every event of the surviving timeline reaches a read_committed consumer, once, in order.
	expected := append(f.outbox.Written()[:3:3], ob.Written()...)
	c := harness.NewCommittedConsumer(brokers, harness.Topics(expected, nil)...)
	defer c.Close()
	readCtx, cancel := context.WithTimeout(ctx, haDeliverTimeout)
	defer cancel()
	readErr := c.ReadUntil(readCtx, 2*time.Second, func(recs []harness.Record) bool {
		return harness.Verify(expected, recs, nil).Missing == 0
	})
	rep := harness.Verify(expected, c.Records(), nil)
	if readErr != nil || rep.Missing > 0 || rep.OrderViolations > 0 || rep.Mismatches > 0 || rep.Duplicates > 0 {
		t.Fatalf("the events committed on the new timeline did not all reach Kafka once, in order (read error: %v): %s\n%s", readErr, rep, streaming.Output())
	}
	t.Logf("read_committed: %s (unknown: the old primary's events the new timeline does not have)", rep)
}
