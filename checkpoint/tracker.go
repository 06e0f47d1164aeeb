// Package checkpoint decides how far the replication slot may be confirmed.
//
// Transactions reach the relay in commit order, so a FIFO of transactions with a count of
// outstanding events is enough to compute an in-order watermark: the slot may be confirmed up to the
// end LSN of the last transaction at the head of the queue whose events Kafka has all acknowledged.
// Confirming a transaction's end LSN (not its commit LSN) is what makes PostgreSQL skip it on restart.
//
// Two filters keep a replay from publishing an event twice. Within a process: a transaction already
// committed in the tracker is not begun again after a reconnect, and one a lost session was in the
// middle of is resumed where it stopped. Across processes (exactly-once delivery): the position
// committed in Kafka (Cover) is a floor, and the events at or below it are acknowledged without
// being published. PostgreSQL replays a transaction's changes in the same order, so (commit LSN,
// index of the event in its transaction) names an event across sessions and restarts.
package checkpoint

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
)

// Tracker is the in-order acknowledgement watermark. Begin, Add, Commit, Abort and Idle are called
// from the single goroutine that decodes the stream; Txn.Ack may be called from any goroutine.
type Tracker struct {
	safe atomic.Uint64 // pglogrepl.LSN; read without the lock by the replication status loop
	// timeline is the server timeline safe was learned on (0 until the first Reset). The stream
	// reads it before safe and confirms safe only on that timeline; Reset stores safe first.
	timeline atomic.Uint32

	mu            sync.Mutex
	queue         []*Txn // begun transactions in commit order, oldest first
	open          *Txn   // the transaction between Begin and Commit, if any (also queue's tail)
	lastCommitted pglogrepl.LSN
	drained       chan struct{} // closed while the queue is empty
	// floor is the position committed in Kafka (Cover): the first floorEvents events of the
	// transaction that commits at floor, and every event of the transactions before it, are done.
	floor       pglogrepl.LSN
	floorEvents int
	acked       chan struct{} // closed by the first Ack
	ackedOnce   sync.Once
}

// Txn is one transaction as the tracker sees it.
type Txn struct {
	t           *Tracker
	detached    bool // dropped by Reset: its acks no longer count (guarded by t.mu)
	commitLSN   pglogrepl.LSN
	endLSN      pglogrepl.LSN
	outstanding int
	committed   bool
	// skip is how many of its first events are done already: covered by the floor when it began, or
	// handed to the sink before a reconnect interrupted it (Take).
	skip int
}

// New returns a tracker whose watermark starts at start, normally the slot's confirmed flush LSN.
func New(start pglogrepl.LSN) *Tracker {
	t := &Tracker{drained: make(chan struct{}), acked: make(chan struct{})}
	close(t.drained)
	t.safe.Store(uint64(start))
	return t
}

// Safe is the highest LSN that may be confirmed to PostgreSQL: every transaction that ends at or
// before it has been fully acknowledged. It never decreases, except by Reset.
func (t *Tracker) Safe() pglogrepl.LSN { return pglogrepl.LSN(t.safe.Load()) }

// Timeline is the server timeline Safe belongs to: the one given to the last Reset, 0 before.
func (t *Tracker) Timeline() uint32 { return t.timeline.Load() }

// Reset starts over on another server timeline (after a failover) at start, the slot's confirmed
// position on the new server. LSNs of different timelines cannot be compared: the new timeline
// reuses positions the old one had passed, so every transaction is forgotten (the new server
// replays from start whatever it has), the replay filter is cleared, and acks still arriving for
// transactions begun before the reset change nothing.
func (t *Tracker) Reset(start pglogrepl.LSN, timeline uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tx := range t.queue {
		tx.detached = true
	}
	if len(t.queue) > 0 {
		close(t.drained)
	}
	t.queue, t.open, t.lastCommitted = nil, nil, 0
	t.floor, t.floorEvents = 0, 0
	t.safe.Store(uint64(start))
	t.timeline.Store(timeline)
}

// Begin starts tracking the transaction that will commit at commitLSN. It returns nil when that
// transaction was already committed in this tracker: after a reconnect the server replays from the
// slot's confirmed position, and transactions still in flight from the previous session need not be
// published twice. A Begin of the transaction that is still open (a session ended in the middle of
// it, and the next one replays it from its start) resumes it: Take skips the events already handed
// over, whose acknowledgements still arrive through it.
func (t *Tracker) Begin(commitLSN pglogrepl.LSN) *Txn {
	t.mu.Lock()
	defer t.mu.Unlock()
	if commitLSN <= t.lastCommitted {
		return nil
	}
	if t.open != nil {
		if t.open.commitLSN == commitLSN {
			return t.open
		}
		// A Begin of another transaction without a Commit of the open one: the stream does not
		// replay the open one (it cannot: transactions come in commit order and nothing before it
		// was confirmed), so forget it the way Abort does; the queue never holds two open ones.
		t.abortLocked()
	}
	tx := &Txn{t: t, commitLSN: commitLSN, skip: t.coveredLocked(commitLSN)}
	if len(t.queue) == 0 {
		t.drained = make(chan struct{})
	}
	t.queue = append(t.queue, tx)
	t.open = tx
	return tx
}

