package checkpoint_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// A tracker test is a script: steps that drive the tracker the way the relay does (Begin, Add,
// Commit, Abort and Idle from the decoding goroutine, Ack from the sink) and steps that check it.

type script struct {
	tr    *checkpoint.Tracker
	txs   map[string]*checkpoint.Txn
	chans map[string]<-chan struct{}
}

type step struct {
	text string
	run  func(s *script) error
}

func begin(name string, commitLSN pglogrepl.LSN) step {
	return step{fmt.Sprintf("Begin(%s) as %s", commitLSN, name), func(s *script) error {
		tx := s.tr.Begin(commitLSN)
		if tx == nil {
			return fmt.Errorf("Begin returned nil, want a transaction")
		}
		if tx.CommitLSN() != commitLSN {
			return fmt.Errorf("CommitLSN() = %s, want %s", tx.CommitLSN(), commitLSN)
		}
		s.txs[name] = tx
		return nil
	}}
}

// beginSkipped expects Begin to refuse a transaction that was already committed.
func beginSkipped(commitLSN pglogrepl.LSN) step {
	return step{fmt.Sprintf("Begin(%s) is skipped", commitLSN), func(s *script) error {
		if tx := s.tr.Begin(commitLSN); tx != nil {
			return fmt.Errorf("Begin returned a transaction, want nil for an already committed one")
		}
		return nil
	}}
}

// beginSame expects Begin to resume the transaction name, still open.
func beginSame(name string, commitLSN pglogrepl.LSN) step {
	return step{fmt.Sprintf("Begin(%s) resumes %s", commitLSN, name), func(s *script) error {
		if tx := s.tr.Begin(commitLSN); tx != s.txs[name] {
			return fmt.Errorf("Begin returned %p, want the open transaction %p", tx, s.txs[name])
		}
		return nil
	}}
}

// take calls Take(index) on name and expects publish.
func take(name string, index int, publish bool) step {
	return step{fmt.Sprintf("Take(%d) on %s == %t", index, name, publish), func(s *script) error {
		if got := s.txs[name].Take(index); got != publish {
			return fmt.Errorf("Take(%d) = %t, want %t", index, got, publish)
		}
		return nil
	}}
}

func cover(commitLSN pglogrepl.LSN, events int) step {
	return step{fmt.Sprintf("Cover(%s, %d)", commitLSN, events), func(s *script) error {
		s.tr.Cover(commitLSN, events)
		return nil
	}}
}

func add(name string, n int) step {
	return step{fmt.Sprintf("%d×Add on %s", n, name), func(s *script) error {
		for range n {
			s.txs[name].Add()
		}
		return nil
	}}
}

func ack(name string, n int) step {
	return step{fmt.Sprintf("Ack(%d) on %s", n, name), func(s *script) error {
		s.txs[name].Ack(n)
		return nil
	}}
}

func commit(name string, endLSN pglogrepl.LSN) step {
	return step{fmt.Sprintf("Commit(%s, %s)", name, endLSN), func(s *script) error {
		s.tr.Commit(s.txs[name], endLSN)
		return nil
	}}
}

func abort() step {
	return step{"Abort()", func(s *script) error { s.tr.Abort(); return nil }}
}

func idle(walEnd pglogrepl.LSN) step {
	return step{fmt.Sprintf("Idle(%s)", walEnd), func(s *script) error { s.tr.Idle(walEnd); return nil }}
}

func wantSafe(lsn pglogrepl.LSN) step {
	return step{fmt.Sprintf("Safe() == %s", lsn), func(s *script) error {
		if got := s.tr.Safe(); got != lsn {
			return fmt.Errorf("Safe() = %s, want %s", got, lsn)
		}
		return nil
	}}
}

