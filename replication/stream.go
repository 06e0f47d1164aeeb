// Package replication owns the logical replication connection to PostgreSQL: it checks the
// database, creates the slot and publication when allowed, streams pgoutput messages to one
// consumer, reports the checkpoint's safe position back to the server, and reconnects with backoff.
//
// One goroutine owns the connection (pgconn is not safe for concurrent use). It keeps sending
// standby status updates while the consumer is busy, so the walsender never times the relay out
// during backpressure.
package replication

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/credentials"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// Config configures a Stream.
type Config struct {
	DSN               string
	PasswordFile      string // pg_password_file: read for every connection, so a rotated password is used at the next reconnect
	Slot              string
	Publication       string
	Schema            string   // of the outbox table; default "public"
	Table             string   // the outbox table
	Columns           []string // columns that must exist in the outbox table
	CreateSlot        bool
	CreatePublication bool
	// StatusInterval is how often the confirmed position is reported. It is capped at a third of
	// the server's wal_sender_timeout so the server never gives up on a busy relay, and at a third
	// of ReceiveTimeout so a silent server is asked for a reply in time.
	StatusInterval time.Duration
	// ReceiveTimeout is how long the server may stay silent before the connection is presumed dead.
	// A walsender that receives the relay's status updates sends nothing on an idle database, so
	// after a third of it in silence the status updates ask for a reply. Default 2m.
	ReceiveTimeout time.Duration
	// SlotBusyWait is how long a first start waits for a slot another process holds (for example
	// the walsender of a relay that was just killed) before giving up. Default 30s.
	SlotBusyWait time.Duration
	// Messages asks pgoutput for logical decoding messages (heartbeats, the table-free outbox).
	Messages bool
	// NoTable: the outbox is logical decoding messages only (Messages must be set). There is no
	// table to check, and the publication need only exist (pgoutput requires one; created empty
	// when missing and CreatePublication is set): pgoutput sends every message whatever the
	// publication holds, so no position is capped at a publication check either.
	NoTable bool
	// Buffer is how many messages may wait for the consumer. Default 32.
	Buffer int
	// BufferBytes caps the bytes of the Data messages handed to the consumer and not yet released
	// (Message.Release): those waiting in the channel and the one the consumer is working on. Each
	// holds a copy of its row outside the sink's in-flight limits, so with large rows the message
	// count alone would let the buffer hold Buffer rows. A message larger than the cap is admitted
	// when nothing else is held, so a huge row cannot wedge the stream. Default 16 MiB.
	BufferBytes int64
	// BeforeStream, when set, runs in the first session that gets this far, after the slot exists
	// (so nothing committed from here on can be missed) and before START_REPLICATION: the relay
	// waits for Kafka and backfills there. snapshot names the snapshot exported when this session
	// created the slot with ExportSnapshot (the rows it shows are exactly those committed before the
	// slot's consistent point); it is "" when the slot already existed.
	BeforeStream func(ctx context.Context, snapshot string) error
	// OnWalsender, when set, runs in each session as soon as the replication connection is up,
	// before the session creates, recovers or streams the slot, with that connection's backend
	// PID: the walsender that will hold the slot. The leader publishes it there
	// (leader.Term.PublishWalsender), so the next leader knows which walsender to end before the
	// slot can show it active. An error ends the session, which is retried.
	OnWalsender func(ctx context.Context, pid int32) error
	// ExportSnapshot creates a missing slot with an exported snapshot, for BeforeStream.
	ExportSnapshot bool
	// Failover makes the slot a failover slot (PostgreSQL 17+; a fatal error on older servers):
	// created with FAILOVER, or altered when it exists without it.
	Failover bool
	// OnSlotLost is what a lost slot makes the stream do: SlotLostStop (the default) or
	// SlotLostRecover, which replaces the slot and calls Recover with the replacement's exported
	// snapshot before streaming from it (recovery.go). It needs the slot ledger at migration 0008.
	OnSlotLost string
	// MessageEvents: events also come as logical decoding messages, which are stored nowhere but
	// the WAL, so a lost slot's gap cannot be recovered whole (with NoTable, not at all).
	MessageEvents bool
	// Recover publishes a lost slot's gap from the outbox table, as of snapshot (the replacement
	// slot's: exactly the transactions committed before its consistent point), and returns once
	// Kafka holds it all. An error leaves the recovery under way: the next session starts it again.
	Recover func(ctx context.Context, snapshot string, lost LostSlot) (Recovery, error)
	// Memory is the process's memory of the slots it streamed (history.go), shared by every
	// Stream the process builds (one per leadership term). Nil: this Stream's own.
	Memory *Memory
}

// ConnConfig parses DSN for a new connection, with the password read from PasswordFile now.
func (c *Config) ConnConfig() (*pgx.ConnConfig, error) {
	return credentials.PostgresConfig(c.DSN, c.PasswordFile)
}

// Connect opens an ordinary connection with the stream's settings: what the checks, the ledger and
// the relay's helpers (backfill, heartbeat) use.
func (c *Config) Connect(ctx context.Context) (*pgx.Conn, error) {
	conf, err := c.ConnConfig()
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, conf)
}

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = time.Second
	}
	if c.ReceiveTimeout <= 0 {
		c.ReceiveTimeout = 2 * time.Minute
	}
	if c.SlotBusyWait <= 0 {
		c.SlotBusyWait = 30 * time.Second
	}
	if c.Buffer <= 0 {
		c.Buffer = 32
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = 16 << 20
	}
}

func (c *Config) qualifiedTable() string { return pgx.Identifier{c.Schema, c.Table}.Sanitize() }

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

// Checkpoint tells the stream how far the slot may be confirmed.
type Checkpoint interface {
	// Safe is the highest position that may be confirmed.
	Safe() pglogrepl.LSN
	// Timeline is the server timeline Safe belongs to. Until the consumer has taken up a Session's
	// timeline, the stream confirms nothing beyond the slot's own position: after a failover, Safe
	// may still be a position of the old timeline, which means something else on the new one.
	Timeline() uint32
}

