package replication

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Memory is what one process knows of the slots it streamed, kept across its leadership terms
// (each builds a new Stream) and across relays started afresh: that it streamed a slot, from which
// server, and how far that server's WAL went as far as the relay saw and confirmed. Create one per
// process (NewMemory) and pass it to every Stream through Config.Memory.
//
// It speeds up nothing the ledger records and replaces none of it (DESIGN.md): it adds what only a
// running process can know. The ledger lives in the same database, so a restored data directory
// brings back the ledger of its time too; and the ledger is optional, so a new term without it
// would otherwise take a lost slot for a first start.
type Memory struct {
	token string // this process, as the ledger's streamed_by records it
	mu    sync.Mutex
	slots map[string]*slotMemory
}

// slotMemory is what the process knows of one slot. The positions belong to identity: another
// timeline (a failover) or cluster starts them over, since positions of two histories do not
// compare.
type slotMemory struct {
	// publication is what the last good publication check of the slot read, on cluster pubCluster
	// at pubAt (horizon.carry).
	publication membership
	pubCluster  string
	pubAt       time.Time

	streamed  bool // the process streamed the slot, or created it
	identity  Identity
	seen      pglogrepl.LSN // the furthest WAL position the server showed: IDENTIFY_SYSTEM, data, keepalives
	confirmed pglogrepl.LSN // the furthest position sent to the server as confirmed
	xid       uint32        // the newest transaction id of a Begin received (modulo 2^32)
	hasXid    bool
}

// NewMemory returns the memory of a process that has streamed nothing yet.
func NewMemory() *Memory {
	var b [6]byte
	_, _ = rand.Read(b[:])
	host, _ := os.Hostname()
	return &Memory{token: host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:]), slots: map[string]*slotMemory{}}
}

