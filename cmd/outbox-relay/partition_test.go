package main

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/netproxy"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// partitionTakeoverBound is the takeover time docs/operations.md states for a leader cut off from
// PostgreSQL without a reset (the lease, leader_check_interval 1s + leader_check_timeout 5s + 2s,
// then up to leader_retry_interval 2s for the standby to try again, then the new leader's start),
// with room for a loaded test machine.
const partitionTakeoverBound = 30 * time.Second

// TestALeaderCutOffFromPostgreSQLIsReplacedWithinTheLease freezes every connection of the leader
// (lock and replication) without closing any: PostgreSQL sees a silent peer, no FIN, no RST. The
// leader must fence itself, PostgreSQL must end its lock session (the lease) so that the standby
// takes over within the stated bound, the old walsender must not keep the slot from the new leader,
// and nothing written meanwhile may be lost or reordered.
func TestALeaderCutOffFromPostgreSQLIsReplacedWithinTheLease(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	ctx := context.Background()
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := netproxy.New(t, u.Host)
	u.Host = p.Addr

	a := f.start("relay-a", map[string]string{"OUTBOX_PG_DSN": withAppName(t, u.String(), "relay-a")})
	f.waitStreamer(t, a, haStartTimeout)
	a.waitLog(t, haStartTimeout, "info", "leader: holding the leader lock")
	b := f.start("relay-b", nil)
	b.waitLog(t, haStartTimeout, "info", "standby: another instance holds the leader lock")
	w := f.startWriter(ctx, 3)
	f.outbox.AwaitMore(t, 150, "before the partition")

	p.Freeze()
	frozen := time.Now()
	f.waitStreamer(t, b, partitionTakeoverBound)
	t.Logf("relay-b streams %s after relay-a was cut off (bound %s)", time.Since(frozen).Round(time.Millisecond), partitionTakeoverBound)
	fenced := a.waitLog(t, fenceBound, "error", "lost the leader lock connection; fencing")
	took := b.waitLog(t, haStartTimeout, "info", "leader: holding the leader lock")
	if fencedAt, tookAt := logTime(t, fenced), logTime(t, took); !fencedAt.Before(tookAt) {
		t.Fatalf("relay-b took the lock at %s, before relay-a fenced itself at %s", tookAt, fencedAt)
	}

	// The old walsender would keep the slot until wal_sender_timeout (60s): the new leader ends it.
	if b.findLog("info", "ended the previous leader's walsender") == nil {
		t.Error("relay-b did not end relay-a's walsender")
	}

	f.outbox.AwaitMore(t, 150, "across the takeover")
	w.stop(t)
	rep := f.verify(t, f.brokers)
	t.Logf("across the partition: %s", rep)
	b.stop(t)
}

// TestANewLeaderThatMayNotEndTheOldWalsenderWaitsForWalSenderTimeout is the fallback: the new
// leader's role may not end the cut-off leader's walsender (a superuser's backend), so it waits
// until PostgreSQL's wal_sender_timeout ends it, standing by meanwhile, and then streams; nothing
// is lost. The lease is short here (leader_check_timeout 1s) so that the lock changes hands well
// before the walsender goes.
func TestANewLeaderThatMayNotEndTheOldWalsenderWaitsForWalSenderTimeout(t *testing.T) {
	const walSenderTimeout = 10 * time.Second
	pg := testenv.Postgres(t, devenv.PostgresOptions{Settings: map[string]string{"wal_sender_timeout": "10s"}})
	f := newHAFixture(t, pg, testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	role := testenv.UniqueName(t, "relay")
	ident := pgx.Identifier{role}.Sanitize()
	for _, s := range []string{
		"CREATE ROLE " + ident + " LOGIN REPLICATION PASSWORD '" + relayRolePassword + "'",
		"GRANT pg_read_all_stats TO " + ident, // it sees who held the lock, so it tries
		"CREATE PUBLICATION " + pgx.Identifier{f.slot}.Sanitize() + " FOR TABLE public.outbox_events WITH (publish = 'insert')",
	} {
		if _, err := f.pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := netproxy.New(t, u.Host)
	u.Host = p.Addr
	short := map[string]string{"OUTBOX_LEADER_CHECK_TIMEOUT": "1s", "OUTBOX_LEADER_RETRY_INTERVAL": "500ms"}
	a := f.start("relay-a", map[string]string{"OUTBOX_PG_DSN": withAppName(t, u.String(), "relay-a"),
		"OUTBOX_LEADER_CHECK_TIMEOUT": "1s"})
	f.waitStreamer(t, a, haStartTimeout)
	short["OUTBOX_PG_DSN"] = withAppName(t, f.roleDSN(t, role), "relay-b")
	short["OUTBOX_CREATE_PUBLICATION"] = "false"
	b := f.start("relay-b", short)
	b.waitLog(t, haStartTimeout, "info", "standby: another instance holds the leader lock")
	w := f.startWriter(ctx, 4)
	f.outbox.AwaitMore(t, 150, "before the partition")

	p.Freeze()
	frozen := time.Now()
	b.waitLog(t, 20*time.Second, "warn", "cannot end the previous leader's walsender")
	f.waitStreamer(t, b, walSenderTimeout+20*time.Second)
	took := time.Since(frozen)
	t.Logf("relay-b streams %s after relay-a was cut off (wal_sender_timeout %s)", took.Round(time.Millisecond), walSenderTimeout)
	// relay-a answered the walsender at most a status interval (1s) before the freeze.
	if took < walSenderTimeout-2*time.Second {
		t.Fatalf("relay-b streamed %s after the freeze, before wal_sender_timeout could end relay-a's walsender: something ended it", took)
	}
	if b.Exited() {
		t.Fatalf("relay-b exited:\n%s", b.Output())
	}
	f.outbox.AwaitMore(t, 150, "after the takeover")
	w.stop(t)
	rep := f.verify(t, f.brokers)
	t.Logf("across the partition: %s", rep)
	b.stop(t)
}

func logTime(t *testing.T, l map[string]any) time.Time {
	t.Helper()
	s, _ := l["ts"].(string)
	ts, err := time.Parse("2006-01-02T15:04:05.000Z0700", s)
	if err != nil {
		t.Fatalf("log line %v: ts: %v", l, err)
	}
	return ts
}
