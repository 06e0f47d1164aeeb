package leader_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/netproxy"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/leader"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newDatabase(t *testing.T) string {
	t.Helper()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(context.Background(), testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

func campaign(t *testing.T, ctx context.Context, el *leader.Elector) *leader.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	term, err := el.Campaign(ctx)
	if err != nil {
		t.Fatalf("campaign: %v", err)
	}
	return term
}

func TestKeysDifferBySlotAndAreStable(t *testing.T) {
	if leader.Key("a") == leader.Key("b") {
		t.Fatal("slots a and b share a lock key")
	}
	if leader.Key("outbox_relay") != leader.Key("outbox_relay") {
		t.Fatal("key is not deterministic")
	}
}

func TestOneElectorLeadsAndTheOtherTakesOverWhenItReleases(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	slot := testenv.UniqueName(t, "slot")
	a := leader.New(leader.Config{DSN: dsn, Slot: slot, RetryInterval: 100 * time.Millisecond}, zaptest.NewLogger(t))
	termA := campaign(t, ctx, a)

	var standbyConnected atomic.Bool
	var attempts atomic.Int32
	b := leader.New(leader.Config{DSN: dsn, Slot: slot, RetryInterval: 100 * time.Millisecond,
		OnStandby: standbyConnected.Store, BeforeLock: func(context.Context, bool) error { attempts.Add(1); return nil }}, zaptest.NewLogger(t))
	got := make(chan *leader.Term, 1)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		term, _ := b.Campaign(bctx)
		got <- term
	}()
	// BeforeLock runs before each attempt: by the third, two attempts found the lock held.
	await.State(t, time.Minute, "three attempts by the second elector", func() (bool, string) {
		select {
		case <-got:
			t.Fatal("a second elector took the lock while the first held it")
		default:
		}
		return attempts.Load() >= 3, fmt.Sprintf("%d attempts", attempts.Load())
	})
	if !standbyConnected.Load() {
		t.Fatal("the waiting elector did not report itself as a connected standby")
	}

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	holder, held, err := leader.LockHolder(ctx, conn, slot)
	if err != nil || !held || uint32(holder.PID) != termA.PID() {
		t.Fatalf("LockHolder = %+v, %v, %v; want pid %d", holder, held, err, termA.PID())
	}
	if holder.ApplicationName != "outbox-relay" || holder.ClientAddr != "127.0.0.1" {
		t.Errorf("holder application_name %q client %q, want outbox-relay from 127.0.0.1", holder.ApplicationName, holder.ClientAddr)
	}
	if _, held, _ := leader.LockHolder(ctx, conn, slot+"_other"); held {
		t.Error("another slot's lock reads as held")
	}

	released := time.Now()
	termA.Release()
	select {
	case termB := <-got:
		if termB == nil {
			t.Fatal("the standby's campaign failed")
		}
		t.Logf("standby took over %s after the release", time.Since(released).Round(time.Millisecond))
		termB.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("the standby did not take the lock within 5s of its release")
	}
}

func TestATermIsLostWithinSecondsWhenItsBackendIsTerminated(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	slot := testenv.UniqueName(t, "slot")
	el := leader.New(leader.Config{DSN: dsn, Slot: slot}, zaptest.NewLogger(t))
	term := campaign(t, ctx, el)
	defer term.Release()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The term holds while nothing happens: its lock session answers a check (its query_start
	// moves) and the term is not lost.
	var first, last time.Time
	checks := 0
	await.State(t, time.Minute, "a check of the lock session answered", func() (bool, string) {
		select {
		case <-term.Lost():
			t.Fatalf("term lost before anything happened: %v", term.Err())
		default:
		}
		var started time.Time
		if err := conn.QueryRow(ctx, "SELECT query_start FROM pg_stat_activity WHERE pid = $1", int32(term.PID())).Scan(&started); err != nil {
			t.Fatal(err)
		}
		switch {
		case first.IsZero():
			first, last = started, started
		case started.After(last):
			checks, last = checks+1, started
		}
		return checks >= 1, "no check answered yet"
	})
	if term.Err() != nil {
		t.Fatalf("Err = %v while the term holds", term.Err())
	}

	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(term.PID())); err != nil {
		t.Fatal(err)
	}
	terminated := time.Now()
	select {
	case <-term.Lost():
		t.Logf("lost %s after pg_terminate_backend: %v", time.Since(terminated).Round(time.Millisecond), term.Err())
	case <-time.After(5 * time.Second):
		t.Fatal("the term was not lost within 5s of its backend's termination")
	}
	if term.Err() == nil {
		t.Fatal("a lost term has no error")
	}
	if _, held, err := leader.LockHolder(ctx, conn, slot); err != nil || held {
		t.Fatalf("lock still held (%v, %v) after its backend ended", held, err)
	}
}