// recall returns what the process knows of slot (zero when nothing).
func (m *Memory) recall(slot string) slotMemory {
	if m == nil {
		return slotMemory{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if sm := m.slots[slot]; sm != nil {
		return *sm
	}
	return slotMemory{}
}

// note updates what the process knows of slot on the server history id, and that it streamed the
// slot when streamed: seen and confirmed only rise, and start over when id is another server
// history than the one remembered.
func (m *Memory) note(slot string, id Identity, streamed bool, seen, confirmed pglogrepl.LSN, xid uint32, hasXid bool) {
	if m == nil || id == (Identity{}) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sm := m.slots[slot]
	if sm == nil || sm.identity != id {
		sm = &slotMemory{streamed: sm != nil && sm.streamed}
		m.slots[slot] = sm
		sm.identity = id
	}
	sm.streamed = sm.streamed || streamed
	sm.seen = max(sm.seen, seen, confirmed)
	sm.confirmed = max(sm.confirmed, confirmed)
	if hasXid && (!sm.hasXid || xidAfter(xid, sm.xid)) {
		sm.xid, sm.hasXid = xid, true
	}
}

// notePublication keeps what a good publication check of slot read on cluster, at at.
func (m *Memory) notePublication(slot, cluster string, mb membership, at time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sm := m.slots[slot]
	if sm == nil {
		sm = &slotMemory{}
		m.slots[slot] = sm
	}
	sm.publication, sm.pubCluster, sm.pubAt = mb, cluster, at
}

// carryPublication hands the publication check what the process's previous term last read of it,
// when nobody else can have streamed the slot since (the ledger names this process as its last
// holder): within one term the checks compare each read with the one before, and this makes the
// first check of a new term compare with the last of the previous one. Another instance's term in
// between would have checked (and stopped on) a change itself, and its own changes are no
// business of this process's memory.
func (s *Stream) carryPublication(c slotCheck) error {
	if s.mem == nil || s.streamed.Load() || !c.holderOK || c.holder != s.mem.token {
		return nil
	}
	known := s.mem.recall(s.cfg.Slot)
	if known.publication.pubOID == nil || known.pubCluster != s.identity.SystemID {
		return nil
	}
	return s.guard.carry(known.publication, known.pubAt)
}

// xidAfter reports whether transaction id a was assigned after b (PostgreSQL's modulo-2^32 order).
func xidAfter(a, b uint32) bool { return int32(a-b) > 0 }

// beginXid returns the transaction id of a pgoutput Begin message: 'B', final LSN (8 bytes),
// commit time (8), xid (4).
func beginXid(data []byte) (uint32, bool) {
	if len(data) < 21 || data[0] != 'B' {
		return 0, false
	}
	return binary.BigEndian.Uint32(data[17:21]), true
}

// remember hands what this session learned to the process's memory.
func (s *Stream) remember() {
	if s.mem == nil || s.identity == (Identity{}) {
		return
	}
	// A session that ended before it streamed saw the server's history, but owns the slot only if
	// it created it (createSlot notes that): one cut short while creating it owns none, and taken
	// for streamed, the slot it never created would be taken for lost by the next session.
	s.mem.note(s.cfg.Slot, s.identity, s.streamed.Load(), max(s.serverEnd, s.received), s.reported, s.maxXid, s.hasXid)
}

// restoredError says that the server's history went back behind what the relay saw on the same
// timeline, and what to do.
func (s *Stream) restoredError(what string) error {
	return fatalf("PostgreSQL's WAL history went backwards on timeline %d of database cluster %s: %s. The server was restored from an earlier copy of its data directory (a backup, a volume snapshot), or a server with another history took its place on the same timeline number; new commits there reuse positions the relay has already passed, and slot %q may skip them. The relay stops rather than confirm positions of one history to another. Stop every instance, drop the slot and run `outbox-relay forget-slot` (or DELETE FROM %s WHERE slot = %s), then start one instance once with backfill: true and backfill_since covering everything committed since the restored copy was taken: it publishes those events from the outbox table (docs/operations.md, \"Recovering a lost or missing slot\")",
		s.identity.Timeline, s.identity.SystemID, what, s.cfg.Slot, s.ledger.Table(), quoteLiteral(s.cfg.Slot))
}

// checkHistory compares the server's end of WAL (IDENTIFY_SYSTEM's xlogpos) and its next
// transaction id with what this process saw of the same server history: a server whose WAL ends
// before a position the relay received or confirmed, or that has not yet assigned a transaction
// id the relay received a commit of, was restored from an earlier copy. A crash cannot do either:
// what a walsender sends is flushed, and recovery replays it and every transaction id in it.
func (s *Stream) checkHistory(ctx context.Context, walEnd pglogrepl.LSN) error {
	s.serverEnd = walEnd
	if s.mem == nil {
		return nil
	}
	known := s.mem.recall(s.cfg.Slot)
	if known.identity != s.identity {
		return nil // first session, or another timeline: nothing of this history to compare with
	}
	if walEnd < known.seen {
		return s.restoredError(fmt.Sprintf("the server's WAL ends at %s, but the relay has received and confirmed WAL up to %s from it (slot %q confirmed at %s)",
			walEnd, known.seen, s.cfg.Slot, known.confirmed))
	}
	if !known.hasXid {
		return nil
	}
	next, err := s.nextXid(ctx)
	if err != nil {
		// Another server version's functions, or a role without them: the WAL end stands alone.
		s.log.Debug("cannot read the server's next transaction id", zap.Error(err))
		return nil
	}
	if !xidAfter(next, known.xid) {
		return s.restoredError(fmt.Sprintf("the server's next transaction id is %d, but the relay has received the commit of transaction %d from it", next, known.xid))
	}
	return nil
}

// nextXid reads the next transaction id the server will assign (modulo 2^32) on the replication
// connection, which runs simple-protocol SQL.
func (s *Stream) nextXid(ctx context.Context) (uint32, error) {
	results, err := s.conn.Exec(ctx, "SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text").ReadAll()
	if err != nil {
		return 0, err
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || results[0].Rows[0][0] == nil {
		return 0, fmt.Errorf("no next transaction id")
	}
	full, err := strconv.ParseUint(string(results[0].Rows[0][0]), 10, 64)
	if err != nil {
		return 0, err
	}
	return uint32(full), nil
}

// slotCheck is what checkSlotPosition needs to tell a slot someone moved from one the relay (or
// another leader) confirmed.
type slotCheck struct {
	confirmed pglogrepl.LSN // the slot's confirmed_flush_lsn on the stream's server
	walEnd    pglogrepl.LSN // that server's flushed end of WAL, read after it
	holder    string        // the ledger's streamed_by when the session began ("" if unknown)
	holderOK  bool          // the ledger could say
}

// checkSlotPosition refuses a slot whose confirmed position the relay cannot account for:
//
//   - beyond the server's end of WAL: confirmed by a relay that streamed another history (a
//     restore, see checkHistory), and every transaction below it is skipped;
//   - beyond what this process confirmed of the same server history, while nobody else can have
//     confirmed it: advanced by someone (pg_replication_slot_advance, a client of
//     pg_logical_slot_get_changes) or dropped and created anew. The outbox rows committed in
//     between were never streamed.
//
// Nobody else can have confirmed it within one Stream (one leadership term: the leader lock
// excludes other relays, and the slot other readers), or when the ledger says this process was
// the last to stream it. Across terms without that word from the ledger, another leader may
// have streamed it meanwhile: a warning then.
func (s *Stream) checkSlotPosition(c slotCheck) error {
	if c.confirmed > c.walEnd && c.walEnd != 0 {
		return s.restoredError(fmt.Sprintf("slot %q is confirmed at %s, beyond the server's end of WAL %s", s.cfg.Slot, c.confirmed, c.walEnd))
	}
	if s.mem == nil {
		return nil
	}
	known := s.mem.recall(s.cfg.Slot)
	if known.identity != s.identity || known.confirmed == 0 || c.confirmed <= known.confirmed {
		return nil
	}
	switch {
	case s.streamed.Load() || c.holderOK && c.holder == s.mem.token:
		return fmt.Errorf("%w: slot %q is confirmed at %s, but the relay confirmed it only up to %s and nothing else streamed it since: it was advanced by someone (pg_replication_slot_advance, pg_logical_slot_get_changes) or dropped and created anew, so the outbox events committed between the two positions were never streamed. The relay confirms nothing more. %s",
			ErrSlotLost, s.cfg.Slot, c.confirmed, known.confirmed, s.recovery())
	case c.holderOK:
		s.log.Info("another relay streamed the slot since this process did; going on from its confirmed position",
			zap.String("slot", s.cfg.Slot), zap.Stringer("confirmed_here", known.confirmed), zap.Stringer("slot_confirmed", c.confirmed),
			zap.String("streamed_by", c.holder))
	default:
		s.log.Warn("the slot is confirmed beyond what this process confirmed, and the slot ledger cannot say whether another relay streamed it since (run outbox-relay migrate; the relay's role needs SELECT, INSERT and UPDATE on it): if nothing did, it was advanced or recreated by someone and events in between were skipped",
			zap.String("slot", s.cfg.Slot), zap.Stringer("confirmed_here", known.confirmed), zap.Stringer("slot_confirmed", c.confirmed),
			zap.String("table", s.ledger.Table()))
	}
	return nil
}

// recordHolder notes in the ledger that this process streams the slot now, so that its next term
// can tell its own confirmed position from another leader's. It runs after START_REPLICATION (the
// slot is this session's alone) and before anything is confirmed. A ledger without the table or
// the column, or that the role may not write, is optional like the rest of the ledger (no relay
// of that role records anything, so a later term only warns). Any other failure ends the session,
// to be retried: a stale record naming this process while another relay confirmed further would
// make this process's next term stop for nothing. conn is the checks' connection, if still open.
func (s *Stream) recordHolder(ctx context.Context, conn *pgx.Conn) error {
	if s.mem == nil || s.holderRecorded {
		return nil
	}
	var exists bool
	err := s.onLedgerConn(ctx, conn, func(conn *pgx.Conn) error {
		var err error
		if exists, err = s.ledger.Exists(ctx, conn); err == nil && exists {
			err = s.ledger.RecordHolder(ctx, conn, s.cfg.Slot, s.mem.token)
		}
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case err == nil && !exists:
	case errors.As(err, &pgErr) && (pgErr.Code == "42703" || pgErr.Code == "42501" || pgErr.Code == "42P01"):
		s.log.Debug("cannot record in the slot ledger that this process streams the slot", zap.String("table", s.ledger.Table()), zap.Error(err))
	case err != nil:
		return fmt.Errorf("record in %s that this process streams slot %q: %w", s.ledger.Table(), s.cfg.Slot, err)
	}
	s.holderRecorded = true
	return nil
}
