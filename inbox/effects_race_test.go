package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/inbox"
)

// A rolling deploy: instance A applied an event and is performing its effect (the provider call
// is under way, nothing charged yet) when instance B starts and runs ResumePending, and, after a
// rebalance, gets the same record again. B must not ask the provider and perform the operation a
// second time while A is still at it: a provider that does not honour idempotency keys would
// charge twice.
func TestAnOperationUnderWayInOneInstanceIsNotPerformedAgainByAnother(t *testing.T) {
	pool := newVersionDB(t)
	prov := &provider{charges: map[string]int{}}
	store, err := inbox.New(inbox.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	reg := inbox.NewRegistry().Handle("Deposited", 1, func(ctx context.Context, e *inbox.Event) error {
		_, err := e.Intend(ctx, "charge", nil)
		return err
	})
	started, release := make(chan struct{}), make(chan struct{})
	slow := prov.effect()
	perform := slow.Perform
	slow.Perform = func(ctx context.Context, op inbox.Operation) (string, error) {
		close(started)
		<-release // the provider call takes a while
		return perform(ctx, op)
	}
	a := &inbox.Consumer{DB: pool, Store: store, Registry: reg, Effects: map[string]inbox.Effect{"charge": slow}}
	b := &inbox.Consumer{DB: pool, Store: store, Registry: reg, Effects: map[string]inbox.Effect{"charge": prov.effect()}}
	m := msg("e1", "a", 1, 0, "10")
	done := make(chan error, 1)
	go func() {
		_, err := a.Handle(ctx, m)
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("instance A's Handle returned %v before performing", err)
	}
	n, err := b.ResumePending(ctx)
	if err != nil {
		t.Fatalf("instance B's ResumePending: %v", err)
	}
	o, redeliveryErr := b.Handle(ctx, m)
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("instance A's Handle: %v", err)
	}
	key := inbox.IdempotencyKey("billing", "e1", "charge")
	if prov.charges[key] != 1 {
		t.Fatalf("charged %d times (B's ResumePending settled %d, B's redelivery %v, %v); want once", prov.charges[key], n, o, redeliveryErr)
	}
	if n != 0 {
		t.Fatalf("B's ResumePending settled %d operations; want 0, the one pending is A's", n)
	}
	// B's redelivery must not report success while the effect is not done: its offset would be
	// committed.
	if !errors.Is(redeliveryErr, inbox.ErrInProgress) {
		t.Fatalf("B's redelivery: %v, %v; want ErrInProgress (offset not committed)", o, redeliveryErr)
	}
}
