package leader

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestATermWhoseLockBackendEndsBehindAPoolerIsFencedThoughChecksSucceed: behind a pooler in
// transaction mode the lock sits on one pooled backend. When PostgreSQL ends that backend (its
// idle_session_timeout while the checks ran on others; here pg_terminate_backend, to the same
// effect), the lock is gone, yet a check on any other backend succeeds: the leader would go on
// while a standby takes the lock. Each check verifies the backend and the lock, so the term is
// lost at the next one. (The election refuses such a pooler at start; this is the check's own
// guard, for whatever else hands the session's statements to another backend.)
func TestATermWhoseLockBackendEndsBehindAPoolerIsFencedThoughChecksSucceed(t *testing.T) {
	ctx := context.Background()
	pg := testenv.SharedPostgres(t)
	name := testenv.UniqueName(t, "db")
	_, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	b := testenv.PgBouncer(t, pg, devenv.PgBouncerOptions{PoolMode: "transaction"})
	cfg := Config{DSN: b.DSN(name), Slot: testenv.UniqueName(t, "slot")}
	cfg.setDefaults()
	e := New(cfg, zaptest.NewLogger(t))
	conn, err := e.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	got, _, err := e.tryLock(ctx, conn)
	if err != nil || !got {
		t.Fatalf("tryLock = %v, %v", got, err)
	}
	direct, err := pgx.Connect(ctx, pg.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	h, held, err := LockHolder(ctx, direct, cfg.Slot)
	if err != nil || !held {
		t.Fatalf("LockHolder = %v, %v", held, err)
	}
	term := newTerm(conn, e.cfg, e.log, sent, uint32(h.PID))
	defer term.Release()
	// Checks on the lock's live backend keep the term: three answered ones (a publication is a
	// check that answers its caller; pid 0 is no walsender, so nothing is published).
	for i := range 3 {
		cctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		err := term.PublishWalsender(cctx, 0)
		cancel()
		if err != nil {
			t.Fatalf("check %d before the lock's backend ended: %v", i+1, err)
		}
	}

	if _, err := direct.Exec(ctx, "SELECT pg_terminate_backend($1, 5000)", h.PID); err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	if _, held, _ := LockHolder(ctx, direct, cfg.Slot); held {
		t.Fatal("the lock is still held after its backend ended")
	}
	select {
	case <-term.Lost():
		t.Logf("fenced %s after the lock's backend ended: %v", time.Since(ended).Round(time.Millisecond), term.Err())
	case <-time.After(5 * time.Second):
		t.Fatal("the leader went on for 5s after its lock's backend ended: its checks succeeded on other pooled backends")
	}
	if err := term.Err(); err == nil || !strings.Contains(err.Error(), "backend") {
		t.Fatalf("term error %v does not say the lock's backend is gone", err)
	}
}
