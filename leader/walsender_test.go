package leader_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/leader"
)

// slotFixture is a database with a logical slot (test_decoding: no publication needed) and an
// ordinary connection to look at it.
type slotFixture struct {
	dsn, slot string
	admin     *pgx.Conn
}

func newSlotFixture(t *testing.T) *slotFixture {
	t.Helper()
	ctx := context.Background()
	f := &slotFixture{dsn: newDatabase(t), slot: testenv.UniqueName(t, "slot")}
	admin, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	f.admin = admin
	if _, err := admin.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", f.slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		admin.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", f.slot)
		for range 50 {
			if _, err := admin.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.slot); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return f
}

// replicationConn opens a replication connection as the relay does (from 127.0.0.1, with the
// relay's default application_name): a walsender that does not stream yet.
func (f *slotFixture) replicationConn(t *testing.T) *pgconn.PgConn {
	t.Helper()
	conn, err := pgconn.Connect(context.Background(), f.dsn+"&replication=database&application_name=outbox-relay")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn.Close(ctx)
	})
	return conn
}

// stream starts a walsender on the slot and returns its backend PID once the slot shows it active.
func (f *slotFixture) stream(t *testing.T) int32 {
	t.Helper()
	conn := f.replicationConn(t)
	if err := pglogrepl.StartReplication(context.Background(), conn, f.slot, 0, pglogrepl.StartReplicationOptions{}); err != nil {
		t.Fatal(err)
	}
	if pid := f.activePID(t); pid != int32(conn.PID()) {
		t.Fatalf("slot active for PID %d, want the walsender %d", pid, conn.PID())
	}
	return int32(conn.PID())
}

// activePID is the slot's active walsender, 0 if none.
func (f *slotFixture) activePID(t *testing.T) int32 {
	t.Helper()
	var pid *int32
	if err := f.admin.QueryRow(context.Background(), "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if pid == nil {
		return 0
	}
	return *pid
}

