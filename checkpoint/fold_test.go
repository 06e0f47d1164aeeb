package checkpoint_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// empties begins and commits n transactions without events, the first committing at from, each
// 0x40 after the one before and ending 0x30 after its commit: PostgreSQL 14 sends such a pair
// for every transaction of the database, 15+ for every one with a published change that is not
// an event. Each must leave Pending() at pending.
func empties(from pglogrepl.LSN, n, pending int) step {
	return step{fmt.Sprintf("%d transactions without events from %s, Pending() == %d each time", n, from, pending), func(s *script) error {
		for i := range n {
			lsn := from + pglogrepl.LSN(i)*0x40
			tx := s.tr.Begin(lsn)
			if tx == nil {
				return fmt.Errorf("Begin(%s) returned nil", lsn)
			}
			s.tr.Commit(tx, lsn+0x30)
			if got := s.tr.Pending(); got != pending {
				return fmt.Errorf("Pending() = %d after the transaction committing at %s, want %d", got, lsn, pending)
			}
		}
		return nil
	}}
}

// emptiesEnd is where the last of empties(from, n, _) ends.
func emptiesEnd(from pglogrepl.LSN, n int) pglogrepl.LSN {
	return from + pglogrepl.LSN(n-1)*0x40 + 0x30
}

// A transaction that is done (committed, every event acknowledged, or none at all) while one
// before it is not is folded into its predecessor: the queue holds only transactions that still
// hold something back, so its length is bounded by the events in flight, not by the rate of
// transactions in the database. Safe must neither pass an unacknowledged event nor stop short of
// a folded transaction's end once what is ahead of it is acknowledged.
func TestTrackerFoldsTransactionsThatAreDoneBehindAnUnacknowledgedOne(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "with nothing pending, transactions without events move Safe to each one's end at once",
			steps: []step{
				empties(0x100, 1000, 0), wantSafe(emptiesEnd(0x100, 1000)), wantDrained(true),
			},
		},
		{
			name: "behind an unacknowledged event they wait in its place and are released with it",
			steps: []step{
				begin("head", 0x100), add("head", 1), commit("head", 0x130), keepDrained("c"),
				empties(0x200, 1000, 1), wantSafe(0x10), wantKept("c", false), idle(0x1_0000_0000), wantSafe(0x10),
				ack("head", 1), wantSafe(emptiesEnd(0x200, 1000)), wantPending(0), wantKept("c", true),
			},
		},
		{
			name: "they never let Safe pass a later unacknowledged event, and the rest is released when it is acknowledged",
			steps: []step{
				begin("a", 0x100), add("a", 1), commit("a", 0x130),
				empties(0x200, 10, 1),
				begin("b", 0x1000), add("b", 1), commit("b", 0x1030), wantPending(2),
				empties(0x1100, 10, 2),
				ack("a", 1), wantSafe(emptiesEnd(0x200, 10)), wantPending(1),
				ack("b", 1), wantSafe(emptiesEnd(0x1100, 10)), wantPending(0),
			},
		},
		{
			name: "the later event acknowledged first: nothing moves until the head's is",
			steps: []step{
				begin("a", 0x100), add("a", 1), commit("a", 0x130),
				empties(0x200, 10, 1),
				begin("b", 0x1000), add("b", 1), commit("b", 0x1030),
				empties(0x1100, 10, 2),
				ack("b", 1), wantSafe(0x10), wantPending(1),
				empties(0x2000, 10, 1),
				ack("a", 1), wantSafe(emptiesEnd(0x2000, 10)), wantPending(0),
			},
		},
		{
			name: "a predecessor fully acknowledged behind the head takes them in too",
			steps: []step{
				begin("a", 0x100), add("a", 1), commit("a", 0x130),
				begin("b", 0x200), add("b", 2), commit("b", 0x230), ack("b", 2), wantPending(1),
				empties(0x300, 100, 1), wantSafe(0x10),
				ack("a", 1), wantSafe(emptiesEnd(0x300, 100)), wantPending(0),
			},
		},
		{
			name: "an open transaction is not folded: its events may still come, and it holds back what follows",
			steps: []step{
				begin("a", 0x100), add("a", 1), commit("a", 0x130),
				empties(0x200, 10, 1),
				begin("open", 0x1000), add("open", 1), ack("open", 1), wantPending(2),
				ack("a", 1), wantSafe(emptiesEnd(0x200, 10)), wantPending(1),
				commit("open", 0x1030), wantSafe(0x1030), wantPending(0),
			},
		},
		{
			name: "an open transaction committed with its events acknowledged is folded like one without events",
			steps: []step{
				begin("a", 0x100), add("a", 1), commit("a", 0x130),
				begin("b", 0x1000), take("b", 0, true), take("b", 1, true), ack("b", 2), commit("b", 0x1030), wantPending(1),
				empties(0x1100, 10, 1),
				ack("a", 1), wantSafe(emptiesEnd(0x1100, 10)), wantPending(0),
			},
		},
		{
			name: "an aborted open transaction behind folded ones drops only itself",
			steps: []step{
				begin("a", 0x100), add("a", 1), commit("a", 0x130),
				empties(0x200, 10, 1),
				begin("open", 0x1000), add("open", 1), wantPending(2),
				abort(), wantPending(1),
				ack("open", 1), wantSafe(0x10),
				ack("a", 1), wantSafe(emptiesEnd(0x200, 10)), wantPending(0),
			},
		},
		{
			name: "a replay after a reconnect skips the folded transactions",
			steps: []step{
				begin("a", 0x100), add("a", 1), commit("a", 0x130),
				empties(0x200, 10, 1),
				abort(), beginSkipped(0x100), beginSkipped(0x200), beginSkipped(0x200 + 9*0x40),
				begin("c", 0x1000), add("c", 1), commit("c", 0x1030), wantPending(2),
				ack("a", 1), wantSafe(emptiesEnd(0x200, 10)),
				ack("c", 1), wantSafe(0x1030), wantPending(0),
			},
		},
		{
			name: "transactions covered by the exactly-once floor are folded too",
			steps: []step{
				begin("a", 0x100), take("a", 0, true), commit("a", 0x130),
				cover(0x1000, 2),
				begin("covered", 0x1000), take("covered", 0, false), take("covered", 1, false), commit("covered", 0x1030),
				wantPending(1), wantSafe(0x10),
				ack("a", 1), wantSafe(0x1030), wantPending(0),
			},
		},
		{
			name: "a reset forgets the folded transactions, and the head's late ack changes nothing",
			steps: []step{
				begin("a", 0x100), add("a", 1), commit("a", 0x130),
				empties(0x200, 10, 1),
				reset(0x50, 2), wantPending(0), wantSafe(0x50),
				ack("a", 1), wantSafe(0x50), wantPending(0),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runScript(t, 0x10, tt.steps) })
	}
}