// Stream is the replication connection and its receive loop.
type Stream struct {
	cfg Config
	ck  Checkpoint
	log *zap.Logger
	m   *metrics.Metrics

	conn   *pgconn.PgConn
	ledger Ledger
	// lost is the lost slot being replaced, from the checks that found it until its gap is
	// published (recovery.go); nil otherwise.
	lost *LostSlot
	// owner holds the recovery lock from before a lost slot is dropped until its recovery is
	// recorded as ended or the session ends (recovery.go); nil otherwise.
	owner      *recoveryOwner
	interval   time.Duration // status interval for the current session
	nextStatus time.Time
	lastStatus time.Time
	floor      pglogrepl.LSN // the slot's confirmed position when the session started
	received   pglogrepl.LSN
	reported   pglogrepl.LSN
	streamed   atomic.Bool // a session reached START_REPLICATION at least once (Streamed)
	ahead      *readAhead
	// mem is the process's memory of the slot (history.go). serverEnd is the server's end of WAL
	// as this session knows it (IDENTIFY_SYSTEM, then data and keepalives): nothing beyond it is
	// ever confirmed. maxXid is the newest transaction id of a Begin received.
	mem            *Memory
	serverEnd      pglogrepl.LSN
	maxXid         uint32
	hasXid         bool
	holderRecorded bool // this Stream noted in the ledger that this process streams the slot
	// identity is the server streamed from (IDENTIFY_SYSTEM), zero before the first session;
	// ledgerIdentity is what the ledger holds, as far as this process knows.
	identity       Identity
	ledgerIdentity Identity
	unrecorded     Identity // the server whose identity the ledger refused, warned about once
	newTimeline    bool     // this session's server is on a later timeline than the last one's
	// standbySlotsFinding is what warnStandbySlots last said, so a session repeats nothing.
	standbySlotsFinding string
	// receiveTimeout is how long the server may be silent in this session: ReceiveTimeout, or
	// longer when the server's wal_sender_timeout says a busy walsender may take longer to answer.
	receiveTimeout time.Duration

	guard      *horizon   // caps the confirmed position at what the publication checks covered
	classifier classifier // BelongsToOutbox's connection
	stopGuard  context.CancelFunc

	// copying is set while the connection is in copy mode (START_REPLICATION succeeded): only then
	// is there a copy stream for Finish to end.
	copying bool
	// streamingSince is when the session's START_REPLICATION succeeded; stopSigns watches its
	// keepalives. Both tell when the server shuts down (shutdown.go).
	streamingSince time.Time
	stopSigns      stopSigns
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
	return &Stream{cfg: cfg, ck: ck, log: log, m: m, ledger: NewLedger(cfg.Schema),
		ahead: newReadAhead(cfg.BufferBytes), guard: guard, mem: mem, identity: known.identity,
		stopping: make(chan struct{})}
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

// session runs one replication connection from its checks to its end.
func (s *Stream) session(ctx context.Context, out chan<- Message) error {
	// A recovery this session owns but does not complete is left under way, for the next owner.
	defer s.releaseRecovery(ctx)
	conf, err := s.cfg.ConnConfig()
	if err != nil {
		return Fatal(err)
	}
	// The replication connection is dialled while the checks run: a connection's handshake (a
	// backend forked, SCRAM) is the larger part of a start. Nothing is asked on it before they pass.
	dialled := s.dialReplication(ctx, conf)
	checked, err := s.prepare(ctx)
	if err != nil {
		dialled.discard()
		return err
	}
	// The checks' connection then serves the ledger's writes of this start, and closes once the
	// session streams.
	defer checked.closeConn(ctx)
	slot := checked.slot
	s.conn, err = dialled.wait(ctx)
	if err != nil {
		return classifyConnect(err, "replication")
	}
	if err := s.identify(ctx, checked.recorded); err != nil {
		return err
	}
	if err := s.checkHistory(ctx, s.serverEnd); err != nil {
		return err
	}
	if checked.systemID != "" && checked.systemID != s.identity.SystemID {
		// Both agree with the cluster streamed before, if any (each was compared with it): a
		// multi-host pg_dsn, or a name that moved, reached two clusters on a first start. The checks
		// (and the outbox table's OID they noted) belong to another cluster than the stream would.
		return fatalf("pg_dsn reached two database clusters at once: the checks' connection one with system identifier %s, the replication connection one with %s (a multi-host pg_dsn listing servers of different clusters, or a host name that moved between the two connections). Make pg_dsn lead to the one cluster to stream from, and restart",
			checked.systemID, s.identity.SystemID)
	}
	if err := refuseStandby(ctx, s.conn, "replication connection"); err != nil {
		return err
	}
	if s.cfg.Failover {
		if err := checkFailoverSupported(serverMajor(s.conn.ParameterStatus("server_version"))); err != nil {
			return err
		}
	}
	if s.cfg.OnWalsender != nil {
		pid, err := s.backendPID(ctx)
		if err != nil {
			return err
		}
		if err := s.cfg.OnWalsender(ctx, pid); err != nil {
			return fmt.Errorf("before using slot %q from walsender PID %d: %w", s.cfg.Slot, pid, err)
		}
	}
	snapshot := ""
	if !slot.Exists {
		if slot, snapshot, err = s.createSlot(ctx); err != nil {
			return err
		}
	} else {
		var walEnd pglogrepl.LSN
		if slot.ConfirmedFlush, walEnd, err = s.confirmedOnStreamServer(ctx); err != nil {
			return err
		}
		check := slotCheck{confirmed: slot.ConfirmedFlush, walEnd: walEnd, holder: checked.holder, holderOK: checked.holderOK}
		if err := s.checkSlotPosition(check); err != nil {
			return err
		}
		if err := s.carryPublication(check); err != nil {
			return err
		}
		if err := s.ensureFailover(ctx, s.newTimeline); err != nil {
			return err
		}
	}
	if s.identity != s.ledgerIdentity {
		s.recordIdentity(ctx, checked.conn)
	}
	if s.cfg.BeforeStream != nil && !s.streamed.Load() {
		// The exported snapshot stays valid until the next command on this connection, so the hook
		// runs before START_REPLICATION. A replacement slot's snapshot is the recovery's: a
		// first start's backfill does not read it.
		exported := snapshot
		if s.lost != nil {
			exported = ""
		}
		waited := time.Now()
		if err := s.cfg.BeforeStream(ctx, exported); err != nil {
			return err
		}
		if time.Since(waited) > checksConnIdle {
			// A long wait (Kafka down, a backfill): a connection idle that long may have been cut
			// silently on the way (a NAT's idle timeout), and a write on it would hang.
			checked.closeConn(ctx)
		}
	}
	if s.lost != nil {
		if err := s.recover(ctx, out, slot, snapshot); err != nil {
			return err
		}
	}
	// SQL on the replication connection; it clears an exported snapshot, so not before the hooks
	// that read it.
	s.warnStandbySlots(ctx)
	s.floor = slot.ConfirmedFlush
	if s.reported == 0 {
		// The slot's own position is confirmed already (after a new timeline, the old one's
		// reported position was dropped): say that, not 0/0, wherever "last confirmed" is logged.
		s.reported = s.floor
	}
	args := []string{"proto_version '1'", "publication_names " + quoteLiteral(s.cfg.Publication)}
	if s.cfg.Messages {
		args = append(args, "messages 'true'")
	}
	err = pglogrepl.StartReplication(ctx, s.conn, pgx.Identifier{s.cfg.Slot}.Sanitize(), 0,
		pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication, PluginArgs: args})
	if err != nil {
		return s.streamError(err)
	}
	s.copying = true
	s.streamingSince, s.stopSigns = time.Now(), stopSigns{}
	// Streaming: from here on only ctx ends the session, so a stop can finish the transaction.
	s.setup(nil)
	s.streamed.Store(true)
	s.mem.note(s.cfg.Slot, s.identity, true, s.serverEnd, s.floor, 0, false)
	if err := s.recordHolder(ctx, checked.conn); err != nil {
		return err
	}
	checked.closeConn(ctx)
	s.log.Info("streaming", zap.String("slot", s.cfg.Slot), zap.String("publication", s.cfg.Publication),
		zap.Stringer("from", s.floor), zap.Duration("status_interval", s.interval),
		zap.Duration("receive_timeout", s.receiveTimeout))
	s.nextStatus = time.Now().Add(s.interval)
	if err := s.forward(ctx, out, Message{Kind: Session, WALEnd: s.floor, Timeline: s.identity.Timeline, SystemID: s.identity.SystemID, ServerEnd: s.serverEnd}); err != nil {
		return err
	}
	return s.receive(ctx, out)
}

