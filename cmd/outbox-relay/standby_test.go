package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// standbyStreamer says which application streams the fixture's slot on standby ("" when nothing
// does), as streamer does on the primary.
func (f *haFixture) standbyStreamer(ctx context.Context, standby *devenv.Postgres) (app string, pid int32) {
	conn, err := pgx.Connect(ctx, standby.DSN(f.dbName))
	if err != nil {
		return "", 0
	}
	defer conn.Close(ctx)
	var a *string
	var p *int32
	err = conn.QueryRow(ctx, `SELECT a.application_name, s.active_pid FROM pg_replication_slots s
		LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1 AND s.active AND s.confirmed_flush_lsn IS NOT NULL`, f.slot).Scan(&a, &p)
	if err != nil || p == nil {
		return "", 0
	}
	if a != nil {
		app = *a
	}
	return app, *p
}

// TestTwoInstancesDecodingOnAStandbyTakeOverThroughTheLockOnThePrimary: `outbox-relay run` twice
// with pg_dsn leading to a hot standby and primary_dsn to its primary, leader_dsn empty: the
// leader lock is taken on the primary (a standby's advisory locks are its own, and each instance
// would lead alone on its standby), the leader streams the slot on the standby, the other stands
// by; the leader killed (-9) under writes on the primary, the other takes the lock and streams
// the slot on the standby; that one paused (SIGSTOP), a third takes over past the lease, ending
// the paused leader's walsender on the standby; nothing is lost or reordered. One cluster version (the default):
// what differs between 16 and 18 is the relay package's TestRelayDecodesFromAHotStandby's.
func TestTwoInstancesDecodingOnAStandbyTakeOverThroughTheLockOnThePrimary(t *testing.T) {
	ctx := context.Background()
	primary := testenv.Postgres(t)
	if v, err := primary.Version(); err != nil || v < "16" {
		t.Fatalf("decoding on a standby needs PostgreSQL 16 or later; the test cluster is %q (%v)", v, err)
	}
	f := newHAFixture(t, primary, testenv.SharedKafka(t).Brokers(), 2)
	// A standby cannot create the publication: migrate makes it on the primary.
	if _, err := f.pool.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox_events WITH (publish = 'insert')", f.slot)); err != nil {
		t.Fatal(err)
	}
	if err := primary.Exec(ctx, "postgres", "SELECT pg_create_physical_replication_slot('relays_standby', true)"); err != nil {
		t.Fatal(err)
	}
	standby := testenv.StandbyOnline(t, primary, devenv.PostgresOptions{Settings: map[string]string{
		"primary_slot_name": "relays_standby", "hot_standby_feedback": "on",
	}})
	extra := func(name string) map[string]string {
		return map[string]string{
			"OUTBOX_PG_DSN":             withAppName(t, standby.DSN(f.dbName), name),
			"OUTBOX_PRIMARY_DSN":        withAppName(t, f.dsn, name),
			"OUTBOX_CREATE_PUBLICATION": "false",
			"OUTBOX_HEARTBEAT_INTERVAL": "1s",
		}
	}
	waitStandbyStreamer := func(r *instance, timeout time.Duration) {
		t.Helper()
		await.True(t, timeout, r.name+" streams the slot on the standby", func() bool {
			if r.Exited() {
				t.Fatalf("%s exited:\n%s", r.name, r.Output())
			}
			app, _ := f.standbyStreamer(ctx, standby)
			return app == r.name
		})
	}

	a := f.start("relay-a", extra("relay-a"))
	waitStandbyStreamer(a, haStartTimeout)
	a.waitLog(t, haStartTimeout, "info", "leader: holding the leader lock")
	if f.lockHolder(t) == 0 {
		t.Fatal("relay-a leads, but the primary shows no leader lock: it was taken elsewhere (on the standby?)")
	}
	b := f.start("relay-b", extra("relay-b"))
	b.waitLog(t, haStartTimeout, "info", "standby: another instance holds the leader lock")

	w := f.startWriter(ctx, 3)
	f.outbox.AwaitMore(t, 100, "while both run")
	if app, _ := f.standbyStreamer(ctx, standby); app != "relay-a" {
		t.Fatalf("slot streamed by %q on the standby while relay-a leads", app)
	}
	if l := b.findLog("", "replication interrupted"); l != nil {
		t.Fatalf("the standing-by instance touched the slot: %v", l)
	}

	killed := time.Now()
	a.Kill()
	waitStandbyStreamer(b, takeoverBound)
	t.Logf("relay-b streams on the standby %s after relay-a was killed (bound %s)", time.Since(killed).Round(time.Millisecond), takeoverBound)
	b.waitLog(t, haStartTimeout, "info", "leader: holding the leader lock")

	f.outbox.AwaitMore(t, 100, "across the takeover")

	// The leader cut off (paused) instead: its walsender on the standby keeps the slot until the
	// standby's wal_sender_timeout (60 s), unless the next leader, once the primary has ended
	// the paused leader's lock session (the lease), ends that walsender on the standby.
	c := f.start("relay-c", extra("relay-c"))
	c.waitLog(t, haStartTimeout, "info", "standby: another instance holds the leader lock")
	paused := time.Now()
	if err := syscall.Kill(b.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(b.PID(), syscall.SIGCONT) })
	waitStandbyStreamer(c, pausedTakeoverBound)
	t.Logf("relay-c streams on the standby %s after relay-b was paused (bound %s)", time.Since(paused).Round(time.Millisecond), pausedTakeoverBound)
	c.waitLog(t, haStartTimeout, "info", "ended the previous leader's walsender on pg_dsn")
	b.Kill() // a paused leader that resumes is the fence's business, not this test's
	f.outbox.AwaitMore(t, 100, "across the second takeover")
	w.stop(t)
	rep := f.verify(t, f.brokers)
	t.Logf("across the takeovers: %s", rep)
	c.stop(t)
}

// pausedTakeoverBound is how soon after a leader decoding on a standby is paused the next one
// streams there: the lease (13 s with the defaults) and a retry (2 s), with room for a loaded
// machine, below the standby's wal_sender_timeout (60 s), which a takeover that cannot end the
// paused leader's walsender waits for.
const pausedTakeoverBound = 40 * time.Second
