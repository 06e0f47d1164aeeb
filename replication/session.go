package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// session runs one replication connection from its checks to its end, in the order the slot's life
// needs: the checks (prepare, on an ordinary connection), the server identified on the
// replication connection, the walsender published (Config.OnWalsender), the slot created or its
// position checked, the steps that must come before START_REPLICATION (Config.BeforeStream, a
// lost slot's recovery), and then the wire loop (receive).
func (s *Stream) session(ctx context.Context, out chan<- Message) error {
	// A recovery this session owns but does not complete is left under way, for the next owner.
	defer s.releaseRecovery(ctx)
	conf, err := s.cfg.ConnConfig()
	if err != nil {
		return Fatal(err)
	}
	// The replication connection is dialled while the checks run: a connection's handshake (a
	// backend forked, SCRAM) is the larger part of a start. Nothing is asked on it before they pass.
	dialled := dialReplication(ctx, conf)
	checked, err := s.prepare(ctx)
	if err != nil {
		dialled.discard()
		return err
	}
	// The checks' connection then serves the ledger's writes of this start, and closes once the
	// session streams.
	defer checked.closeConn(ctx)
	s.conn, err = dialled.wait(ctx)
	if err != nil {
		return classifyConnect(err, "replication")
	}
	if err := s.identifyServer(ctx, &checked); err != nil {
		return err
	}
	if err := s.publishWalsender(ctx); err != nil {
		return err
	}
	slot, snapshot, err := s.useSlot(ctx, &checked)
	if err != nil {
		return err
	}
	if s.identity != s.ledgerIdentity {
		s.recordIdentity(ctx, checked.conn)
	}
	if err := s.beforeStream(ctx, &checked, snapshot); err != nil {
		return err
	}
	if s.lost != nil {
		if err := s.recover(ctx, out, slot, snapshot); err != nil {
			return err
		}
	}
	if err := s.startReplication(ctx, slot, &checked); err != nil {
		return err
	}
	s.log.Info("streaming", zap.String("slot", s.cfg.Slot), zap.String("publication", s.cfg.Publication),
		zap.Stringer("from", s.floor), zap.Duration("status_interval", s.interval),
		zap.Duration("receive_timeout", s.receiveTimeout))
	s.nextStatus = time.Now().Add(s.interval)
	if err := s.forward(ctx, out, Message{Kind: Session, WALEnd: s.floor, Timeline: s.identity.Timeline, SystemID: s.identity.SystemID, ServerEnd: s.serverEnd}); err != nil {
		return err
	}
	return s.receive(ctx, out)
}

// identifyServer identifies the server the replication connection reached (IDENTIFY_SYSTEM),
// compares it with the one streamed before and with the one the checks ran on, and refuses a
// standby and a failover slot the server cannot keep.
func (s *Stream) identifyServer(ctx context.Context, c *checked) error {
	if err := s.identify(ctx, c.recorded); err != nil {
		return err
	}
	if err := s.checkHistory(ctx, s.serverEnd); err != nil {
		return err
	}
	if c.systemID != "" && c.systemID != s.identity.SystemID {
		// Both agree with the cluster streamed before, if any (each was compared with it): a
		// multi-host pg_dsn, or a name that moved, reached two clusters on a first start. The checks
		// (and the outbox table's OID they noted) belong to another cluster than the stream would.
		return fatalf("pg_dsn reached two database clusters at once: the checks' connection one with system identifier %s, the replication connection one with %s (a multi-host pg_dsn listing servers of different clusters, or a host name that moved between the two connections). Make pg_dsn lead to the one cluster to stream from, and restart",
			c.systemID, s.identity.SystemID)
	}
	if err := refuseStandby(ctx, s.conn, "replication connection", s.cfg.PrimaryDSN != ""); err != nil {
		return err
	}
	if s.cfg.Failover {
		if err := checkFailoverSupported(serverMajor(s.conn.ParameterStatus("server_version"))); err != nil {
			return err
		}
	}
	return nil
}