// checked is what prepare learned on the checks' ordinary connection.
type checked struct {
	// conn is the checks' connection, still open (closeConn closes it).
	conn *pgx.Conn
	slot SlotInfo
	// recorded is, on the process's first session, the server the ledger says the slot was last
	// streamed from (zero when it recorded nothing).
	recorded Identity
	// systemID is the cluster the checks ran on ("" when the role may not read it).
	systemID string
	// holder is the process the ledger says streamed the slot last; holderOK is false when the
	// ledger cannot say.
	holder   string
	holderOK bool
}

// prepare runs the checks on an ordinary connection and returns the slot's current state. Which
// database cluster it reached is compared first: a table OID or a slot of another cluster means
// nothing, and comparing those first would blame the wrong thing (a "recreated" outbox table).
func (s *Stream) prepare(ctx context.Context) (checked, error) {
	conn, err := s.cfg.Connect(ctx)
	if err != nil {
		return checked{}, classifyConnect(err, "checks")
	}
	c := checked{conn: conn}
	ok := false
	defer func() {
		if !ok {
			c.closeConn(ctx)
		}
	}()
	c.recorded = s.readLedgerIdentity(ctx, conn)
	// pg_control_system() is executable by PUBLIC by default; where it was revoked, the comparison
	// on the replication connection (IDENTIFY_SYSTEM) still refuses another cluster, only later.
	if err := conn.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&c.systemID); err != nil {
		s.log.Debug("cannot read the system identifier on the checks' connection", zap.Error(err))
		c.systemID = ""
	}
	if c.systemID != "" {
		if err := s.checkCluster(c.systemID, c.recorded); err != nil {
			return checked{}, err
		}
	}
	if err := refuseStandby(ctx, conn.PgConn(), "checks' connection"); err != nil {
		return checked{}, err
	}
	if c.slot, err = s.prepareSlot(ctx, conn); err != nil {
		return checked{}, err
	}
	if c.slot.Exists {
		if c.holder, c.holderOK, err = s.ledger.Holder(ctx, conn, s.cfg.Slot); err != nil {
			s.log.Debug("cannot read who streamed the slot last from the slot ledger", zap.Error(err))
			c.holderOK = false
		}
	}
	ok = true
	return c, nil
}

// checksConnIdle is how long the checks' connection may have idled for the start's last ledger
// write to reuse it (a connection costs a backend fork and a handshake: a tenth of a start).
const checksConnIdle = 10 * time.Second

// closeConn closes the checks' connection, if still open.
func (c *checked) closeConn(ctx context.Context) {
	if c.conn != nil {
		c.conn.Close(context.WithoutCancel(ctx))
		c.conn = nil
	}
}

// dialling is a replication connection being opened (dialReplication).
type dialling struct {
	cancel context.CancelFunc
	done   chan struct{}
	conn   *pgconn.PgConn
	err    error
}

// dialReplication opens the replication connection in the background.
func (s *Stream) dialReplication(ctx context.Context, conf *pgx.ConnConfig) *dialling {
	rcfg := &conf.Config
	rcfg.RuntimeParams["replication"] = "database"
	// pgoutput sends values in their text form, which for bytea follows the session's bytea_output,
	// and ALTER DATABASE/ROLE ... SET bytea_output = 'escape' reaches the walsender too: the
	// decoder reads hex. Startup options win over database and role settings.
	rcfg.RuntimeParams["bytea_output"] = "hex"
	// Timestamps (columns.timestamp) are read in the ISO format, whatever DateStyle the database
	// or role sets.
	rcfg.RuntimeParams["DateStyle"] = "ISO"
	// pgproto3 reads the socket 8 KiB at a time; a busy stream is tens of MB/s, so read it in
	// larger pieces and spare the syscalls.
	rcfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, 256<<10), w)
	}
	if _, ok := rcfg.RuntimeParams["application_name"]; !ok {
		rcfg.RuntimeParams["application_name"] = "outbox-relay"
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &dialling{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.conn, d.err = pgconn.ConnectConfig(ctx, rcfg)
	}()
	return d
}

