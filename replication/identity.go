package replication

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// identify asks the server who it is (IDENTIFY_SYSTEM) and compares the answer with the server
// streamed before: earlier in this process, or, on the process's first session, as the ledger
// recorded it (recorded is zero when it recorded nothing).
func (s *Stream) identify(ctx context.Context, recorded Identity) error {
	id, walEnd, err := identifySystem(ctx, s.conn)
	if err != nil {
		return err
	}
	prev, err := s.compareIdentity(id, recorded)
	if err != nil {
		return err
	}
	s.guard.expectCluster(id.SystemID)
	s.serverEnd = walEnd
	s.newTimeline = prev.Timeline != 0 && prev.Timeline != id.Timeline
	if s.newTimeline {
		s.maxXid, s.hasXid = 0, false
		// The consumer starts over when it sees the Session's new timeline; until it has, the
		// stream confirms only the slot's own position (confirmable).
		// Positions of the old timeline mean nothing here, also as a baseline for eager updates.
		s.received, s.reported = 0, 0
		s.guard.reset()
		s.log.Warn("PostgreSQL is on another timeline (a standby was promoted): positions learned on the old one are never confirmed to this server, and transactions are published again from the slot's confirmed position on it; events the old primary committed without shipping them to this server may have been published but are not in this database",
			zap.Uint32("old_timeline", prev.Timeline), zap.Uint32("timeline", id.Timeline), zap.String("system_identifier", id.SystemID))
	}
	return nil
}

// compareIdentity accepts id when it is the database cluster streamed before, on the same timeline
// or a later one, and remembers it; it returns the identity it compared with (zero on a first
// start). A later timeline of the same cluster is a failover and accepted; another cluster, or an
// earlier timeline (a superseded primary), is refused, since the slot there is not the one whose
// positions the relay knows.
func (s *Stream) compareIdentity(id Identity, recorded Identity) (prev Identity, err error) {
	prev = s.previousIdentity(recorded)
	if err := s.checkCluster(id.SystemID, recorded); err != nil {
		return prev, err
	}
	if id.Timeline < prev.Timeline {
		return prev, s.supersededError(id, prev, recorded)
	}
	s.identity = id
	return prev, nil
}

// previousIdentity is the server a new session is compared with: the one streamed earlier in this
// process, or else the one the ledger recorded (zero when neither is known).
func (s *Stream) previousIdentity(recorded Identity) Identity {
	if s.identity != (Identity{}) {
		return s.identity
	}
	return recorded
}

// checkCluster refuses a server of another database cluster than the one streamed before. It runs
// first on the checks' ordinary connection (prepare), before anything compares table OIDs or slot
// positions, whose meaning depends on the cluster, and again on the replication connection
// (compareIdentity).
func (s *Stream) checkCluster(systemID string, recorded Identity) error {
	switch prev := s.previousIdentity(recorded); {
	case prev.SystemID == "" || systemID == prev.SystemID:
		return nil
	case s.identity != (Identity{}):
		return fatalf("pg_dsn now leads to another database cluster (system identifier %s) than the one the relay was streaming from (system identifier %s): slot %q there is not the slot whose positions the relay knows, so it stops rather than confirm positions of one cluster to another. Point pg_dsn back at the cluster with system identifier %s; to stream from this cluster instead, restart the relay deliberately (it then starts at that slot's own confirmed position)",
			systemID, prev.SystemID, s.cfg.Slot, prev.SystemID)
	default:
		return fatalf("slot %q is recorded in %s as streamed from the database cluster with system identifier %s, but this server is another one (system identifier %s): this database was copied from that cluster (restored from a dump, or upgraded with pg_upgrade), so the slot here is not the one the relay streamed, and events committed there after its last confirmed position may not have been published. Check for them (backfill), then, if this slot is the one to stream from now, clear the record: UPDATE %s SET system_identifier = NULL WHERE slot = %s",
			s.cfg.Slot, s.ledger.Table(), prev.SystemID, systemID, s.ledger.Table(), quoteLiteral(s.cfg.Slot))
	}
}

// supersededError refuses a server on an earlier timeline than the one streamed before: a primary
// that a standby was promoted over, running again (or reached again through pg_dsn). What it wrote
// after the promotion is not in the current primary's history, and its slot's positions are not
// the ones the relay confirmed.
func (s *Stream) supersededError(id, prev, recorded Identity) error {
	where := "streamed before from"
	if s.identity == (Identity{}) && recorded != (Identity{}) {
		where = "is recorded in " + s.ledger.Table() + " as having streamed from"
	}
	return fatalf("pg_dsn leads to a superseded primary: this server of database cluster %s is on timeline %d, but the relay %s timeline %d of it, so a standby was promoted over this server since; what it committed after that promotion is not in the current primary's history, and its slot %q is not the one whose positions the relay knows. Point pg_dsn at the current primary (timeline %d or later) and retire this server or rebuild it as a standby (pg_rewind). If this server is deliberately the one to stream from now, clear the record (UPDATE %s SET system_identifier = NULL WHERE slot = %s) and restart the relay",
		id.SystemID, id.Timeline, where, prev.Timeline, s.cfg.Slot, prev.Timeline, s.ledger.Table(), quoteLiteral(s.cfg.Slot))
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

// recordIdentity notes the server in the ledger, so that a restart still recognises another
// cluster or a failover. Like the rest of the ledger it is optional: failing is worth a warning.
func (s *Stream) recordIdentity(ctx context.Context, conn *pgx.Conn) {
	if ctx.Err() != nil {
		return // stopping: the next session records it (and a warning now would blame the ledger)
	}
	exists := true
	err := s.onLedgerConn(ctx, conn, func(conn *pgx.Conn) error {
		var err error
		if exists, err = s.ledger.Exists(ctx, conn); err == nil && exists {
			err = s.ledger.RecordIdentity(ctx, conn, s.cfg.Slot, s.identity)
		}
		return err
	})
	if err == nil && !exists {
		return // recordSlot warned when it created the slot
	}
	if err != nil {
		// Every session tries again (a passing outage heals), but says so once per server: a
		// ledger the role may not write would otherwise warn on every reconnect.
		if s.unrecorded != s.identity {
			s.unrecorded = s.identity
			s.log.Warn("cannot record the server's identity in the slot ledger (run outbox-relay migrate; the relay's role needs INSERT and UPDATE on it); a restart cannot tell whether the slot is on another cluster or a superseded primary",
				zap.String("table", s.ledger.Table()), zap.Error(err))
		} else {
			s.log.Debug("still cannot record the server's identity in the slot ledger", zap.String("table", s.ledger.Table()), zap.Error(err))
		}
		return
	}
	s.ledgerIdentity = s.identity
}

// onLedgerConn runs fn, a write to the slot ledger, on conn (the checks' connection, kept open for
// the start's writes: a connection saved is a handshake saved), or on a connection of its own when
// conn is nil or failed under fn: a long BeforeStream (a backfill) may have outlived it.
//
// Decoding on a standby, the checks' connection is the standby's, which refuses writes: the
// ledger is written on the primary (primary_dsn), where the standby replays it from.
func (s *Stream) onLedgerConn(ctx context.Context, conn *pgx.Conn, fn func(*pgx.Conn) error) error {
	if conn != nil && !conn.IsClosed() && s.cfg.PrimaryDSN == "" {
		if err := fn(conn); err == nil || ctx.Err() != nil || !conn.IsClosed() {
			return err // the connection is alive: a fresh one would get the same answer
		}
	}
	conn, err := s.cfg.ConnectPrimary(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}