func wantPending(n int) step {
	return step{fmt.Sprintf("Pending() == %d", n), func(s *script) error {
		if got := s.tr.Pending(); got != n {
			return fmt.Errorf("Pending() = %d, want %d", got, n)
		}
		return nil
	}}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// wantDrained checks a channel freshly obtained from Drained.
func wantDrained(closed bool) step {
	return step{fmt.Sprintf("Drained() closed == %t", closed), func(s *script) error {
		if got := isClosed(s.tr.Drained()); got != closed {
			return fmt.Errorf("Drained() closed = %t, want %t", got, closed)
		}
		return nil
	}}
}

// keepDrained remembers the current Drained channel under name for wantKept.
func keepDrained(name string) step {
	return step{fmt.Sprintf("keep Drained() as %s", name), func(s *script) error {
		s.chans[name] = s.tr.Drained()
		return nil
	}}
}

func wantKept(name string, closed bool) step {
	return step{fmt.Sprintf("%s closed == %t", name, closed), func(s *script) error {
		if got := isClosed(s.chans[name]); got != closed {
			return fmt.Errorf("channel %s closed = %t, want %t", name, got, closed)
		}
		return nil
	}}
}

func runScript(t *testing.T, start pglogrepl.LSN, steps []step) {
	t.Helper()
	s := &script{tr: checkpoint.New(start), txs: map[string]*checkpoint.Txn{}, chans: map[string]<-chan struct{}{}}
	for i, st := range steps {
		if err := st.run(s); err != nil {
			t.Fatalf("step %d, %s: %v", i, st.text, err)
		}
	}
}

func TestTrackerWatermark(t *testing.T) {
	tests := []struct {
		name  string
		start pglogrepl.LSN
		steps []step
	}{
		{
			name:  "a new tracker starts at the given LSN with nothing pending",
			start: 0x16B3748,
			steps: []step{wantSafe(0x16B3748), wantPending(0), wantDrained(true)},
		},
		{
			name:  "a committed transaction with outstanding events does not advance Safe",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 2), commit("tx1", 0x130),
				wantSafe(0x10), wantPending(1),
				ack("tx1", 1), wantSafe(0x10), wantPending(1),
				ack("tx1", 1), wantSafe(0x130), wantPending(0),
			},
		},
		{
			name:  "Safe is the transaction's end LSN, not its commit LSN",
			start: 0x10,
			steps: []step{begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x128), ack("tx1", 1), wantSafe(0x128)},
		},
		{
			name:  "acks arriving before Commit advance Safe at Commit",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 2), ack("tx1", 1), add("tx1", 1), ack("tx1", 2),
				wantSafe(0x10), wantPending(1),
				commit("tx1", 0x130), wantSafe(0x130), wantPending(0),
			},
		},
		{
			name:  "one Ack can settle several events",
			start: 0x10,
			steps: []step{begin("tx1", 0x100), add("tx1", 5), commit("tx1", 0x130), ack("tx1", 3), wantSafe(0x10), ack("tx1", 2), wantSafe(0x130)},
		},
		{
			name:  "a later transaction fully acked first does not pass the earlier one, then Safe jumps to its end",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 2), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1), commit("tx2", 0x230),
				ack("tx2", 1), wantSafe(0x10), wantPending(1), // tx2 is folded into tx1
				ack("tx1", 1), wantSafe(0x10), wantPending(1),
				ack("tx1", 1), wantSafe(0x230), wantPending(0),
			},
		},
		{
			name:  "transactions completing back to front release together when the head completes",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1), commit("tx2", 0x230),
				begin("tx3", 0x300), add("tx3", 1), commit("tx3", 0x330),
				ack("tx3", 1), ack("tx2", 1), wantSafe(0x10), wantPending(1), // both folded into tx1
				ack("tx1", 1), wantSafe(0x330), wantPending(0),
			},
		},
		{
			name:  "a completed middle transaction is released with the head, and the tail waits for its own acks",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1), commit("tx2", 0x230),
				begin("tx3", 0x300), add("tx3", 1), commit("tx3", 0x330),
				ack("tx2", 1), wantSafe(0x10),
				ack("tx1", 1), wantSafe(0x230), wantPending(1),
				ack("tx3", 1), wantSafe(0x330), wantPending(0),
			},
		},
		{
			name:  "an open transaction holds back nothing before it but itself",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1), ack("tx2", 1),
				ack("tx1", 1), wantSafe(0x130), wantPending(1),
				commit("tx2", 0x230), wantSafe(0x230), wantPending(0),
			},
		},
		{
			name:  "an empty transaction advances Safe at once",
			start: 0x10,
			steps: []step{begin("tx1", 0x100), wantPending(1), commit("tx1", 0x130), wantSafe(0x130), wantPending(0)},
		},
		{
			name:  "an empty transaction behind an unacknowledged one waits for it",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), commit("tx2", 0x230), wantSafe(0x10), wantPending(1), // tx2 is folded into tx1
				ack("tx1", 1), wantSafe(0x230), wantPending(0),
			},
		},
		{
			name:  "a transaction ending below Safe does not lower it",
			start: 0x1000,
			steps: []step{begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130), ack("tx1", 1), wantSafe(0x1000), wantPending(0)},
		},
		{
			name:  "Idle advances when nothing is pending and no transaction is open",
			start: 0x10,
			steps: []step{idle(0x500), wantSafe(0x500), idle(0x600), wantSafe(0x600)},
		},
		{
			name:  "Idle advances after the last transaction is fully acknowledged",
			start: 0x10,
			steps: []step{begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130), ack("tx1", 1), idle(0x500), wantSafe(0x500)},
		},
		{
			name:  "Idle does not advance while a transaction is open, even one without events",
			start: 0x10,
			steps: []step{begin("tx1", 0x100), idle(0x500), wantSafe(0x10), commit("tx1", 0x130), wantSafe(0x130), idle(0x500), wantSafe(0x500)},
		},
		{
			name:  "Idle does not advance while a committed transaction awaits acks",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				idle(0x500), wantSafe(0x10),
				ack("tx1", 1), wantSafe(0x130),
				idle(0x500), wantSafe(0x500),
			},
		},
		{
			name:  "Idle never moves Safe backwards",
			start: 0x500,
			steps: []step{
				idle(0x400), wantSafe(0x500), idle(0x500), wantSafe(0x500),
				begin("tx1", 0x600), commit("tx1", 0x630), wantSafe(0x630),
				idle(0x600), wantSafe(0x630), idle(0), wantSafe(0x630),
			},
		},
		{
			name:  "Begin at the last committed LSN returns nil, as does any LSN below it",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				beginSkipped(0x100), beginSkipped(0x80), beginSkipped(0x10),
				wantPending(1), idle(0x500), wantSafe(0x10),
				ack("tx1", 1), wantSafe(0x130), wantPending(0),
			},
		},
		{
			name:  "a replay after reconnect skips committed transactions and accepts the first new one",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1), commit("tx2", 0x230),
				// reconnect: the server replays from the slot's confirmed position
				abort(), beginSkipped(0x100), beginSkipped(0x200),
				begin("tx3", 0x300), add("tx3", 1), commit("tx3", 0x330),
				ack("tx1", 1), ack("tx2", 1), wantSafe(0x230),
				ack("tx3", 1), wantSafe(0x330), wantPending(0),
			},
		},
		{
			name:  "Abort drops the open transaction, late acks are harmless and its replay is accepted",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 2), ack("tx1", 1),
				abort(), wantPending(0), wantDrained(true), wantSafe(0x10),
				ack("tx1", 1), wantSafe(0x10), wantPending(0),
				idle(0x80), wantSafe(0x80),
				begin("tx1 replayed", 0x100), add("tx1 replayed", 2), commit("tx1 replayed", 0x130),
				wantSafe(0x80), ack("tx1 replayed", 2), wantSafe(0x130), wantPending(0),
			},
		},
		{
			name:  "acks for an aborted transaction never advance Safe past a pending one",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1), abort(), wantPending(1),
				ack("tx2", 1), wantSafe(0x10), wantPending(1),
				ack("tx1", 1), wantSafe(0x130), wantPending(0),
			},
		},
		{
			name:  "Abort keeps committed transactions that await acks",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1),
				abort(), wantPending(1), wantDrained(false),
				ack("tx1", 1), wantSafe(0x130), wantPending(0), wantDrained(true),
			},
		},
		{
			name:  "Abort without an open transaction does nothing",
			start: 0x10,
			steps: []step{
				abort(), wantPending(0), wantSafe(0x10),
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				abort(), wantPending(1), ack("tx1", 1), wantSafe(0x130),
			},
		},
		{
			name:  "a Begin of another transaction while one is open drops the open one as Abort would",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1),
				begin("tx3", 0x300), wantPending(2),
				ack("tx2", 1), ack("tx1", 1), wantSafe(0x130), wantPending(1),
				add("tx3", 1), commit("tx3", 0x330), wantSafe(0x130),
				ack("tx3", 1), wantSafe(0x330), wantPending(0),
			},
		},
		{
			name:  "a Begin of the open transaction again resumes it: its events handed over before are not taken twice",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), take("tx1", 0, true), take("tx1", 1, true), take("tx1", 2, true),
				// a reconnect: the next session replays tx1 from its Begin
				beginSame("tx1", 0x100), wantPending(1),
				take("tx1", 0, false), take("tx1", 1, false), take("tx1", 2, false), take("tx1", 3, true),
				commit("tx1", 0x130), ack("tx1", 3), wantSafe(0x10),
				ack("tx1", 1), wantSafe(0x130), wantPending(0),
			},
		},
		{
			name:  "Idle does not pass a transaction a lost session left open",
			start: 0x10,
			steps: []step{
				begin("tx1", 0x100), take("tx1", 0, true), ack("tx1", 1),
				idle(0x500), wantSafe(0x10),
				beginSame("tx1", 0x100), take("tx1", 0, false), commit("tx1", 0x130), wantSafe(0x130),
			},
		},
		{
			name:  "LSNs above 4 GiB compare as 64-bit positions",
			start: 0xFFFF_FFF0,
			steps: []step{
				begin("tx1", 0x1_0000_0100), add("tx1", 1), commit("tx1", 0x1_0000_0130),
				ack("tx1", 1), wantSafe(0x1_0000_0130),
				beginSkipped(0x1_0000_0100), idle(0xFFFF_FFFF), wantSafe(0x1_0000_0130),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runScript(t, tt.start, tt.steps) })
	}
}