// wait returns the connection once it is open.
func (d *dialling) wait(ctx context.Context) (*pgconn.PgConn, error) {
	defer d.cancel()
	select {
	case <-d.done:
		return d.conn, d.err
	case <-ctx.Done():
		d.discard()
		return nil, ctx.Err()
	}
}

// discard gives the connection up: the dial ends at once, and what it opened is closed.
func (d *dialling) discard() {
	d.cancel()
	<-d.done // the dial honours its cancelled context
	if d.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // an unused connection: the goodbye goes out at once
		defer cancel()
		d.conn.Close(ctx)
	}
}

// readLedgerIdentity learns the server the ledger says the slot was last streamed from, until
// this Stream knows it, and returns it while the process has streamed from no server (the identity
// a first session compares with; zero otherwise). Every session of a first term compares with it,
// also the retries after one that ended before IDENTIFY_SYSTEM (a busy slot, a standby reached):
// ledgerIdentity is then only what the ledger said, since recordIdentity needs a known server. A
// later term of the process reads it too: its Stream starts with the server the process
// remembers, which may be a promoted standby an earlier term reached but never streamed from, so
// only the ledger says whether this term resumes from that server's synchronised slot
// (resumesSynced).
func (s *Stream) readLedgerIdentity(ctx context.Context, conn *pgx.Conn) Identity {
	if s.ledgerIdentity == (Identity{}) {
		recorded, known, err := s.ledger.Identity(ctx, conn, s.cfg.Slot)
		switch {
		case err != nil && s.identity == (Identity{}):
			// Like the rest of the ledger, optional: without it only the in-process comparison remains.
			s.log.Warn("cannot read the server identity recorded in the slot ledger", zap.String("table", s.ledger.Table()), zap.Error(err))
		case err != nil:
			s.log.Debug("cannot read the server identity recorded in the slot ledger", zap.String("table", s.ledger.Table()), zap.Error(err))
		case known:
			s.ledgerIdentity = recorded
		}
	}
	if s.identity == (Identity{}) {
		return s.ledgerIdentity
	}
	return Identity{}
}