// publishWalsender calls Config.OnWalsender (its one caller) with the replication connection's
// backend PID, before the session creates, recovers or streams the slot.
func (s *Stream) publishWalsender(ctx context.Context) error {
	if s.cfg.OnWalsender == nil {
		return nil
	}
	pid, err := s.backendPID(ctx)
	if err != nil {
		return err
	}
	if err := s.cfg.OnWalsender(ctx, pid); err != nil {
		return fmt.Errorf("before using slot %q from walsender PID %d: %w", s.cfg.Slot, pid, err)
	}
	return nil
}

// useSlot creates the slot the checks found missing, with the snapshot it exports, or checks the
// existing one's position on the server streamed from (history.go) and its failover setting.
func (s *Stream) useSlot(ctx context.Context, c *checked) (slot SlotInfo, snapshot string, err error) {
	if !c.slot.Exists {
		return s.createSlot(ctx)
	}
	slot = c.slot
	var walEnd pglogrepl.LSN
	if slot.ConfirmedFlush, walEnd, err = s.confirmedOnStreamServer(ctx); err != nil {
		return SlotInfo{}, "", err
	}
	check := slotCheck{confirmed: slot.ConfirmedFlush, walEnd: walEnd, holder: c.holder, holderOK: c.holderOK}
	if err := s.checkSlotPosition(check); err != nil {
		return SlotInfo{}, "", err
	}
	if err := s.carryPublication(check); err != nil {
		return SlotInfo{}, "", err
	}
	if err := s.ensureFailover(ctx, s.newTimeline); err != nil {
		return SlotInfo{}, "", err
	}
	return slot, "", nil
}

// beforeStream calls Config.BeforeStream (its one caller) in the first session that gets this far.
// The exported snapshot stays valid until the next command on the replication connection, so the
// hook runs before START_REPLICATION. A replacement slot's snapshot is the recovery's: a first
// start's backfill does not read it.
func (s *Stream) beforeStream(ctx context.Context, c *checked, snapshot string) error {
	if s.cfg.BeforeStream == nil || s.streamed.Load() {
		return nil
	}
	if s.lost != nil {
		snapshot = ""
	}
	waited := time.Now()
	if err := s.cfg.BeforeStream(ctx, snapshot); err != nil {
		return err
	}
	if time.Since(waited) > checksConnIdle {
		// A long wait (Kafka down, a backfill): a connection idle that long may have been cut
		// silently on the way (a NAT's idle timeout), and a write on it would hang.
		c.closeConn(ctx)
	}
	return nil
}

// startReplication starts streaming slot from its confirmed position (START_REPLICATION), and
// records that this process streams it, in its memory and in the ledger.
func (s *Stream) startReplication(ctx context.Context, slot SlotInfo, c *checked) error {
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
	err := pglogrepl.StartReplication(ctx, s.conn, pgx.Identifier{s.cfg.Slot}.Sanitize(), 0,
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
	if err := s.recordHolder(ctx, c.conn); err != nil {
		return err
	}
	c.closeConn(ctx)
	return nil
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
	// Where the role may not read it, the comparison on the replication connection
	// (IDENTIFY_SYSTEM) still refuses another cluster, only later.
	if c.systemID, err = systemIdentifier(ctx, conn.PgConn()); err != nil {
		s.log.Debug("cannot read the system identifier on the checks' connection", zap.Error(err))
		c.systemID = ""
	}
	if c.systemID != "" {
		if err := s.checkCluster(c.systemID, c.recorded); err != nil {
			return checked{}, err
		}
	}
	if err := refuseStandby(ctx, conn.PgConn(), "checks' connection", s.cfg.PrimaryDSN != ""); err != nil {
		return checked{}, err
	}
	if err := s.checkPrimary(ctx, c.systemID); err != nil {
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
	// On a hot standby (decoding there, primary_dsn) pg_current_wal_flush_lsn() fails; the replay
	// position is the end of WAL its walsender decodes up to.
	results, err := s.conn.Exec(ctx, "SELECT confirmed_flush_lsn, CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_flush_lsn() END FROM pg_catalog.pg_replication_slots WHERE slot_name = "+quoteLiteral(s.cfg.Slot)).ReadAll()
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