func TestTrackerDrained(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name:  "a new tracker is drained",
			steps: []step{wantDrained(true)},
		},
		{
			name: "a channel obtained while work is pending closes when the queue empties",
			steps: []step{
				begin("tx1", 0x100), keepDrained("c"), wantKept("c", false),
				add("tx1", 2), commit("tx1", 0x130), wantKept("c", false),
				ack("tx1", 1), wantKept("c", false),
				ack("tx1", 1), wantKept("c", true), wantDrained(true),
			},
		},
		{
			name: "a new channel after a new Begin stays open while that work is pending",
			steps: []step{
				begin("tx1", 0x100), keepDrained("first"), commit("tx1", 0x130), wantKept("first", true),
				begin("tx2", 0x200), keepDrained("second"), wantKept("second", false), wantKept("first", true),
				add("tx2", 1), commit("tx2", 0x230), wantKept("second", false),
				ack("tx2", 1), wantKept("second", true),
			},
		},
		{
			name: "a channel stays open until every pending transaction is done, not just the first",
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), add("tx2", 1), commit("tx2", 0x230), keepDrained("c"),
				ack("tx1", 1), wantKept("c", false), wantDrained(false),
				ack("tx2", 1), wantKept("c", true),
			},
		},
		{
			name:  "an open transaction without events is pending until Commit",
			steps: []step{begin("tx1", 0x100), keepDrained("c"), wantKept("c", false), commit("tx1", 0x130), wantKept("c", true)},
		},
		{
			name:  "Abort of the only transaction closes the channel",
			steps: []step{begin("tx1", 0x100), add("tx1", 1), keepDrained("c"), abort(), wantKept("c", true), wantDrained(true)},
		},
		{
			name: "Abort with committed work pending keeps the channel open",
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), keepDrained("c"), abort(), wantKept("c", false),
				ack("tx1", 1), wantKept("c", true),
			},
		},
		{
			// Begin drops the open transaction "as Abort would", so a channel obtained for the dropped
			// work closes; the replayed transaction is new work with a new channel.
			name: "a Begin replacing the only open transaction closes the old channel and opens a new one",
			steps: []step{
				begin("tx1", 0x100), keepDrained("old"),
				begin("tx2", 0x200), wantKept("old", true), keepDrained("new"), wantKept("new", false),
				commit("tx2", 0x230), wantKept("new", true),
			},
		},
		{
			name: "a Begin replacing an open transaction behind pending work keeps the channel open",
			steps: []step{
				begin("tx1", 0x100), add("tx1", 1), commit("tx1", 0x130),
				begin("tx2", 0x200), keepDrained("c"), begin("tx3", 0x300), wantKept("c", false),
				commit("tx3", 0x330), ack("tx1", 1), wantKept("c", true),
			},
		},
		{
			name: "a resumed transaction keeps its channel open until it is done",
			steps: []step{
				begin("tx1", 0x100), take("tx1", 0, true), keepDrained("c"),
				beginSame("tx1", 0x100), wantKept("c", false), commit("tx1", 0x130), wantKept("c", false),
				ack("tx1", 1), wantKept("c", true),
			},
		},
		{
			name:  "a skipped Begin does not open a new channel",
			steps: []step{begin("tx1", 0x100), commit("tx1", 0x130), beginSkipped(0x100), wantDrained(true)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runScript(t, 0x10, tt.steps) })
	}
}

