package leader_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/leader"
)

// throughPgBouncer returns dsn's database behind a real PgBouncer in mode.
func throughPgBouncer(t *testing.T, dsn, mode string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	b := testenv.PgBouncer(t, testenv.SharedPostgres(t), devenv.PgBouncerOptions{PoolMode: mode})
	return b.DSN(strings.TrimPrefix(u.Path, "/"))
}

// TestALeaderElectionThroughATransactionModePoolerIsRefused: behind PgBouncer in transaction mode
// a session lock sits on one pooled server connection that every client of the pool shares, so a
// second instance's pg_try_advisory_lock lands on the holder's backend and succeeds too (locks are
// re-entrant): two leaders. The election refuses to start there, naming the fix.
func TestALeaderElectionThroughATransactionModePoolerIsRefused(t *testing.T) {
	dsn := newDatabase(t)
	pooled := throughPgBouncer(t, dsn, "transaction")
	slot := testenv.UniqueName(t, "slot")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// One after the other, as relays started moments apart are: each is refused on its own. Two
	// statements at the very same moment can hide the holder's server connection from one
	// campaign's probe (busy with the other's statement), and that campaign may lead: its checks
	// end its term when one runs on another server connection.
	var terms []*leader.Term
	var errs []error
	for range 2 {
		el := leader.New(leader.Config{DSN: pooled, Slot: slot, RetryInterval: 100 * time.Millisecond}, zaptest.NewLogger(t))
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		term, err := el.Campaign(cctx)
		cancel()
		if term != nil {
			terms = append(terms, term)
		}
		errs = append(errs, err)
	}
	for _, term := range terms {
		term.Release()
	}
	if len(terms) > 0 {
		t.Fatalf("%d instances lead through a transaction-mode pooler (errors %v); want the election refused", len(terms), errs)
	}
	for _, err := range errs {
		if !errors.Is(err, leader.ErrTransactionPooler) {
			t.Fatalf("Campaign error = %v, want ErrTransactionPooler", err)
		}
		if !strings.Contains(err.Error(), "session-mode") || !strings.Contains(err.Error(), "leader_dsn") {
			t.Fatalf("the refusal does not name the fix (a direct or session-mode connection, leader_dsn): %v", err)
		}
	}
	t.Logf("refused: %v", errs[0])

	// Nothing is left holding the lock on a pooled backend.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if h, held, err := leader.LockHolder(ctx, conn, slot); err != nil || held {
		t.Fatalf("after the refusals the lock is held (%v) by %+v, err %v", held, h, err)
	}
}

// TestALeaderElectionThroughASessionModePoolerHasOneLeader: in session mode a client keeps its
// server connection, so the lock behaves as on a direct connection: one leader, the other stands
// by and takes over on release. The term's PID is the PostgreSQL backend's (pg_backend_pid), not
// the one PgBouncer makes up for its client.
func TestALeaderElectionThroughASessionModePoolerHasOneLeader(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	pooled := throughPgBouncer(t, dsn, "session")
	slot := testenv.UniqueName(t, "slot")
	termA := campaign(t, ctx, leader.New(leader.Config{DSN: pooled, Slot: slot, RetryInterval: 100 * time.Millisecond,
		CheckInterval: 200 * time.Millisecond}, zaptest.NewLogger(t)))

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	h, held, err := leader.LockHolder(ctx, conn, slot)
	if err != nil || !held || uint32(h.PID) != termA.PID() {
		t.Fatalf("LockHolder = %+v, %v, %v; want the term's backend PID %d", h, held, err, termA.PID())
	}

	var attempts atomic.Int32
	b := leader.New(leader.Config{DSN: pooled, Slot: slot, RetryInterval: 100 * time.Millisecond,
		BeforeLock: func(context.Context, bool) error { attempts.Add(1); return nil }}, zaptest.NewLogger(t))
	got := make(chan *leader.Term, 1)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		term, err := b.Campaign(bctx)
		if err != nil && bctx.Err() == nil {
			t.Errorf("the standby's campaign through a session-mode pooler failed: %v", err)
		}
		got <- term
	}()
	// Both go on through the pooler: the standby tries for the lock again and again, and the
	// leader's lock session answers check after check (its query_start moves at each).
	checks, lastCheck := 0, time.Time{}
	await.State(t, time.Minute, "three lock attempts by the standby and three checks by the leader", func() (bool, string) {
		select {
		case termB := <-got:
			if termB != nil {
				termB.Release()
			}
			t.Fatal("a second elector took the lock while the first held it")
		case <-termA.Lost():
			t.Fatalf("the leader's term was lost through a session-mode pooler: %v", termA.Err())
		default:
		}
		var started time.Time
		if err := conn.QueryRow(ctx, "SELECT query_start FROM pg_stat_activity WHERE pid = $1", termA.PID()).Scan(&started); err != nil {
			t.Fatal(err)
		}
		if started.After(lastCheck) {
			checks, lastCheck = checks+1, started
		}
		return attempts.Load() >= 3 && checks >= 4, fmt.Sprintf("%d attempts, %d checks", attempts.Load(), checks-1)
	})
	termA.Release()
	select {
	case termB := <-got:
		if termB == nil {
			t.Fatal("the standby's campaign failed")
		}
		termB.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("the standby did not take the lock within 5s of its release")
	}
}