func TestWrongPasswordEndsTheCampaignWithACredentialsError(t *testing.T) {
	dsn := newDatabase(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("postgres", "not-the-password")
	el := leader.New(leader.Config{DSN: u.String(), Slot: "s", RetryInterval: 100 * time.Millisecond}, zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = el.Campaign(ctx)
	if !errors.Is(err, leader.ErrCredentials) {
		t.Fatalf("Campaign error = %v, want ErrCredentials", err)
	}
}

func TestAnUnreachableServerIsRetriedAsADisconnectedStandby(t *testing.T) {
	// Port 1 on localhost refuses connections at once.
	var reports atomic.Int32
	var lastConnected atomic.Bool
	lastConnected.Store(true)
	el := leader.New(leader.Config{DSN: "postgres://u:p@127.0.0.1:1/db?sslmode=disable", Slot: "s",
		RetryInterval: 100 * time.Millisecond, OnStandby: func(c bool) { reports.Add(1); lastConnected.Store(c) }},
		zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := el.Campaign(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign error = %v, want it to retry until the context ends", err)
	}
	if reports.Load() < 2 || lastConnected.Load() {
		t.Fatalf("OnStandby called %d times, last connected=%v; want repeated disconnected reports", reports.Load(), lastConnected.Load())
	}
}

// viaProxy returns dsn with its host replaced by a proxy to it.
func viaProxy(t *testing.T, dsn string) (string, *netproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := netproxy.New(t, u.Host)
	u.Host = p.Addr
	return u.String(), p
}

func TestASilentLeaderFencesItselfAndPostgreSQLReleasesItsLockWithinTheLease(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	slot := testenv.UniqueName(t, "slot")
	proxied, p := viaProxy(t, dsn)
	cfg := leader.Config{DSN: proxied, Slot: slot, CheckTimeout: time.Second}
	termA := campaign(t, ctx, leader.New(cfg, zaptest.NewLogger(t)))
	defer termA.Release()
	var standingBy atomic.Bool
	b := leader.New(leader.Config{DSN: dsn, Slot: slot, RetryInterval: 100 * time.Millisecond,
		OnStandby: func(connected bool) { standingBy.Store(connected) }}, zaptest.NewLogger(t))
	got := make(chan *leader.Term, 1)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		term, _ := b.Campaign(bctx)
		got <- term
	}()
	await.True(t, 10*time.Second, "the standby tries the lock and waits", standingBy.Load)

	p.Freeze() // no FIN, no RST: only the lease can free the lock
	frozen := time.Now()
	var lostAt time.Time
	select {
	case <-termA.Lost():
		lostAt = time.Now()
		t.Logf("the cut-off leader fenced itself %s after the freeze: %v", lostAt.Sub(frozen).Round(time.Millisecond), termA.Err())
	case termB := <-got:
		termB.Release()
		t.Fatal("the standby took the lock before the cut-off leader fenced itself")
	case <-time.After(cfg.Lease()):
		t.Fatalf("the cut-off leader did not fence itself within its lease (%s)", cfg.Lease())
	}
	// The server counts the lease from the last check it answered, at most a check interval
	// before the freeze; the standby tries every 100ms. Allow a loaded machine a few seconds more.
	bound := cfg.Lease() + 5*time.Second
	select {
	case termB := <-got:
		if termB == nil {
			t.Fatal("the standby's campaign failed")
		}
		took := time.Now()
		t.Logf("the standby took the lock %s after the freeze, %s after the fence (lease %s)",
			took.Sub(frozen).Round(time.Millisecond), took.Sub(lostAt).Round(time.Millisecond), cfg.Lease())
		termB.Release()
	case <-time.After(bound - time.Since(frozen)):
		t.Fatalf("the standby did not get the lock within %s of the freeze: PostgreSQL kept the silent leader's session", bound)
	}
}

// TestSlowChecksAreCountedAsNearMissesWithoutFencing: every check takes 55% of leader_check_timeout,
// one after the other; none of them fences the leader (a check answered within the timeout never
// does), and each counts as a near miss.
func TestSlowChecksAreCountedAsNearMissesWithoutFencing(t *testing.T) {
	ctx := context.Background()
	proxied, p := viaProxy(t, newDatabase(t))
	var slow atomic.Int32
	el := leader.New(leader.Config{DSN: proxied, Slot: testenv.UniqueName(t, "slot"), CheckTimeout: 6 * time.Second,
		OnSlowCheck: func(time.Duration) { slow.Add(1) }}, zaptest.NewLogger(t))
	term := campaign(t, ctx, el)
	defer term.Release()
	answered := p.Responses()
	await.True(t, 10*time.Second, "checks answered at once", func() bool { return p.Responses() >= answered+3 })
	if n := slow.Load(); n != 0 {
		t.Fatalf("%d slow checks counted while the server answered at once", n)
	}
	// More than half the timeout (the delay is a floor), and 2.7 s less than all of it: a check
	// delayed 80% of a 3 s timeout left a loaded machine 0.6 s, four or five checks in a row.
	p.DelayResponses(3300 * time.Millisecond)
	fenced := func() {
		select {
		case <-term.Lost():
			t.Fatalf("a leader whose checks were slow but in time was fenced after %d slow checks: %v", slow.Load(), term.Err())
		default:
		}
	}
	await.State(t, time.Minute, "three slow checks in a row, each counted", func() (bool, string) {
		fenced()
		return slow.Load() >= 3, fmt.Sprintf("%d slow checks counted", slow.Load())
	})
	fenced()
	t.Logf("%d slow checks counted", slow.Load())
}

// TestReleaseDoesNotWaitForACheckInFlight: Release cuts a slow check short instead of waiting for
// its answer (up to leader_check_timeout).
func TestReleaseDoesNotWaitForACheckInFlight(t *testing.T) {
	proxied, p := viaProxy(t, newDatabase(t))
	term := campaign(t, context.Background(), leader.New(leader.Config{DSN: proxied, Slot: testenv.UniqueName(t, "slot"),
		CheckTimeout: 10 * time.Second}, zaptest.NewLogger(t)))
	p.DelayResponses(8 * time.Second)
	await.True(t, 10*time.Second, "a check is in flight", func() bool { return p.Held() > 0 })
	start := time.Now()
	term.Release()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Release took %s: it waited for the check in flight", took.Round(time.Millisecond))
	}
}

// TestAStandbyThatCouldNotLeadLeavesTheLockAlone: BeforeLock failing (the relay's Kafka does not
// answer) keeps a standby from taking a free lock; once it passes, the standby takes it.
func TestAStandbyThatCouldNotLeadLeavesTheLockAlone(t *testing.T) {
	dsn := newDatabase(t)
	var fit atomic.Bool
	var refused atomic.Int32
	el := leader.New(leader.Config{DSN: dsn, Slot: testenv.UniqueName(t, "slot"), RetryInterval: 100 * time.Millisecond,
		BeforeLock: func(context.Context, bool) error {
			if !fit.Load() {
				refused.Add(1)
				return errors.New("kafka does not answer")
			}
			return nil
		}}, zaptest.NewLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan *leader.Term, 1)
	go func() {
		term, _ := el.Campaign(ctx)
		got <- term
	}()
	// The lock is free all along: the standby tries, is refused by BeforeLock, and tries again.
	await.State(t, time.Minute, "three refused attempts to lead", func() (bool, string) {
		select {
		case term := <-got:
			if term != nil {
				term.Release()
			}
			t.Fatalf("a standby that could not lead took the free lock (after %d refused attempts)", refused.Load())
		default:
		}
		return refused.Load() >= 3, fmt.Sprintf("%d refused", refused.Load())
	})
	fit.Store(true)
	select {
	case term := <-got:
		if term == nil {
			t.Fatal("the campaign failed")
		}
		term.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("the standby did not take the free lock within 5s once it could lead")
	}
}

// TestTheLeaderSeesTheStandbysReadyToTakeOver: a standby that has seen the leader and for which
// BeforeLock passes says so with a shared lock; the leader's checks count it (Term.Standbys), and
// stop counting it once BeforeLock fails.
func TestTheLeaderSeesTheStandbysReadyToTakeOver(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	slot := testenv.UniqueName(t, "slot")
	termA := campaign(t, ctx, leader.New(leader.Config{DSN: dsn, Slot: slot}, zaptest.NewLogger(t)))
	defer termA.Release()
	var fit atomic.Bool
	var asked atomic.Int32
	b := leader.New(leader.Config{DSN: dsn, Slot: slot, RetryInterval: 100 * time.Millisecond,
		BeforeLock: func(_ context.Context, contended bool) error {
			asked.Add(1)
			if !fit.Load() {
				return errors.New("kafka does not answer")
			}
			return nil
		}}, zaptest.NewLogger(t))
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go b.Campaign(bctx)
	wait := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for termA.Standbys() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the leader counts %d standbys ready, want %d", termA.Standbys(), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Asked twice: the standby is connected and has announced itself unfit once.
	await.True(t, 10*time.Second, "the standby to ask whether it could lead", func() bool { return asked.Load() >= 2 })
	wait(0)
	fit.Store(true)
	wait(1)
	fit.Store(false)
	wait(0)
}