func TestTrackerDrainedWakesAWaitingGoroutine(t *testing.T) {
	tr := checkpoint.New(0)
	tx := tr.Begin(0x100)
	tx.Add()
	tr.Commit(tx, 0x130)
	woke := make(chan pglogrepl.LSN)
	go func() {
		<-tr.Drained()
		woke <- tr.Safe()
	}()
	select {
	case <-woke:
		t.Fatal("the waiter woke while an event was outstanding")
	case <-time.After(20 * time.Millisecond):
	}
	tx.Ack(1)
	select {
	case safe := <-woke:
		if safe != 0x130 {
			t.Errorf("the waiter saw Safe() = %s, want 0/130", safe)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not wake after the last ack")
	}
}

func TestTxnAckPanicsOnMoreAcksThanEvents(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
		ack   int
	}{
		{"an ack of a transaction without events", []step{begin("tx", 0x100)}, 1},
		{"two acks for one event", []step{begin("tx", 0x100), add("tx", 1)}, 2},
		{"an ack after every event was acknowledged", []step{begin("tx", 0x100), add("tx", 2), ack("tx", 2)}, 1},
		{"an ack after the committed transaction was released", []step{begin("tx", 0x100), add("tx", 1), commit("tx", 0x130), ack("tx", 1)}, 1},
		{"an ack of an aborted transaction beyond its events", []step{begin("tx", 0x100), add("tx", 1), abort(), ack("tx", 1)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &script{tr: checkpoint.New(0x10), txs: map[string]*checkpoint.Txn{}, chans: map[string]<-chan struct{}{}}
			for i, st := range tt.steps {
				if err := st.run(s); err != nil {
					t.Fatalf("step %d, %s: %v", i, st.text, err)
				}
			}
			safe := s.tr.Safe()
			func() {
				defer func() {
					p := recover()
					if p == nil {
						t.Fatalf("Ack(%d) did not panic", tt.ack)
					}
					if msg := fmt.Sprint(p); !strings.Contains(msg, "more acks than events") {
						t.Errorf("panic %q does not say there were more acks than events", msg)
					}
				}()
				s.txs["tx"].Ack(tt.ack)
			}()
			// The panic must not leave the tracker locked or moved.
			done := make(chan struct{})
			go func() {
				defer close(done)
				s.tr.Pending()
				s.tr.Idle(0)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the tracker is still locked after the panic")
			}
			if got := s.tr.Safe(); got != safe {
				t.Errorf("Safe() moved from %s to %s", safe, got)
			}
		})
	}
}

