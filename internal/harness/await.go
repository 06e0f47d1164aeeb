package harness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
)

// writtenTimeout bounds a wait for writers to commit more: long enough for a loaded machine and a
// writer retrying across a failover, reached only when the writers stopped.
const writtenTimeout = 90 * time.Second

// Count is how many committed events were recorded so far: len(Written()) without the copy.
func (o *Outbox) Count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.written)
}

// AwaitMore waits until n more events than now are committed: the fact behind "the writers go on
// across the fault", instead of a fixed sleep that on a loaded machine may see none written.
func (o *Outbox) AwaitMore(t testing.TB, n int, across string) {
	t.Helper()
	from := o.Count()
	await.State(t, writtenTimeout, fmt.Sprintf("%d more events written %s", n, across), func() (bool, string) {
		got := o.Count() - from
		return got >= n, fmt.Sprintf("%d written", got)
	})
}

// Querier is what AwaitStatements reads pg_stat_activity with: a *pgx.Conn or a *pgxpool.Pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AwaitStatements waits until the backend pid has started n more statements (its query_start in
// pg_stat_activity moved n times): the fact behind "a leader's checks ran", where a session runs
// one statement a check, instead of a sleep of n check intervals.
func AwaitStatements(t testing.TB, q Querier, pid int32, n int, what string) {
	t.Helper()
	started := func() (time.Time, error) {
		var at *time.Time
		err := q.QueryRow(context.Background(), "SELECT query_start FROM pg_stat_activity WHERE pid = $1", pid).Scan(&at)
		if err != nil || at == nil {
			return time.Time{}, err
		}
		return *at, nil
	}
	last, err := started()
	if err != nil {
		t.Fatalf("%s: the statements of backend %d: %v", what, pid, err)
	}
	seen := 0
	await.State(t, writtenTimeout, what, func() (bool, string) {
		at, err := started()
		if err != nil {
			return false, err.Error()
		}
		if !at.Equal(last) {
			last, seen = at, seen+1
		}
		return seen >= n, fmt.Sprintf("%d of %d statements started by backend %d", seen, n, pid)
	})
}