// backendPID is the replication connection's backend, the walsender, as the server numbers it
// (behind a pooler, the PID the connection was given is the pooler's own).
func (s *Stream) backendPID(ctx context.Context) (int32, error) {
	results, err := s.conn.Exec(ctx, "SELECT pg_catalog.pg_backend_pid()").ReadAll()
	if err != nil {
		return 0, fmt.Errorf("read the replication connection's backend PID: %w", err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 {
		return 0, errors.New("read the replication connection's backend PID: no row")
	}
	pid, err := strconv.ParseInt(string(results[0].Rows[0][0]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("the replication connection's backend PID %q: %w", results[0].Rows[0][0], err)
	}
	return int32(pid), nil
}

// confirmedOnStreamServer reads the slot's confirmed position over the replication connection. The
// checks read it on their own connection, which a multi-host pg_dsn (or a host name that moved) may
// have led to another server than the one streamed from; the floor confirmed to the server must be
// that server's own. walEnd is that server's flushed end of WAL, read after the slot (the view
// reads every slot before the target list runs), so a slot beyond it was confirmed beyond it.
func (s *Stream) confirmedOnStreamServer(ctx context.Context) (confirmed, walEnd pglogrepl.LSN, err error) {
	// A replication=database connection runs simple-protocol SQL.
	results, err := s.conn.Exec(ctx, "SELECT confirmed_flush_lsn, pg_catalog.pg_current_wal_flush_lsn() FROM pg_catalog.pg_replication_slots WHERE slot_name = "+quoteLiteral(s.cfg.Slot)).ReadAll()
	if err != nil {
		return 0, 0, fmt.Errorf("read slot %q on the replication connection: %w", s.cfg.Slot, err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || results[0].Rows[0][0] == nil {
		return 0, 0, fmt.Errorf("slot %q, which the checks found, is not a usable slot on the server the replication connection reached (a multi-host pg_dsn, or a host name that moved between the two connections); retrying", s.cfg.Slot)
	}
	row := results[0].Rows[0]
	if confirmed, err = pglogrepl.ParseLSN(string(row[0])); err != nil {
		return 0, 0, fmt.Errorf("slot %q confirmed_flush_lsn %q: %w", s.cfg.Slot, row[0], err)
	}
	if walEnd, err = pglogrepl.ParseLSN(string(row[1])); err != nil {
		return 0, 0, fmt.Errorf("pg_current_wal_flush_lsn %q: %w", row[1], err)
	}
	return confirmed, walEnd, nil
}

func (s *Stream) prepareSlot(ctx context.Context, conn *pgx.Conn) (SlotInfo, error) {
	if err := preflight(ctx, conn, &s.cfg); err != nil {
		return SlotInfo{}, err
	}
	if !s.cfg.NoTable {
		var oid uint32
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1)::oid", s.cfg.qualifiedTable()).Scan(&oid); err != nil {
			return SlotInfo{}, fmt.Errorf("read the OID of %s: %w", s.cfg.qualifiedTable(), err)
		}
		if err := s.guard.start(oid); err != nil {
			return SlotInfo{}, err
		}
	}
	var database string
	var senderTimeout time.Duration
	var timeoutText string
	if err := conn.QueryRow(ctx, "SELECT current_database(), current_setting('wal_sender_timeout')").Scan(&database, &timeoutText); err != nil {
		return SlotInfo{}, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	senderTimeout = parsePGDuration(timeoutText)
	s.interval = s.cfg.StatusInterval
	if senderTimeout > 0 && s.interval > senderTimeout/3 {
		s.interval = senderTimeout / 3
	}
	s.interval = min(s.interval, s.cfg.ReceiveTimeout/3)
	s.receiveTimeout = receiveTimeout(s.cfg.ReceiveTimeout, senderTimeout, s.interval)
	s.guard.setStatusInterval(s.interval)
	slot, err := ReadSlot(ctx, conn, s.cfg.Slot)
	if err != nil {
		return SlotInfo{}, err
	}
	// What this process streamed outlives its leadership terms: a term after a promotion of a
	// standby without the slot finds it gone, ledger or not.
	known := s.mem.recall(s.cfg.Slot)
	if s.cfg.OnSlotLost == SlotLostRecover {
		if slot, err = s.replaceLost(ctx, conn, slot, known.streamed); err != nil {
			return SlotInfo{}, err
		}
		if s.lost != nil {
			return slot, nil // missing: the session creates the replacement
		}
	}
	switch {
	case !slot.Exists && (s.streamed.Load() || known.streamed):
		return SlotInfo{}, fmt.Errorf("%w: slot %q no longer exists (it was dropped while the relay was using it, or pg_dsn now leads to a promoted standby, where logical slots exist only as failover slots from PostgreSQL 17 on); the relay does not recreate it because events committed after its last confirmed position %s would be skipped. %s",
			ErrSlotLost, s.cfg.Slot, max(s.reported, known.confirmed), s.recovery())
	case !slot.Exists && !s.cfg.CreateSlot:
		return SlotInfo{}, fatalf("replication slot %q does not exist and create_slot is off: create it with SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", s.cfg.Slot, s.cfg.Slot)
	case !slot.Exists:
		// A slot this relay created before and that is gone now was lost; creating a new one would
		// start after the gap and skip its events without a trace.
		e, known, err := s.ledger.Lookup(ctx, conn, s.cfg.Slot)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			// The ledger is optional; a least-privilege role may not read it.
			s.log.Warn("cannot read the slot ledger, so a lost slot cannot be told from a first start: GRANT SELECT, INSERT, UPDATE ON it to the relay's role",
				zap.String("table", LedgerTable), zap.Error(err))
			err, known = nil, false
		}
		if err != nil {
			return SlotInfo{}, err
		}
		if known && e.ConsistentLSN == 0 {
			return SlotInfo{}, fmt.Errorf("%w: slot %q, which the relay streamed (recorded on %s), no longer exists (dropped, or invalidated because PostgreSQL removed WAL it needed, or the server is a promoted standby, where logical slots exist only as failover slots from PostgreSQL 17 on); events committed after its last confirmed position may never be published. %s",
				ErrSlotLost, s.cfg.Slot, e.CreatedAt.Format(time.RFC3339), s.recovery())
		}
		if known {
			return SlotInfo{}, fmt.Errorf("%w: slot %q, created by the relay on %s at %s, no longer exists (dropped, or invalidated because PostgreSQL removed WAL it needed, or the server is a promoted standby, where logical slots exist only as failover slots from PostgreSQL 17 on); events committed after its last confirmed position may never be published. %s",
				ErrSlotLost, s.cfg.Slot, e.CreatedAt.Format(time.RFC3339), e.ConsistentLSN, s.recovery())
		}
		return slot, nil
	}
	if s.cfg.OnSlotLost != SlotLostRecover {
		if err := s.refuseUnfinishedRecovery(ctx, conn); err != nil {
			return SlotInfo{}, err
		}
	}
	if err := checkSlot(slot, &s.cfg, database); err != nil {
		return SlotInfo{}, err
	}
	if slot.Active {
		return SlotInfo{}, fmt.Errorf("%w: slot %q is being streamed by PostgreSQL backend PID %d%s", ErrSlotActive, s.cfg.Slot, slot.ActivePID, describeBackend(ctx, conn, slot.ActivePID))
	}
	return slot, nil
}

// recovery is what to do about a lost slot: the new slot's backfill publishes the gap from the
// outbox table, once the ledger lets the relay create it.
func (s *Stream) recovery() string {
	return fmt.Sprintf("To recover: stop every instance, run `outbox-relay forget-slot` (or DELETE FROM %s WHERE slot = %s) so that the relay may create a new slot, and start one instance once with backfill: true and backfill_since covering the gap (from before the last event Kafka acknowledged): it publishes those events from the outbox table, consistently with the new slot (docs/operations.md, \"Recovering a lost or missing slot\")",
		s.ledger.Table(), quoteLiteral(s.cfg.Slot))
}

// describeBackend says who holds the slot, to make "slot is active" actionable.
func describeBackend(ctx context.Context, conn *pgx.Conn, pid int32) string {
	var app, addr string
	err := conn.QueryRow(ctx, "SELECT coalesce(application_name, ''), coalesce(host(client_addr), 'local') FROM pg_stat_activity WHERE pid = $1", pid).Scan(&app, &addr)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" (application_name=%q, client %s)", app, addr)
}

// ledgerWriteTimeout bounds recording a new slot in the ledger, which outlives a stop.
const ledgerWriteTimeout = 10 * time.Second

func (s *Stream) createSlot(ctx context.Context) (slot SlotInfo, snapshot string, err error) {
	stopWatch := s.watchSlotCreation(ctx, int32(s.conn.PID()))
	res, err := pglogrepl.ParseCreateReplicationSlot(s.conn.Exec(ctx, s.createSlotCommand()))
	stopWatch()
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch pgErr.Code {
			case "42710":
				return SlotInfo{}, "", fmt.Errorf("slot %q was created by another process meanwhile: %w", s.cfg.Slot, err)
			case "53400":
				return SlotInfo{}, "", fatalf("cannot create replication slot %q: %s: raise max_replication_slots or drop an unused slot", s.cfg.Slot, pgErr.Message)
			}
		}
		return SlotInfo{}, "", fmt.Errorf("create replication slot %q: %w", s.cfg.Slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return SlotInfo{}, "", fmt.Errorf("slot %q consistent point %q: %w", s.cfg.Slot, res.ConsistentPoint, err)
	}
	s.log.Info("created replication slot", zap.String("slot", s.cfg.Slot), zap.Stringer("consistent_point", lsn), zap.Bool("failover", s.cfg.Failover),
		zap.Bool("replaces_a_lost_slot", s.lost != nil))
	// The process owns the slot from here on, as if it had streamed it: should the session end
	// before it streams (Kafka down for BeforeStream, say) and the slot vanish, the next session or
	// term must take it for lost, ledger or not, not for a first start that skips the gap.
	s.mem.note(s.cfg.Slot, s.identity, true, s.serverEnd, 0, 0, false)
	if err := s.recordSlot(ctx, lsn); err != nil && s.lost != nil {
		// A replacement's recovery is ended only for the slot the ledger names: without the
		// record, another process's replacement could end it.
		return SlotInfo{}, "", fmt.Errorf("record the replacement of lost slot %q in %s (retrying the recovery): %w", s.cfg.Slot, s.ledger.Table(), err)
	}
	return SlotInfo{Exists: true, Plugin: "pgoutput", ConfirmedFlush: lsn}, res.SnapshotName, nil
}

// recordSlot notes the new slot in the ledger, so that its loss is recognised after a restart.
// Not being able to is worth a warning, not a failure: the slot works without it.
//
// It is the one write that does not end with the caller's context: the slot exists from here on,
// whether or not the relay is stopping. Missing it, a stop during a first start would leave a slot
// unknown to the ledger until a later session records the server's identity; if the slot were
// lost before that (or the ledger predates identities), its loss would read as a first start, and
// a new slot would skip what was committed in between. ledgerWriteTimeout bounds the wait
// instead. (A stop that interrupts CREATE_REPLICATION_SLOT itself may still leave a slot the
// relay never saw created.)
func (s *Stream) recordSlot(ctx context.Context, lsn pglogrepl.LSN) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerWriteTimeout)
	defer cancel()
	if s.lost != nil && s.owner != nil {
		// A replacement is recorded by the recovery's owner, on the connection that holds the
		// recovery lock; its recorded creation identifies it to EndRecovery.
		created, err := s.ledger.RecordReplacementSlot(ctx, s.owner.conn, s.cfg.Slot, lsn)
		if err != nil {
			s.log.Warn("cannot record the replacement slot in the ledger", zap.String("table", LedgerTable), zap.Error(err))
			return err
		}
		s.lost.Created = created
		return nil
	}
	conn, err := s.cfg.Connect(ctx)
	if err == nil {
		defer conn.Close(context.WithoutCancel(ctx))
		var exists bool
		if exists, err = s.ledger.Exists(ctx, conn); err == nil && !exists {
			s.log.Warn("the slot ledger table does not exist (run outbox-relay migrate); if this slot is ever lost, a restart cannot tell and creates a new one", zap.String("table", LedgerTable))
			return errors.New("the slot ledger table does not exist")
		}
		if err == nil {
			err = s.ledger.RecordSlot(ctx, conn, s.cfg.Slot, lsn)
		}
	}
	if err != nil {
		s.log.Warn("cannot record the new slot in the ledger; if it is ever lost, a restart cannot tell", zap.String("table", LedgerTable), zap.Error(err))
	}
	return err
}

