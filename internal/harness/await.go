package harness

import (
	"fmt"
	"testing"
	"time"

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
