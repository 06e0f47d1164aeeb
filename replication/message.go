package replication

import (
	"sync"

	"github.com/jackc/pglogrepl"
)

// Kind says what a Message carries.
type Kind uint8

const (
	// Session starts a new replication session; WALEnd is the slot's confirmed position. Anything
	// of a transaction left open by the previous session will be sent again from its Begin.
	// Timeline is the server's: when it differs from the Checkpoint's, the consumer must start
	// over at WALEnd on it (checkpoint.Tracker.Reset), since LSNs of two timelines do not compare.
	Session Kind = iota + 1
	// Data is one pgoutput message that starts at WALStart.
	Data
	// Keepalive reports the server's WAL end: everything before it has been sent.
	Keepalive
	// Barrier asks the consumer to close Done once it has handed on everything before it: a lost
	// slot's gap must reach the sink after what the lost slot streamed, never before.
	Barrier
)

// Message is what the stream hands its consumer, in WAL order.
type Message struct {
	Kind     Kind
	WALStart pglogrepl.LSN
	WALEnd   pglogrepl.LSN
	Data     []byte // owned by the consumer
	Timeline uint32 // Session: the server's timeline
	SystemID string // Session: the server's system identifier
	// ServerEnd (Session) is the server's end of WAL when the session started (IDENTIFY_SYSTEM):
	// no transaction the session can stream, nor any it streamed before, commits beyond it.
	ServerEnd pglogrepl.LSN
	// Done is closed by the consumer when it reaches a Barrier.
	Done chan struct{}

	ahead *readAhead // where Release returns len(Data) to
}

// Release tells the stream that the consumer is done with msg's data (handed on to something that
// accounts for it, or dropped), so the stream may read further ahead. Call it once per message;
// messages that are never released only hold the stream back.
func (m Message) Release() {
	if m.ahead != nil {
		m.ahead.release(int64(len(m.Data)))
	}
}

// readAhead is the byte budget of Data messages handed to the consumer and not yet released. The
// stream's goroutine is its only waiter, so a single-slot wake channel is enough.
type readAhead struct {
	max  int64
	mu   sync.Mutex
	used int64
	wake chan struct{}
}

func newReadAhead(max int64) *readAhead {
	return &readAhead{max: max, wake: make(chan struct{}, 1)}
}

// tryAcquire takes n bytes if they fit, or if nothing is held (a message larger than the budget is
// admitted alone).
func (b *readAhead) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used > 0 && b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *readAhead) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}
