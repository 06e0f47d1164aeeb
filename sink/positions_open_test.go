package sink_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Every relay shares the one-partition positions topic by default. Relay B wrote its position and
// was killed (or paused) before EndTxn, so its transaction stays open until its
// transaction.timeout.ms and holds the partition's last stable offset below everything written
// after it. Relay A committed positions above it and restarts: it must read the position it
// committed, not an older one (duplicates for a read_committed consumer) or none (a refused start).
func TestAPositionCommittedAboveAnotherRelaysOpenTransactionIsReadAfterARestart(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfgA := txnConfig(t, k, 50*time.Millisecond, 100)
	cfgB := cfgA
	txnB := *cfgA.Transactions
	txnB.ID = testenv.UniqueName(t, "txn-b")
	// B's transaction is aborted by the coordinator a few seconds after it was left open (plus its
	// sweep, every 10 s by default), which is how long A's start may wait.
	txnB.Timeout = 3 * time.Second
	cfgB.Transactions = &txnB

	b := readySink(t, k.Brokers(), cfgB)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sink.OpenPositionTransaction(ctx, b.Sink, sink.Position{CommitLSN: 0x100, Events: 1}); err != nil {
		t.Fatal(err)
	}

	a := readySink(t, k.Brokers(), cfgA)
	stream := newPGStream(7)
	acks := &acker{}
	for i := range 50 {
		a.publish(t, stream.next(fmt.Sprintf("order-%d", i%5)), acks)
	}
	eventually(t, time.Minute, "A's events committed", func() bool { return acks.n.Load() == 50 })
	committed, ok := a.Committed()
	if !ok || committed != stream.position() {
		t.Fatalf("A committed %v %v, want %v", committed, ok, stream.position())
	}
	a.mustClose(t)

	// A restarts: a new sink fences A's transactional id, then reads the position back.
	restarted := readySink(t, k.Brokers(), cfgA)
	start := time.Now()
	pos, found, err := restarted.ReadPosition(ctx)
	if err != nil || !found || pos != committed {
		t.Fatalf("ReadPosition after the restart = %v %v %v, want %v: another relay's open transaction hid A's position", pos, found, err, committed)
	}
	t.Logf("read A's position after %s (B's transaction open until its timeout)", time.Since(start).Round(time.Millisecond))
	closeQuickly(b, restarted)
}

// closeQuickly closes sinks without waiting for what they hold: B's abandoned transaction.
func closeQuickly(sinks ...*testSink) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, s := range sinks {
		_ = s.close(ctx)
	}
}

// A start that cannot see past another producer's open transaction within its bound says which
// partition, why, and what to look at, instead of reading a stale position.
func TestAPositionHiddenByAnOpenTransactionPastTheBoundIsAClearError(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfgA := txnConfig(t, k, 50*time.Millisecond, 100)
	cfgB := cfgA
	txnB := *cfgA.Transactions
	txnB.ID = testenv.UniqueName(t, "txn-b")
	cfgB.Transactions = &txnB // the default timeout: 60 s, longer than the bound below
	b := readySink(t, k.Brokers(), cfgB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sink.OpenPositionTransaction(ctx, b.Sink, sink.Position{CommitLSN: 0x100, Events: 1}); err != nil {
		t.Fatal(err)
	}
	a := readySink(t, k.Brokers(), cfgA)
	sink.SetStableWait(a.Sink, time.Second)
	_, _, err := a.ReadPosition(ctx)
	if err == nil {
		t.Fatal("ReadPosition read past another producer's open transaction without waiting for it")
	}
	for _, want := range []string{cfgA.Transactions.PositionsTopic, "partition 0", "open transaction", "transaction.timeout.ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	closeQuickly(a, b)
}