func TestTrackerCommitPanicsForATransactionThatIsNotOpen(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"a transaction committed twice", []step{begin("tx", 0x100), commit("tx", 0x130)}},
		{"an aborted transaction", []step{begin("tx", 0x100), abort()}},
		{"a transaction replaced by a later Begin", []step{begin("tx", 0x100), begin("other", 0x200)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &script{tr: checkpoint.New(0x10), txs: map[string]*checkpoint.Txn{}, chans: map[string]<-chan struct{}{}}
			for i, st := range tt.steps {
				if err := st.run(s); err != nil {
					t.Fatalf("step %d, %s: %v", i, st.text, err)
				}
			}
			defer func() {
				if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "not open") {
					t.Errorf("Commit panicked with %v, want a panic saying the transaction is not open", p)
				}
			}()
			s.tr.Commit(s.txs["tx"], 0x130)
		})
	}
}

func TestTrackerConcurrentAcksKeepSafeInOrder(t *testing.T) {
	tests := []struct {
		name    string
		txns    int
		maxSize int // events per transaction: 0..maxSize
		workers int
	}{
		{"many small transactions acked by many goroutines", 2000, 4, 16},
		{"fewer large transactions acked by a few goroutines", 200, 64, 4},
		{"transactions acked by a single goroutine out of order", 500, 8, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			type txn struct {
				commitLSN, endLSN pglogrepl.LSN
				events            int64
				tx                *checkpoint.Txn // set by the decoder before any event is sent
				acked             atomic.Int64    // incremented before each Ack
			}
			const start = pglogrepl.LSN(0x1000)
			rng := rand.New(rand.NewPCG(7, uint64(tt.txns)))
			txns := make([]*txn, tt.txns)
			ends := map[pglogrepl.LSN]bool{start: true}
			lsn := start
			for i := range txns {
				lsn += pglogrepl.LSN(0x40 + rng.IntN(0x400))
				x := &txn{commitLSN: lsn, endLSN: lsn + 0x30, events: int64(rng.IntN(tt.maxSize + 1))}
				lsn += 0x30
				txns[i] = x
				ends[x.endLSN] = true
			}
			last := txns[len(txns)-1].endLSN
			tr := checkpoint.New(start)

			// The reader plays the replication status loop: Safe must never decrease, must sit on a
			// transaction boundary, and every transaction ending at or before it must be fully acked.
			stop := make(chan struct{})
			readerErr := make(chan error, 1)
			go func() {
				prev := tr.Safe()
				for reads := 0; ; reads++ {
					s := tr.Safe()
					if s < prev {
						readerErr <- fmt.Errorf("Safe() went from %s back to %s", prev, s)
						return
					}
					if !ends[s] {
						readerErr <- fmt.Errorf("Safe() = %s is not the end of any transaction", s)
						return
					}
					for _, x := range txns {
						if x.endLSN > s {
							break
						}
						if n := x.acked.Load(); n != x.events {
							readerErr <- fmt.Errorf("Safe() = %s passed the end %s of a transaction with %d of %d events acked", s, x.endLSN, n, x.events)
							return
						}
					}
					prev = s
					select {
					case <-stop:
						readerErr <- nil
						return
					default:
						runtime.Gosched()
					}
				}
			}()

			// The sink: workers hold events for a while and ack them in random order.
			work := make(chan *txn, 256)
			var wg sync.WaitGroup
			for w := range tt.workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), 42))
					var held []*txn
					ackSome := func(k int) {
						r.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
						for _, x := range held[:k] {
							x.acked.Add(1)
							x.tx.Ack(1)
						}
						held = append(held[:0], held[k:]...)
					}
					for x := range work {
						held = append(held, x)
						if r.IntN(3) == 0 {
							ackSome(1 + r.IntN(len(held)))
						}
					}
					ackSome(len(held))
				}()
			}

			// The decoder: transactions in commit order, each event handed to the sink right after
			// Add, so acks race with the rest of the transaction and with its Commit.
			for _, x := range txns {
				x.tx = tr.Begin(x.commitLSN)
				if x.tx == nil {
					t.Fatalf("Begin(%s) = nil", x.commitLSN)
				}
				for range x.events {
					x.tx.Add()
					work <- x
				}
				tr.Commit(x.tx, x.endLSN)
			}
			close(work)
			wg.Wait()

			select {
			case <-tr.Drained():
			case <-time.After(30 * time.Second):
				t.Fatalf("not drained after every ack: %d pending, Safe() = %s", tr.Pending(), tr.Safe())
			}
			close(stop)
			if err := <-readerErr; err != nil {
				t.Fatal(err)
			}
			if got := tr.Safe(); got != last {
				t.Errorf("Safe() = %s after every ack, want the last end LSN %s", got, last)
			}
			if got := tr.Pending(); got != 0 {
				t.Errorf("Pending() = %d after every ack, want 0", got)
			}
		})
	}
}

