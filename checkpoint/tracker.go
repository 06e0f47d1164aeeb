// Package checkpoint decides how far the replication slot may be confirmed.
//
// Transactions reach the relay in commit order, so a FIFO of transactions with a count of
// outstanding events is enough to compute an in-order watermark: the slot may be confirmed up to the
// end LSN of the last transaction at the head of the queue whose events Kafka has all acknowledged.
// Confirming a transaction's end LSN (not its commit LSN) is what makes PostgreSQL skip it on restart.
//
// A transaction that is done (committed, with every event acknowledged, or none at all) while one
// before it is not is folded into its predecessor, whose end LSN moves forward to its own: nothing
// between the two ends is left to publish, so once the predecessor is done the slot may pass both.
// The queue then holds only transactions that still hold something back (an event in flight, or
// the open one), so its length is bounded by the sink's in-flight window, however many transactions
// without events the database commits behind a stalled event (PostgreSQL 14 sends a Begin and a
// Commit for every transaction of the database).
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
	"time"

	"github.com/jackc/pglogrepl"
)

// Tracker is the in-order acknowledgement watermark. Begin, Add, Commit, Abort and Idle are called
// from the single goroutine that decodes the stream; Txn.Ack may be called from any goroutine.
type Tracker struct {
	safe atomic.Uint64 // pglogrepl.LSN; read without the lock by the replication status loop
	// timeline is the server timeline safe was learned on (0 until the first Reset). The stream
	// reads it before safe and confirms safe only on that timeline; Reset stores safe first.
	timeline atomic.Uint32

	mu sync.Mutex
	// head and tail end the queue: begun transactions in commit order, oldest first, linked
	// through Txn.prev and next. Every one but the open tail has events outstanding: one that is
	// done leaves at once, released at the head or folded into its predecessor (doneLocked).
	head, tail    *Txn
	pending       int  // the queue's length
	open          *Txn // the transaction between Begin and Commit, if any (also the tail)
	lastCommitted pglogrepl.LSN
	drained       chan struct{} // closed while the queue is empty
	// floor is the position committed in Kafka (Cover): the first floorEvents events of the
	// transaction that commits at floor, and every event of the transactions before it, are done.
	floor       pglogrepl.LSN
	floorEvents int
	acked       chan struct{} // closed by the first Ack
	ackedOnce   sync.Once
	// safeTime is the latest commit time of the transactions released at the head: every
	// transaction before the one that raised Safe last is acknowledged, and none of them committed
	// later than this (by the server's clock). A lost slot's recovery starts from it.
	safeTime time.Time
}

// Txn is one transaction as the tracker sees it.
type Txn struct {
	t *Tracker
	// detached: out of the queue (dropped by Reset, aborted, released or folded): its acks no
	// longer count (guarded by t.mu, like the fields below).
	detached   bool
	prev, next *Txn // neighbours in the queue
	commitLSN  pglogrepl.LSN
	// endLSN is the end of the commit record: the transaction's own, or, once done transactions
	// after it were folded into it, the last of theirs.
	endLSN pglogrepl.LSN
	// commitTime is the commit time of the transaction, or, once others were folded into it, the
	// latest of theirs.
	commitTime  time.Time
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

// SafeTime is the latest commit time of the transactions Safe has passed (zero before the first, or
// when they were begun without one): Kafka has acknowledged every event of those transactions. A
// transaction that commits later in the stream may carry an earlier time, by as much as the
// server took between taking its commit time and writing its commit record.
func (t *Tracker) SafeTime() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.safeTime
}

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
	for t.head != nil {
		t.removeLocked(t.head)
	}
	t.open, t.lastCommitted = nil, 0
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
	return t.BeginAt(commitLSN, time.Time{})
}

// BeginAt is Begin for a transaction whose commit time is known: Acknowledged reports it once the
// transaction and every one before it are acknowledged.
func (t *Tracker) BeginAt(commitLSN pglogrepl.LSN, commitTime time.Time) *Txn {
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
	tx := &Txn{t: t, commitLSN: commitLSN, commitTime: commitTime, skip: t.coveredLocked(commitLSN)}
	if t.pending == 0 {
		t.drained = make(chan struct{})
	}
	if t.tail == nil {
		t.head = tx
	} else {
		t.tail.next, tx.prev = tx, t.tail
	}
	t.tail = tx
	t.pending++
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
		t.doneLocked(tx)
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
	if tx.outstanding == 0 {
		t.doneLocked(tx)
	}
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
	t.removeLocked(t.open)
	t.open = nil
}

// Idle advances the watermark to a position the server reported (a keepalive's WAL end, or the
// LSN of a non-transactional message) when nothing is in flight and no transaction is open: there
// is nothing before that position left to publish, so an idle outbox does not pin WAL.
func (t *Tracker) Idle(walEnd pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending == 0 {
		t.raiseLocked(walEnd)
	}
}

// Acknowledged is closed once the first event has been acknowledged. With exactly-once delivery
// that means a Kafka transaction has committed, and with it a position.
func (t *Tracker) Acknowledged() <-chan struct{} { return t.acked }

// Pending returns the number of transactions that hold the watermark back: the open one, and
// those committed with events not yet acknowledged (a transaction done behind one of them is
// folded into it and not counted). It is at most the events in flight plus one.
func (t *Tracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending
}

// Drained returns a channel that is closed once no transaction is pending. A channel obtained
// while work is pending stays open until that work is done.
func (t *Tracker) Drained() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.drained
}

// doneLocked takes tx, committed with nothing outstanding, out of the queue. At the head it is
// released: Safe moves to its end. Behind another transaction it is folded into its predecessor,
// which is committed (only the tail is ever open) and still awaits acks (or it would have left the
// queue itself): the predecessor's end moves to tx's, so Safe passes neither before the
// predecessor's events are all acknowledged, and reaches tx's end as soon as they are, without
// waiting for anything tx's place in the queue would have held back (nothing: tx is done).
func (t *Tracker) doneLocked(tx *Txn) {
	if tx.detached {
		return
	}
	prev := tx.prev
	if prev == nil {
		t.raiseLocked(tx.endLSN)
		if tx.commitTime.After(t.safeTime) {
			t.safeTime = tx.commitTime
		}
	} else {
		prev.endLSN = max(prev.endLSN, tx.endLSN)
		if tx.commitTime.After(prev.commitTime) {
			prev.commitTime = tx.commitTime
		}
	}
	t.removeLocked(tx)
}

// removeLocked unlinks tx from the queue and detaches it, closing drained when the queue empties.
func (t *Tracker) removeLocked(tx *Txn) {
	if tx.prev == nil {
		t.head = tx.next
	} else {
		tx.prev.next = tx.next
	}
	if tx.next == nil {
		t.tail = tx.prev
	} else {
		tx.next.prev = tx.prev
	}
	tx.prev, tx.next, tx.detached = nil, nil, true
	t.pending--
	if t.pending == 0 {
		close(t.drained)
	}
}

func (t *Tracker) raiseLocked(lsn pglogrepl.LSN) {
	if uint64(lsn) > t.safe.Load() {
		t.safe.Store(uint64(lsn))
	}
}