// streamError maps errors of START_REPLICATION and of the stream to actionable ones.
func (s *Stream) streamError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("replication stream: %w", err)
	}
	switch pgErr.Code {
	case "55006": // object_in_use: "replication slot ... is active for PID n"
		return fmt.Errorf("%w: %s", ErrSlotActive, pgErr.Message)
	case "42704": // undefined_object: the slot or the publication
		if strings.HasPrefix(pgErr.Message, "publication ") && s.cfg.NoTable {
			return fatalf("%s: publication %q was dropped while the relay was streaming; pgoutput needs it, although messages do not depend on what it publishes: recreate it (CREATE PUBLICATION %s) and restart",
				pgErr.Message, s.cfg.Publication, pgx.Identifier{s.cfg.Publication}.Sanitize())
		}
		if strings.HasPrefix(pgErr.Message, "publication ") {
			return fatalf("%s: publication %q was dropped while the relay was streaming, so outbox rows written since are not in the replication stream: recreate it (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)), republish the rows written meanwhile (backfill_since), and restart",
				pgErr.Message, s.cfg.Publication, pgx.Identifier{s.cfg.Publication}.Sanitize(), s.cfg.qualifiedTable())
		}
		if s.cfg.OnSlotLost == SlotLostRecover {
			// Also before this process streamed it: the session's checks found the slot, and it
			// went while the session waited (for Kafka, say) before START_REPLICATION. The next
			// session's checks decide from the slot ledger, as for any missing slot.
			return fmt.Errorf("%w: %s", errSlotGone, pgErr.Message)
		}
		if s.streamed.Load() {
			return fmt.Errorf("%w: %s", ErrSlotLost, pgErr.Message)
		}
		return fatalf("%s: check the slot and publication settings", pgErr.Message)
	case "55000": // object_not_in_prerequisite_state: e.g. the slot's WAL was removed
		if s.cfg.OnSlotLost == SlotLostRecover {
			return fmt.Errorf("%w: %s", errSlotGone, pgErr.Message)
		}
		return fmt.Errorf("%w: %s: the slot can no longer be streamed; drop and recreate it, then reconcile outbox rows written since %s", ErrSlotLost, pgErr.Message, s.reported)
	case "57P01", "57P02", "57P03": // server shutting down or restarting
		return fmt.Errorf("PostgreSQL is shutting down: %w", err)
	}
	if pgErr.Code[:2] == "42" || pgErr.Code[:2] == "22" {
		return fatalf("replication stream: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("replication stream: %w", err)
}

// receive is the session's read loop.
func (s *Stream) receive(ctx context.Context, out chan<- Message) error {
	// ReceiveMessage with a cancellable context starts a goroutine per call to watch it, which at
	// tens of thousands of messages a second is most of this loop's cost. Read with a socket
	// deadline instead, moved only when the next status update is due, and expire it when ctx ends.
	netConn := s.conn.Conn()
	defer netConn.SetDeadline(time.Time{})
	defer interruptOnDone(ctx, netConn)() // before the deadline is cleared: see interruptOnDone
	var deadline time.Time
	lastHeard := time.Now()
	heard := false // the last round received a message
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.serverStopping(); err != nil {
			return err
		}
		// One clock reading a round: at a hundred thousand messages a second, each reading counts.
		now := time.Now()
		if heard {
			lastHeard = now // the message, and the time spent waiting for the consumer, are not server silence
		}
		if s.statusDue(now) {
			// The server sends keepalives only when it has not heard from the relay for half its
			// wal_sender_timeout (never when that is 0) or has sent what the relay has not
			// confirmed, so an idle server says nothing while status updates arrive. Once it has
			// been silent a while, ask for a reply: a healthy one answers at once, so silence
			// up to ReceiveTimeout then means the connection is dead.
			probe := time.Since(lastHeard) >= s.cfg.ReceiveTimeout/3
			if err := s.sendStatus(ctx, probe); err != nil {
				return err
			}
		}
		if next, move := s.readDeadline(now, deadline); move {
			deadline = next
			netConn.SetReadDeadline(deadline)
		}
		raw, err := s.conn.ReceiveMessage(context.Background())
		heard = err == nil
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				if silent := time.Since(lastHeard); silent > s.receiveTimeout {
					return fmt.Errorf("no message from PostgreSQL for %s; presuming the connection dead", silent.Round(time.Second))
				}
				continue
			}
			return fmt.Errorf("receive from PostgreSQL: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(ctx, out, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return s.streamError(pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("PostgreSQL ended the replication stream")
		}
	}
}

