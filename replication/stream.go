// Package replication owns the logical replication connection to PostgreSQL: it checks the
// database, creates the slot and publication when allowed, streams pgoutput messages to one
// consumer, reports the checkpoint's safe position back to the server, and reconnects with backoff.
//
// It is built in layers. The wire loop (wire.go, finish.go, message.go, dial.go) speaks the
// replication protocol on one connection: START_REPLICATION's copy mode, CopyData, keepalives and
// standby status updates; it runs no catalog SQL and asks the layer above (wireOwner) what it may
// confirm. The slot's life (session.go, slot.go, lost.go, recovery.go, identity.go, server.go,
// history.go, failover.go, creationwait.go, ledger.go) checks, identifies, creates, replaces and
// records the slot. The guards (horizon.go, membership.go, preflight.go, relations.go,
// shutdown.go) cap what may be confirmed and stop what must not go on; confirm.go is where the
// wire loop's questions are answered from both.
//
// One goroutine owns the connection (pgconn is not safe for concurrent use). It keeps sending
// standby status updates while the consumer is busy, so the walsender never times the relay out
// during backpressure.
package replication

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/metrics"
)

// Checkpoint tells the stream how far the slot may be confirmed.
type Checkpoint interface {
	// Safe is the highest position that may be confirmed.
	Safe() pglogrepl.LSN
	// Timeline is the server timeline Safe belongs to. Until the consumer has taken up a Session's
	// timeline, the stream confirms nothing beyond the slot's own position: after a failover, Safe
	// may still be a position of the old timeline, which means something else on the new one.
	Timeline() uint32
}

// Stream is one slot's replication, in three layers: the wire loop (wire.go and finish.go: copy
// mode, status updates, the read-ahead budget; no catalog SQL, no decisions about the slot), the
// slot's life (session.go, slot.go, lost.go, recovery.go, identity.go, history.go, failover.go:
// checks, identity, creation, loss and replacement, the ledger), and the guards that cap what may
// be confirmed (horizon.go, membership.go, preflight.go). The wire loop asks the layer above
// through wireOwner, which Stream implements; it never calls up otherwise.
type Stream struct {
	wire
	cfg Config
	ck  Checkpoint
	log *zap.Logger
	m   *metrics.Metrics

	ledger Ledger
	// lost is the lost slot being replaced, from the checks that found it until its gap is
	// published (recovery.go); nil otherwise.
	lost *LostSlot
	// owner holds the recovery lock from before a lost slot is dropped until its recovery is
	// recorded as ended or the session ends (recovery.go); nil otherwise.
	owner    *recoveryOwner
	floor    pglogrepl.LSN // the slot's confirmed position when the session started
	streamed atomic.Bool   // a session reached START_REPLICATION at least once (Streamed)
	// mem is the process's memory of the slot (history.go).
	mem            *Memory
	holderRecorded bool // this Stream noted in the ledger that this process streams the slot
	// identity is the server streamed from (IDENTIFY_SYSTEM), zero before the first session;
	// ledgerIdentity is what the ledger holds, as far as this process knows.
	identity       Identity
	ledgerIdentity Identity
	unrecorded     Identity // the server whose identity the ledger refused, warned about once
	newTimeline    bool     // this session's server is on a later timeline than the last one's
	// standbySlotsFinding is what warnStandbySlots last said, so a session repeats nothing.
	standbySlotsFinding string

	guard      *horizon   // caps the confirmed position at what the publication checks covered
	classifier classifier // BelongsToOutbox's connection
	stopGuard  context.CancelFunc

	// stopping is closed by StopReconnecting. setupMu guards cancelSetup, which ends the session
	// in progress while it has not started streaming.
	stopping    chan struct{}
	stopOnce    sync.Once
	setupMu     sync.Mutex
	cancelSetup context.CancelFunc
	// creationWaitTimes paces the watcher of a slot's creation (creationwait.go); zero: the
	// defaults. Tests shorten it.
	creationWaitTimes creationWaitTimes
}

