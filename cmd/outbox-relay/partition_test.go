package main

import (
	"context"
	"net/url"
	"testing"
	"time"

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
	time.Sleep(2 * time.Second)

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

	time.Sleep(2 * time.Second) // the writer goes on across the takeover
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