// Take decides about the event at index (decoder.Event.Index: its place in the transaction) of tx:
// true means it is to be published, and it is counted like Add; false means it is done already
// (committed in Kafka at the floor given to Cover) or on its way (handed over before a reconnect
// interrupted the transaction), so it must not be published again. Call it for every event of the
// transaction, in stream order.
func (tx *Txn) Take(index int) bool {
	tx.t.mu.Lock()
	defer tx.t.mu.Unlock()
	if index < tx.skip {
		return false
	}
	tx.skip = index + 1
	tx.outstanding++
	return true
}

// Add records one more event of tx that must be acknowledged before tx is done.
func (tx *Txn) Add() {
	tx.t.mu.Lock()
	tx.outstanding++
	tx.t.mu.Unlock()
}

// Ack records that n events of tx were acknowledged by Kafka (or settled by the failure policy).
func (tx *Txn) Ack(n int) {
	t := tx.t
	t.ackedOnce.Do(func() { close(t.acked) })
	t.mu.Lock()
	tx.outstanding -= n
	if tx.outstanding < 0 {
		t.mu.Unlock()
		panic("checkpoint: more acks than events in a transaction")
	}
	if tx.outstanding == 0 && tx.committed && !tx.detached {
		t.advanceLocked()
	}
	t.mu.Unlock()
}

// CommitLSN is the LSN of the transaction's commit record.
func (tx *Txn) CommitLSN() pglogrepl.LSN { return tx.commitLSN }

// Commit closes tx; endLSN is the Commit message's transaction end LSN.
func (t *Tracker) Commit(tx *Txn, endLSN pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tx != t.open {
		panic("checkpoint: commit of a transaction that is not open")
	}
	tx.endLSN = endLSN
	tx.committed = true
	t.open = nil
	t.lastCommitted = tx.commitLSN
	t.advanceLocked()
}

// Cover sets the floor for what is published (exactly-once delivery): the position committed in
// Kafka, which holds every event of the transactions that commit before commitLSN and the first
// events of the transaction that commits at commitLSN. Transactions begun from now on are tracked
// (so the slot advances past them) but Take skips what the floor covers. A floor lower than the one
// set is ignored: the position read after a reconnect may trail what this process has handed over.
func (t *Tracker) Cover(commitLSN pglogrepl.LSN, events int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if commitLSN < t.floor || (commitLSN == t.floor && events <= t.floorEvents) {
		return
	}
	t.floor, t.floorEvents = commitLSN, events
	if t.open != nil {
		t.open.skip = max(t.open.skip, t.coveredLocked(t.open.commitLSN))
	}
}

// Floor returns the position given to Cover (zero when none).
func (t *Tracker) Floor() (commitLSN pglogrepl.LSN, events int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.floor, t.floorEvents
}

// coveredLocked is how many events of the transaction that commits at commitLSN the floor covers.
func (t *Tracker) coveredLocked(commitLSN pglogrepl.LSN) int {
	switch {
	case commitLSN < t.floor:
		return math.MaxInt
	case commitLSN == t.floor:
		return t.floorEvents
	}
	return 0
}

// Abort forgets the open transaction: the stream it came from ended before its Commit, and the next
// session will replay it from its Begin. Acks that still arrive for its events are harmless.
// It returns the commit LSN of the transaction it forgot, if there was one.
func (t *Tracker) Abort() (commitLSN pglogrepl.LSN, aborted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open == nil {
		return 0, false
	}
	commitLSN = t.open.commitLSN
	t.abortLocked()
	return commitLSN, true
}

func (t *Tracker) abortLocked() {
	if t.open == nil {
		return
	}
	t.queue[len(t.queue)-1] = nil
	t.queue = t.queue[:len(t.queue)-1]
	t.open = nil
	if len(t.queue) == 0 {
		close(t.drained)
	}
}

// Idle advances the watermark to a position the server reported (a keepalive's WAL end, or the
// LSN of a non-transactional message) when nothing is in flight and no transaction is open: there
// is nothing before that position left to publish, so an idle outbox does not pin WAL.
func (t *Tracker) Idle(walEnd pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.queue) == 0 {
		t.raiseLocked(walEnd)
	}
}

// Acknowledged is closed once the first event has been acknowledged. With exactly-once delivery
// that means a Kafka transaction has committed, and with it a position.
func (t *Tracker) Acknowledged() <-chan struct{} { return t.acked }

// Pending returns the number of transactions begun but not yet fully acknowledged.
func (t *Tracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue)
}

// Drained returns a channel that is closed once no transaction is pending. A channel obtained
// while work is pending stays open until that work is done.
func (t *Tracker) Drained() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.drained
}

func (t *Tracker) advanceLocked() {
	n := 0
	for n < len(t.queue) {
		head := t.queue[n]
		if !head.committed || head.outstanding > 0 {
			break
		}
		t.raiseLocked(head.endLSN)
		n++
	}
	if n == 0 {
		return
	}
	clear(t.queue[:n])
	t.queue = t.queue[n:]
	if len(t.queue) == 0 {
		t.queue = t.queue[:0:0] // let the backing array go; bursts can make it large
		close(t.drained)
	}
}

func (t *Tracker) raiseLocked(lsn pglogrepl.LSN) {
	if uint64(lsn) > t.safe.Load() {
		t.safe.Store(uint64(lsn))
	}
}