// The measurement: a stalled broker holds one event, and the database commits tens of
// thousands of transactions a second elsewhere. A million of them (manyEmpty: a tenth under the
// race detector) behind the unacknowledged event must leave the queue at one transaction and the
// heap where it was; once the event is acknowledged, Safe goes to the last one's end (no WAL stays
// pinned).
func TestTrackerPendingStaysConstantUnderAMillionEmptyTransactionsBehindAnUnacknowledgedEvent(t *testing.T) {
	const n = manyEmpty
	tr := checkpoint.New(0x10)
	head := tr.Begin(0x100)
	head.Add()
	tr.Commit(head, 0x130)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	lsn := pglogrepl.LSN(0x200)
	for i := range n {
		tx := tr.Begin(lsn)
		tr.Commit(tx, lsn+0x30)
		if i%1000 == 0 {
			if got := tr.Pending(); got != 1 {
				t.Fatalf("Pending() = %d after %d transactions without events, want 1 (the unacknowledged one)", got, i+1)
			}
		}
		lsn += 0x40
	}
	last := lsn - 0x40 + 0x30
	grew := int64(heap()) - int64(before)
	if got := tr.Pending(); got != 1 {
		t.Fatalf("Pending() = %d after %d transactions without events, want 1", got, n)
	}
	// An unfolded queue holds ~80 bytes per transaction: 80 MB for a million.
	if grew > 1<<20 {
		t.Errorf("the heap grew by %d bytes over %d transactions without events, want it flat", grew, n)
	}
	if got := tr.Safe(); got != 0x10 {
		t.Fatalf("Safe() = %s while the first event is unacknowledged, want 0/10", got)
	}
	head.Ack(1)
	if got := tr.Safe(); got != last {
		t.Errorf("Safe() = %s once the event was acknowledged, want the last transaction's end %s", got, last)
	}
	if got := tr.Pending(); got != 0 {
		t.Errorf("Pending() = %d once the event was acknowledged, want 0", got)
	}
}