// New returns a Stream that reports ck.Safe() as its confirmed position.
func New(cfg Config, ck Checkpoint, log *zap.Logger, m *metrics.Metrics) *Stream {
	cfg.setDefaults()
	guard := newHorizon(&cfg, log.Named("horizon"))
	guard.m = m
	mem := cfg.Memory
	if mem == nil {
		mem = NewMemory()
	}
	// The server the process streamed the slot from in an earlier term: a later term compares
	// with it as with an earlier session (another cluster, a superseded primary, a failover),
	// ledger or not.
	known := mem.recall(cfg.Slot)
	guard.mem, guard.slot = mem, cfg.Slot
	s := &Stream{cfg: cfg, ck: ck, log: log, m: m, ledger: NewLedger(cfg.Schema),
		guard: guard, mem: mem, identity: known.identity, stopping: make(chan struct{})}
	s.wire = wire{above: s, log: log, m: m, ahead: newReadAhead(cfg.BufferBytes), probeAfter: cfg.ReceiveTimeout / 3}
	return s
}

// Streamed reports whether a session has reached START_REPLICATION (it stays set across
// reconnections). Safe to call from any goroutine.
func (s *Stream) Streamed() bool { return s.streamed.Load() }

// StopReconnecting tells Run that a stop was requested: a session that is streaming goes on until
// ctx ends (the consumer finishes its transaction), but none is started any more, one still being
// set up is abandoned, and Run returns once the session ends. Without it a stop during an outage
// would wait for a reconnection only to drop what it brings. Safe to call from any goroutine, more
// than once.
func (s *Stream) StopReconnecting() {
	s.stopOnce.Do(func() { close(s.stopping) })
	s.setupMu.Lock()
	if s.cancelSetup != nil {
		s.cancelSetup()
	}
	s.setupMu.Unlock()
}

func (s *Stream) stopRequested() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// setup records how to end the session being set up; nil once it streams.
func (s *Stream) setup(cancel context.CancelFunc) {
	s.setupMu.Lock()
	s.cancelSetup = cancel
	s.setupMu.Unlock()
	if cancel != nil && s.stopRequested() {
		cancel()
	}
}

// Buffer returns the capacity the consumer channel should have.
func (s *Stream) Buffer() int { return s.cfg.Buffer }

// Run streams into out until ctx ends or a fatal error, reconnecting with backoff after anything
// else. It closes out when it returns. After Run returns, call Finish to report the final position.
func (s *Stream) Run(ctx context.Context, out chan<- Message) (err error) {
	defer close(out)
	// The publication checks outlive Run when it ends cleanly: Finish still confirms, capped by them.
	guardCtx, stopGuard := context.WithCancel(context.WithoutCancel(ctx))
	s.stopGuard = stopGuard
	go s.guard.run(guardCtx)
	defer func() {
		if err != nil {
			stopGuard()
		}
	}()
	var busySince time.Time
	for attempt := 0; ; attempt++ {
		if s.stopRequested() {
			return nil
		}
		started := time.Now()
		sessionCtx, cancel := context.WithCancel(ctx)
		s.setup(cancel)
		err := s.session(sessionCtx, out)
		s.setup(nil)
		cancel()
		s.remember()
		if ctx.Err() != nil {
			return nil // Finish ends the copy stream
		}
		s.closeConn(ctx)
		if IsFatal(err) {
			return err
		}
		if s.stopRequested() {
			// Lost (or never streaming) during a stop: a new session would only be dropped.
			if err != nil && !errors.Is(err, context.Canceled) {
				s.log.Info("replication interrupted during a stop; not reconnecting", zap.Error(err))
			}
			return nil
		}
		if errors.Is(err, ErrSlotActive) && !s.streamed.Load() {
			if busySince.IsZero() {
				busySince = started
			}
			if time.Since(busySince) > s.cfg.SlotBusyWait {
				return fatalf("%w: stop the other reader (another outbox-relay or Debezium) or set slot to another name", err)
			}
		}
		if time.Since(started) > time.Minute {
			attempt = 0 // it streamed for a while: this is a new outage, start the backoff over
		}
		delay := backoff(attempt)
		s.log.Warn("replication interrupted; reconnecting", zap.Error(err), zap.Duration("retry_in", delay))
		s.m.Reconnects.WithLabelValues("postgres").Inc()
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			return nil
		}
	}
}

func backoff(attempt int) time.Duration {
	return min(250*time.Millisecond<<min(attempt, 7), 15*time.Second)
}

// Reported is the last position confirmed to the server.
func (s *Stream) Reported() pglogrepl.LSN { return s.reported }