// waitPublished waits until the lock holder shows the walsender it published.
func (f *slotFixture) waitPublished(t *testing.T, want int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, held, err := leader.LockHolder(context.Background(), f.admin, f.slot)
		if err != nil {
			t.Fatal(err)
		}
		if held && h.WalsenderPID == want {
			if h.ApplicationName != "outbox-relay" {
				t.Fatalf("holder application_name %q: the published PID must not show in it", h.ApplicationName)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader did not publish its walsender %d within 10s: holder %+v (held %v)", want, h, held)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// campaignInBackground starts a campaign and returns where its term arrives.
func campaignInBackground(t *testing.T, el *leader.Elector) <-chan *leader.Term {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	got := make(chan *leader.Term, 1)
	go func() {
		term, err := el.Campaign(ctx)
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("campaign: %v", err)
		}
		got <- term
	}()
	return got
}

func receive(t *testing.T, got <-chan *leader.Term, within time.Duration) *leader.Term {
	t.Helper()
	select {
	case term := <-got:
		if term == nil {
			t.Fatal("the campaign ended without a term")
		}
		return term
	case <-time.After(within):
		t.Fatalf("no term within %s", within)
		return nil
	}
}

// TestANewLeaderEndsOnlyTheWalsenderThePreviousLeaderPublished: a walsender that streams the slot
// from the same client with the same application_name as the leader, but that the leader did not
// publish as its own (a relay with leader_election off, while the elected one waits for the slot),
// survives a change of leader; the walsender the leader published is ended. So also where the
// walsender is taken for another server's than the lock's (WalsenderDSN, decoding on a standby;
// here the same server), where the new leader ends it over a connection of its own.
func TestANewLeaderEndsOnlyTheWalsenderThePreviousLeaderPublished(t *testing.T) {
	for _, tc := range []struct {
		name      string
		published bool
		elsewhere bool // WalsenderDSN set
	}{
		{"outside the election", false, false},
		{"published by the leader", true, false},
		{"published by the leader, the walsender on the WalsenderDSN server", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newSlotFixture(t)
			cfg := leader.Config{DSN: f.dsn, Slot: f.slot, RetryInterval: 100 * time.Millisecond, CheckTimeout: 2 * time.Second}
			if tc.elsewhere {
				cfg.WalsenderDSN = f.dsn
			}
			termA := campaign(t, context.Background(), leader.New(cfg, zaptest.NewLogger(t).Named("a")))
			walsender := f.stream(t)
			if tc.published {
				if err := termA.PublishWalsender(context.Background(), walsender); err != nil {
					t.Fatal(err)
				}
				f.waitPublished(t, walsender)
			} else {
				// The leader's checks run (one statement each), and must publish nothing.
				harness.AwaitStatements(t, f.admin, int32(termA.PID()), 3, "two of the leader's checks")
			}
			core, logs := observer.New(zap.InfoLevel)
			logB := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core)).Named("b")
			got := campaignInBackground(t, leader.New(cfg, logB))
			// Logged once b has read who holds the lock, which makes it end that holder's
			// published walsender when it takes over.
			await.True(t, 10*time.Second, "b stands by and sees a as the holder", func() bool {
				return logs.FilterMessageSnippet("another instance holds the leader lock").Len() > 0
			})
			termA.Release()
			termB := receive(t, got, 10*time.Second)
			defer termB.Release()
			// The new leader waits for the walsender to exit only for what is left of
			// leader_check_timeout (on a loaded machine that may not be enough) and then streaming
			// waits for the slot: what must hold is that the walsender ends, soon, or never.
			deadline := time.Now().Add(10 * time.Second)
			for {
				active := f.activePID(t)
				if !tc.published {
					if active != walsender {
						t.Fatalf("the new leader ended walsender %d, which the previous leader never published (slot active for %d)", walsender, active)
					}
					if time.Now().After(deadline.Add(-8 * time.Second)) {
						break // 2s on, it still streams
					}
				} else if active != walsender {
					break
				} else if time.Now().After(deadline) {
					t.Fatalf("the walsender %d the previous leader published still streams the slot 10s after the new leader took the lock", walsender)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// TestPublishWalsenderReturnsOnceTheNextLeaderCanSeeIt: the relay publishes each replication
// session's walsender before the session uses the slot (replication.Config.OnWalsender), so
// PublishWalsender must return only once the lock holder shows it, not at the next check (here 30s
// away): a leader that stalled in between (a pause, a frozen VM) would leave the next leader a
// walsender it does not know to end, and the slot busy until wal_sender_timeout (60s by default).
// A reconnection's walsender replaces the last; a backend that is no walsender is not published;
// a released term publishes nothing.
func TestPublishWalsenderReturnsOnceTheNextLeaderCanSeeIt(t *testing.T) {
	ctx := context.Background()
	f := newSlotFixture(t)
	term := campaign(t, ctx, leader.New(leader.Config{DSN: f.dsn, Slot: f.slot, CheckInterval: 30 * time.Second,
		CheckTimeout: 2 * time.Second}, zaptest.NewLogger(t)))
	released := false
	defer func() {
		if !released {
			term.Release()
		}
	}()
	holder := func() leader.Holder {
		t.Helper()
		h, held, err := leader.LockHolder(ctx, f.admin, f.slot)
		if err != nil || !held {
			t.Fatalf("LockHolder: %+v held %v (%v)", h, held, err)
		}
		return h
	}
	if h := holder(); h.WalsenderPID != 0 {
		t.Fatalf("nothing published, yet the holder shows %+v", h)
	}
	for i := range 2 { // the first session's walsender, then a reconnection's
		pid := int32(f.replicationConn(t).PID())
		if err := term.PublishWalsender(ctx, pid); err != nil {
			t.Fatalf("session %d: PublishWalsender: %v", i+1, err)
		}
		if h := holder(); h.WalsenderPID != pid || h.ApplicationName != "outbox-relay" {
			t.Fatalf("session %d: PublishWalsender(%d) returned, and the holder shows %+v", i+1, pid, h)
		}
	}
	last := holder().WalsenderPID
	if err := term.PublishWalsender(ctx, int32(f.admin.PgConn().PID())); err != nil {
		t.Fatalf("PublishWalsender of an ordinary backend: %v", err)
	}
	if h := holder(); h.WalsenderPID != last {
		t.Fatalf("an ordinary backend was published: the holder shows %+v, want walsender %d still", h, last)
	}
	select {
	case <-term.Lost():
		t.Fatalf("the term was lost: %v", term.Err())
	default:
	}
	term.Release()
	released = true
	if err := term.PublishWalsender(ctx, last); err == nil {
		t.Fatal("a released term published a walsender")
	}
}

// TestCampaignNeverReturnsATermWhoseLockIsGone: the new leader's server answers slowly (700ms a
// response, leader_check_timeout 2s) and the previous leader's walsender does not exit when told
// to (it is stopped). Ending it must fit in the lease, so that the term Campaign returns holds the
// lock: its session is the holder, and no other elector gets the lock while the term is not lost.
func TestCampaignNeverReturnsATermWhoseLockIsGone(t *testing.T) {
	f := newSlotFixture(t)
	termA := campaign(t, context.Background(), leader.New(leader.Config{DSN: f.dsn, Slot: f.slot, CheckTimeout: time.Second},
		zaptest.NewLogger(t).Named("a")))
	walsender := f.stream(t)
	if err := termA.PublishWalsender(context.Background(), walsender); err != nil {
		t.Fatal(err)
	}
	f.waitPublished(t, walsender)
	// The walsender cannot act on SIGTERM for now, like one stuck on a dead network.
	if err := syscall.Kill(int(walsender), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(int(walsender), syscall.SIGCONT)

	proxied, p := viaProxy(t, f.dsn)
	p.DelayResponses(700 * time.Millisecond)
	obs, logs := observer.New(zap.InfoLevel)
	logB := zaptest.NewLogger(t).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, obs) }))
	got := campaignInBackground(t, leader.New(leader.Config{DSN: proxied, Slot: f.slot, CheckTimeout: 2 * time.Second,
		RetryInterval: 200 * time.Millisecond}, logB.Named("b")))
	// b connects, slowly (about 7 s through the proxy), and must see a hold the lock: a b that
	// first looks after a's release takes a free lock and never ends the walsender, the path this
	// test is for.
	sawA := func() bool {
		return logs.FilterMessageSnippet("another instance holds the leader lock").
			FilterField(zap.Int32("leader_pid", int32(termA.PID()))).Len() > 0
	}
	for deadline := time.Now().Add(time.Minute); !sawA(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b did not see a hold the lock within a minute")
		}
	}
	termA.Release()
	termB := receive(t, got, 30*time.Second)
	defer termB.Release()
	returned := time.Now()
	if logs.FilterMessageSnippet("the previous leader's walsender").Len() == 0 {
		t.Fatal("b took the lock without trying to end a's walsender")
	}
	if h, held, err := leader.LockHolder(context.Background(), f.admin, f.slot); err != nil || !held || uint32(h.PID) != termB.PID() {
		t.Fatalf("Campaign returned a term of backend %d, but the lock holder is %+v (held %v, %v)", termB.PID(), h, held, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	termC, err := leader.New(leader.Config{DSN: f.dsn, Slot: f.slot, CheckTimeout: time.Second, RetryInterval: 20 * time.Millisecond},
		zaptest.NewLogger(t).Named("c")).Campaign(ctx)
	if err == nil {
		defer termC.Release()
		select {
		case <-termB.Lost():
			t.Logf("b's term was lost before c took the lock: %v", termB.Err())
		default:
			t.Fatalf("two terms: c took the lock %s after b's Campaign returned, and b's term is not lost",
				time.Since(returned).Round(time.Millisecond))
		}
	}
	select {
	case <-termB.Lost():
		t.Fatalf("b's term was lost although its checks are answered in time: %v", termB.Err())
	default:
	}
}

// TestPublishWalsenderInFlightEndsWithTheTerm: a publication whose check is in flight when the
// term is released returns at once with an error, instead of waiting for an answer nobody gives.
func TestPublishWalsenderInFlightEndsWithTheTerm(t *testing.T) {
	f := newSlotFixture(t)
	proxied, p := viaProxy(t, f.dsn)
	term := campaign(t, context.Background(), leader.New(leader.Config{DSN: proxied, Slot: f.slot, CheckInterval: 30 * time.Second,
		CheckTimeout: 20 * time.Second}, zaptest.NewLogger(t)))
	pid := int32(f.replicationConn(t).PID())
	p.DelayResponses(10 * time.Second)
	done := make(chan error, 1)
	go func() { done <- term.PublishWalsender(context.Background(), pid) }()
	await.True(t, 10*time.Second, "the publication's check is in flight", func() bool { return p.Held() > 0 })
	released := time.Now()
	term.Release()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a publication cut short by Release succeeded")
		}
		t.Logf("returned %s after Release: %v", time.Since(released).Round(time.Millisecond), err)
	case <-time.After(5 * time.Second):
		t.Fatal("PublishWalsender did not return within 5 s of Release")
	}
}
