package sink

import (
	"errors"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// Idempotence says whether the producer asks Kafka for a producer id and numbers its batches
// (producer.Idempotence).
type Idempotence = producer.Idempotence

const (
	// IdempotenceAuto is on where the broker allows it: a broker that denies IDEMPOTENT_WRITE
	// gets the plain producer, with a warning.
	IdempotenceAuto = producer.IdempotenceAuto
	// IdempotenceOn refuses to start when the broker denies it.
	IdempotenceOn = producer.IdempotenceOn
	// IdempotenceOff never asks: every retry of a request the broker already wrote is a duplicate.
	IdempotenceOff = producer.IdempotenceOff
)

// Transactions turns on exactly-once delivery: records go to Kafka in transactions that also
// write the Position they reach to a compacted topic, and are acknowledged only once their
// transaction has committed.
type Transactions struct {
	ID string // transactional.id; required
	// Interval is how long a Kafka transaction stays open at most while the broker keeps up;
	// default 100ms. It usually ends sooner, see Linger.
	Interval time.Duration
	// Linger is how old a transaction's first event gets before the committer, once it is free,
	// takes the transaction: under load commits go back to back, each taking what arrived while
	// the one before committed. Default Config.Linger; at most Interval. (Linger = Interval makes
	// every transaction last Interval, for tests that look at an open one.)
	Linger time.Duration
	// MaxEvents closes a transaction once it holds this many events; default 10000, at most
	// half of Config.MaxInFlight (one transaction fills while the one before commits).
	MaxEvents      int
	PositionsTopic string        // default "__outbox_relay_positions", created compacted if missing
	Timeout        time.Duration // transaction.timeout.ms asked for in InitProducerID; default 60s
}

// DefaultPositionsTopic is where positions go unless Transactions.PositionsTopic says otherwise.
const DefaultPositionsTopic = "__outbox_relay_positions"

func (t *Transactions) setDefaults() {
	if t.Interval <= 0 {
		t.Interval = 100 * time.Millisecond
	}
	if t.MaxEvents <= 0 {
		t.MaxEvents = 10000
	}
	if t.PositionsTopic == "" {
		t.PositionsTopic = DefaultPositionsTopic
	}
	if t.Timeout <= 0 {
		t.Timeout = time.Minute
	}
}

// Position is how far the events committed in Kafka reach, in WAL stream order.
type Position struct {
	// CommitLSN is the commit LSN (decoder.TxInfo.CommitLSN) of the PostgreSQL transaction of the
	// last committed event.
	CommitLSN pglogrepl.LSN
	// Events is how many events of that transaction (by decoder.Event.Index) are committed.
	Events int
	// SystemID and Timeline are the server the transaction at CommitLSN was streamed from (its
	// database cluster and WAL history): CommitLSN means something only there and on timelines
	// that descend from that one below the point where they forked. "" and 0 when unknown: a
	// position of version 1, written before positions carried their origin.
	SystemID string
	Timeline uint32
}

// Covers reports whether the event with index of the transaction committed at commitLSN is
// already committed in Kafka at p: a replay skips it.
func (p Position) Covers(commitLSN pglogrepl.LSN, index int) bool {
	return commitLSN < p.CommitLSN || (commitLSN == p.CommitLSN && index < p.Events)
}

// ErrFenced says another producer with the same transactional id (a newer epoch) took over: this
// sink stops for good and writes nothing more that a read_committed consumer could see.
var ErrFenced = errors.New("fenced: another producer with the same transactional id took over")

// ErrAborted says a Kafka transaction was aborted (the broker timed it out, or it could not
// commit): the sink stops for good without acknowledging anything of it, and the relay replays
// from the last committed position.
var ErrAborted = errors.New("kafka transaction aborted")

// Failed is closed once the sink has stopped for good: fenced (Err wraps ErrFenced), a Kafka
// transaction aborted (Err wraps ErrAborted), or the producer could not start (kafka.idempotence
// on and the broker denies it, the transactional id is not authorized, ...). Publish then returns
// Err. It closes on its own, whether Publish is being called or not.
func (s *Sink) Failed() <-chan struct{} { return s.failed }

// Err says why Failed closed; nil before.
func (s *Sink) Err() error {
	select {
	case <-s.failed:
		return s.failErr
	default:
		return nil
	}
}

// fatal stops the sink for good with err; the first call wins. Nothing more is sent: what was
// not acknowledged stays so, and is replayed after a restart.
func (s *Sink) fatal(err error) {
	s.failOnce.Do(func() {
		s.failErr = err
		close(s.failed)
		s.stop()
	})
}
