package main

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestTheLeaderLockThroughAPgBouncer puts the leader lock's session (leader_dsn) behind a real
// PgBouncer, the replication connection going to PostgreSQL directly (PgBouncer 1.18 passes no
// replication connections): in transaction mode the relay refuses to start, naming the fix; in
// session mode it leads, and the lock's holder is the backend it logs.
func TestTheLeaderLockThroughAPgBouncer(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	f := newHAFixture(t, pg, testenv.SharedKafka(t).Brokers(), 1)

	t.Run("transaction mode is refused at start", func(t *testing.T) {
		b := testenv.PgBouncer(t, pg, devenv.PgBouncerOptions{PoolMode: "transaction"})
		code, out := relayproc.Run(t, relayproc.Options{Env: f.env("relay-txn", map[string]string{
			"OUTBOX_LEADER_DSN": withAppName(t, b.DSN(f.dbName), "relay-txn")})}, haStartTimeout)
		if code != 1 || !strings.Contains(out, "pooler in transaction mode") || !strings.Contains(out, "session-mode pool") {
			t.Fatalf("exit %d, want 1 with the transaction-mode pooler refusal:\n%s", code, out)
		}
		if strings.Contains(out, devenvPGPassword) {
			t.Fatal("the output reveals the PostgreSQL password")
		}
		if h := f.lockHolder(t); h != 0 {
			t.Fatalf("the refused relay left the leader lock held by backend %d", h)
		}
	})

	t.Run("session mode leads", func(t *testing.T) {
		b := testenv.PgBouncer(t, pg, devenv.PgBouncerOptions{PoolMode: "session"})
		a := f.start("relay-session", map[string]string{"OUTBOX_LEADER_DSN": withAppName(t, b.DSN(f.dbName), "relay-session")})
		f.waitStreamer(t, a, haStartTimeout)
		l := a.waitLog(t, haStartTimeout, "info", "leader: holding the leader lock")
		if pid, _ := l["lock_backend_pid"].(float64); pid == 0 || int32(pid) != f.lockHolder(t) {
			t.Fatalf("the relay logs lock backend %v, the lock is held by backend %d", l["lock_backend_pid"], f.lockHolder(t))
		}
		// Its checks (one statement each) pass through the pooler.
		harness.AwaitStatements(t, f.pool, f.lockHolder(t), 3, "two of the leader's checks through the pooler")
		if l := a.findLog("error", "fencing"); l != nil {
			t.Fatalf("the leader fenced itself through a session-mode pooler: %v", l)
		}
		a.stop(t)
	})
}