func BenchmarkTrackerAddAck(b *testing.B) {
	b.Run("one event per transaction acked at once", func(b *testing.B) {
		tr := checkpoint.New(0)
		lsn := pglogrepl.LSN(0x100)
		b.ReportAllocs()
		for b.Loop() {
			tx := tr.Begin(lsn)
			tx.Add()
			tr.Commit(tx, lsn+0x30)
			tx.Ack(1)
			lsn += 0x40
		}
		if tr.Pending() != 0 {
			b.Fatalf("%d pending", tr.Pending())
		}
	})
	b.Run("8 events per transaction with 1024 events in flight", func(b *testing.B) {
		const perTx, window = 8, 1024
		tr := checkpoint.New(0)
		lsn := pglogrepl.LSN(0x100)
		ring := make([]*checkpoint.Txn, window)
		next := 0
		b.ReportAllocs()
		for b.Loop() {
			tx := tr.Begin(lsn)
			for range perTx {
				tx.Add()
				if old := ring[next]; old != nil {
					old.Ack(1)
				}
				ring[next] = tx
				next = (next + 1) % window
			}
			tr.Commit(tx, lsn+0x30)
			lsn += 0x40
		}
	})
	b.Run("parallel acks", func(b *testing.B) {
		tr := checkpoint.New(0)
		tx := tr.Begin(0x100)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tx.Add()
				tx.Ack(1)
			}
		})
		tr.Commit(tx, 0x130)
	})
}