// eagerStatusGap is the least time between status updates sent because the checkpoint moved (rather
// than because the interval passed): confirming soon after Kafka acknowledges keeps the window of
// events replayed after a crash small, at the cost of one small message per gap.
const eagerStatusGap = 100 * time.Millisecond

// readDeadline says when the receive loop should wake up if nothing arrives, and whether that
// moves the deadline it has: for the next status update, and while received events await
// confirmation sooner, so the position goes out soon after it becomes confirmable (Kafka has
// acknowledged it and the publication check has verified it: see horizon) once the stream goes
// quiet. The deadline moves when it has passed or when an earlier one is wanted (the first message
// after a quiet spell: with the deadline left at the next status update, its confirmation waited
// for that even once confirmable), never later on a busy stream, where moving it at every message
// would cost a system call each.
func (s *Stream) readDeadline(now, deadline time.Time) (time.Time, bool) {
	next := s.nextStatus
	if soon := now.Add(eagerStatusGap); s.received > s.reported && soon.Before(next) {
		next = soon
	}
	return next, !now.Before(deadline) || next.Before(deadline)
}

// statusDue reports whether a status update should go out now.
func (s *Stream) statusDue(now time.Time) bool {
	if !now.Before(s.nextStatus) {
		return true
	}
	return s.confirmable() > s.reported && now.Sub(s.lastStatus) >= eagerStatusGap
}

func (s *Stream) handleCopyData(ctx context.Context, out chan<- Message, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		s.serverEnd = max(s.serverEnd, pkm.ServerWALEnd)
		if s.stopSigns.keepalive(pkm.ReplyRequested, pkm.ServerWALEnd, time.Now(), s.interval) {
			return errWalsenderStopping
		}
		if pkm.ReplyRequested {
			if err := s.sendStatus(ctx, false); err != nil {
				return err
			}
		}
		return s.forward(ctx, out, Message{Kind: Keepalive, WALEnd: pkm.ServerWALEnd})
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		s.stopSigns.data()
		if xld.WALStart > s.received {
			s.received = xld.WALStart
			s.m.ReceivedLSN.Set(float64(xld.WALStart))
		}
		s.serverEnd = max(s.serverEnd, xld.ServerWALEnd, xld.WALStart)
		if xid, ok := beginXid(xld.WALData); ok && (!s.hasXid || xidAfter(xid, s.maxXid)) {
			s.maxXid, s.hasXid = xid, true
		}
		// forward copies the data: pgconn reuses its read buffer.
		return s.forward(ctx, out, Message{Kind: Data, WALStart: xld.WALStart, Data: xld.WALData})
	}
	return nil
}

// forward hands msg to the consumer, sending status updates while it waits: for room in the
// read-ahead budget (Data messages), then for room in the channel. A Data message's bytes belong to
// pgconn's read buffer; they are copied only once admitted, so a row waiting for the budget is not
// held twice.
func (s *Stream) forward(ctx context.Context, out chan<- Message, msg Message) error {
	if msg.Kind == Data {
		for !s.ahead.tryAcquire(int64(len(msg.Data))) {
			if err := s.await(ctx, s.ahead.wake); err != nil {
				return err
			}
		}
		msg.Data, msg.ahead = bytes.Clone(msg.Data), s.ahead
	}
	select {
	case out <- msg:
		return nil
	default:
	}
	for {
		timer := time.NewTimer(time.Until(s.nextStatus))
		select {
		case out <- msg:
			timer.Stop()
			return nil
		case <-timer.C:
			if err := s.sendStatus(ctx, false); err != nil {
				msg.Release()
				return err
			}
		case <-ctx.Done():
			timer.Stop()
			msg.Release()
			return ctx.Err()
		}
	}
}