// With exactly-once delivery the position committed in Kafka is the floor: a replay acknowledges
// what it covers without publishing it, so the slot moves past those transactions.
func TestTrackerFloor(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "a transaction before the floor publishes nothing and the slot moves past it",
			steps: []step{
				cover(0x200, 3),
				begin("tx1", 0x100), take("tx1", 0, false), take("tx1", 1, false), take("tx1", 99, false),
				commit("tx1", 0x130), wantSafe(0x130), wantPending(0),
			},
		},
		{
			name: "the transaction at the floor publishes only its events after the covered ones",
			steps: []step{
				cover(0x200, 3),
				begin("tx2", 0x200), take("tx2", 0, false), take("tx2", 2, false), take("tx2", 3, true), take("tx2", 4, true),
				commit("tx2", 0x230), wantSafe(0x10), ack("tx2", 2), wantSafe(0x230),
			},
		},
		{
			name: "a transaction after the floor publishes every event",
			steps: []step{
				cover(0x200, 3),
				begin("tx3", 0x300), take("tx3", 0, true), commit("tx3", 0x330), wantSafe(0x10), ack("tx3", 1), wantSafe(0x330),
			},
		},
		{
			name: "a covered transaction does not pass an earlier one still awaiting acks",
			steps: []step{
				begin("tx1", 0x100), take("tx1", 0, true), commit("tx1", 0x130),
				cover(0x200, 1),
				begin("tx2", 0x200), take("tx2", 0, false), commit("tx2", 0x230), wantSafe(0x10), wantPending(1), // tx2 is folded into tx1
				ack("tx1", 1), wantSafe(0x230), wantPending(0),
			},
		},
		{
			name: "a lower floor is ignored: a position read after a reconnect may trail what was handed over",
			steps: []step{
				cover(0x200, 3), cover(0x100, 9), cover(0x200, 1),
				begin("tx2", 0x200), take("tx2", 2, false), take("tx2", 3, true),
			},
		},
		{
			name: "a floor read while a transaction is open covers its remaining events too",
			steps: []step{
				begin("tx1", 0x100), take("tx1", 0, true),
				cover(0x100, 4),
				beginSame("tx1", 0x100), take("tx1", 0, false), take("tx1", 3, false), take("tx1", 4, true),
			},
		},
		{
			name: "a reset to another timeline drops the floor: its positions mean other transactions there",
			steps: []step{
				cover(0x200, 3), reset(0x50, 2),
				begin("tx1", 0x100), take("tx1", 0, true),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runScript(t, 0x10, tt.steps) })
	}
}