// await waits for wake, sending status updates meanwhile.
func (s *Stream) await(ctx context.Context, wake <-chan struct{}) error {
	for {
		timer := time.NewTimer(time.Until(s.nextStatus))
		select {
		case <-wake:
			timer.Stop()
			return nil
		case <-timer.C:
			if err := s.sendStatus(ctx, false); err != nil {
				return err
			}
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
}

// sendStatus reports the checkpoint's position. Write, flush and apply are all set explicitly:
// pglogrepl replaces a zero flush position with the write position, which would confirm events
// that Kafka has not acknowledged.
func (s *Stream) sendStatus(ctx context.Context, reply bool) error {
	if err := s.guard.Err(); err != nil {
		return err
	}
	if err := s.serverStopping(); err != nil {
		return err
	}
	s.lastStatus = time.Now()
	s.nextStatus = s.lastStatus.Add(s.interval)
	flush := s.confirmable()
	if flush == 0 {
		return nil
	}
	// Remembered before it is sent: a server that read a status update the relay saw fail has
	// confirmed it all the same.
	s.mem.note(s.cfg.Slot, s.identity, true, max(s.serverEnd, s.received), flush, s.maxXid, s.hasXid)
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(s.received, flush),
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	if flush != s.reported {
		s.log.Debug("confirmed", zap.Stringer("lsn", flush))
	}
	s.reported = flush
	s.m.ConfirmedLSN.Set(float64(flush))
	s.m.StatusUpdates.Inc()
	return nil
}

// Finish ends the stream after Run: it keeps reporting the checkpoint until drained is closed,
// sends the final position, ends the copy stream (waiting, boundedly, until the server has read
// that position) and closes the connection. When ctx ends (a fence, or the shutdown timeout), it
// stops waiting at once: the final position is sent as far as the socket takes it without waiting,
// and the connection is closed.
func (s *Stream) Finish(ctx context.Context, drained <-chan struct{}) error {
	if s.stopGuard != nil {
		defer s.stopGuard()
	}
	if s.conn == nil {
		return nil
	}
	defer s.closeConn(ctx)
	if !s.copying {
		// Stopped before streaming (waiting for Kafka, backfilling): nothing was received, so there
		// is nothing to report and no copy stream to end.
		return nil
	}
	bg := context.WithoutCancel(ctx)
	netConn := s.conn.Conn()
	release := interruptOnDone(ctx, netConn) // a status update stuck on a full socket ends with ctx
	for waiting := true; waiting && ctx.Err() == nil; {
		timer := time.NewTimer(time.Until(s.nextStatus))
		select {
		case <-drained:
			waiting = false
		case <-ctx.Done():
			waiting = false
		case <-timer.C:
			if err := s.sendStatus(bg, false); err != nil && ctx.Err() == nil {
				timer.Stop()
				release()
				return err
			}
		}
		timer.Stop()
	}
	release()
	netConn.SetDeadline(time.Time{})
	if ctx.Err() != nil {
		// Best effort: what the socket takes at once; the server may not read it before the close.
		netConn.SetWriteDeadline(time.Now().Add(cutShortWrite))
		if err := s.sendStatus(bg, false); err != nil {
			return fmt.Errorf("final position not sent (%w): the next start replays from %s at the latest", err, s.reported)
		}
		s.log.Info("final position sent without waiting for the server to read it", zap.Stringer("lsn", s.reported),
			zap.NamedError("cause", context.Cause(ctx)))
		return nil
	}
	// The horizon trails the stream by a check or two; give it that long to cover what Kafka has
	// acknowledged, so a clean stop does not leave more to replay than needed.
	wait, cancel := context.WithTimeout(ctx, 4*s.guard.interval())
	s.guard.waitFor(wait, s.ck.Safe())
	cancel()
	if err := s.sendStatus(bg, false); err != nil {
		return err
	}
	if err := s.endCopy(ctx); err != nil {
		return fmt.Errorf("final position %s sent, but the server may not have read it: %w", s.reported, err)
	}
	s.log.Info("final position confirmed", zap.Stringer("lsn", s.reported))
	return nil
}

// cutShortWrite bounds the final status update of a stop cut short: enough for a socket with
// room, no wait for one without.
const cutShortWrite = 100 * time.Millisecond

// finishTimeout bounds the end of the copy stream at a stop (see endCopy). A walsender in the
// middle of sending a large transaction reads the relay's messages only between its writes, so it
// may not get to the final status update (and answer CopyDone) within it: the connection is then
// closed anyway and the next start replays from the position reported before, which means
// duplicates, never a loss.
const finishTimeout = 5 * time.Second

// endCopy ends the copy stream and waits until the server answers with its own CopyDone, which it
// sends only after reading everything sent before, the final status update included. Closing the
// connection without this loses that update whenever the walsender is still writing: it finds the
// socket closed on its next write and exits without reading what it was sent last, and the next
// start replays what was already published. The wait ends after finishTimeout or with ctx.
func (s *Stream) endCopy(ctx context.Context) error {
	netConn := s.conn.Conn()
	netConn.SetDeadline(time.Now().Add(finishTimeout))
	defer netConn.SetDeadline(time.Time{})
	defer interruptOnDone(ctx, netConn)()
	s.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := s.conn.Frontend().Flush(); err != nil {
		return fmt.Errorf("send CopyDone: %w", err)
	}
	for {
		// What the server sent meanwhile lies beyond the final position: it is streamed again.
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			return fmt.Errorf("wait for the server's CopyDone: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyDone:
			s.copying = false
			return nil
		case *pgproto3.ErrorResponse:
			return s.streamError(pgconn.ErrorResponseToPgError(m))
		}
	}
}

// interruptOnDone expires netConn's deadlines when ctx ends, until the returned function is called.
// That function waits for a callback already under way, so a deadline its caller sets afterwards
// (endCopy's, or clearing it) is not overwritten by a late "now".
func interruptOnDone(ctx context.Context, netConn interface{ SetDeadline(time.Time) error }) (release func()) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		netConn.SetDeadline(time.Now())
	})
	return func() {
		if !stop() {
			<-fired
		}
	}
}

// closeConn closes the replication connection, waiting at most 5s (and not once ctx has ended) for
// the goodbye to be written.
func (s *Stream) closeConn(ctx context.Context) {
	if s.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s.conn.Close(ctx)
	s.conn = nil
	s.copying = false
}

// Reported is the last position confirmed to the server.
func (s *Stream) Reported() pglogrepl.LSN { return s.reported }

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// parsePGDuration reads a time setting as current_setting returns it ("60s", "1min", "500ms", "0").
func parsePGDuration(v string) time.Duration {
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"ms", time.Millisecond}, {"min", time.Minute}, {"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			var x int64
			if _, err := fmt.Sscan(n, &x); err == nil {
				return time.Duration(x) * u.unit
			}
		}
	}
	var ms int64
	if _, err := fmt.Sscan(v, &ms); err == nil {
		return time.Duration(ms) * time.Millisecond
	}
	return 0
}

// receiveTimeout is how long a session lets the server stay silent before presuming the
// connection dead: the configured ReceiveTimeout, or longer where a healthy walsender may take
// longer to answer. A walsender decoding a large transaction that gives it nothing to send (rows of
// tables outside the publication) reads the relay's messages, the requests for a reply among them,
// only once it has not heard from the relay for half its wal_sender_timeout; it then sends a
// keepalive itself, and it gives the relay up after a whole wal_sender_timeout without reading
// anything. So it answers within about wal_sender_timeout, plus up to a status interval on either
// side before the relay's next message goes out and is read. With wal_sender_timeout 0 it reads
// the relay's messages at every progress update of such a decode, so ReceiveTimeout stands.
func receiveTimeout(configured, senderTimeout, interval time.Duration) time.Duration {
	return max(configured, senderTimeout+2*interval)
}
