package replication

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// identify asks the server who it is (IDENTIFY_SYSTEM) and compares the answer with the server
// streamed before: earlier in this process, or, on the process's first session, as the ledger
// recorded it (recorded is zero when it recorded nothing).
func (s *Stream) identify(ctx context.Context, recorded Identity) error {
	res, err := pglogrepl.IdentifySystem(ctx, s.conn)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	id := Identity{SystemID: res.SystemID, Timeline: uint32(res.Timeline)}
	prev, err := s.compareIdentity(id, recorded)
	if err != nil {
		return err
	}
	if prev.Timeline != 0 && prev.Timeline != id.Timeline {
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

// compareIdentity accepts id when it is the database cluster streamed before and remembers it; it
// returns the identity it compared with (zero on a first start). A new timeline of the same cluster
// is a failover and accepted; another cluster is refused, since the slot there is not the one whose
// positions the relay knows.
func (s *Stream) compareIdentity(id Identity, recorded Identity) (prev Identity, err error) {
	switch {
	case s.identity != (Identity{}):
		prev = s.identity
		if id.SystemID != prev.SystemID {
			return prev, fatalf("pg_dsn now leads to another database cluster (%s) than the one the relay was streaming from (system identifier %s): slot %q there is not the slot whose positions the relay knows, so it stops rather than confirm positions of one cluster to another. Point pg_dsn back at the cluster with system identifier %s; to stream from this cluster instead, restart the relay deliberately (it then starts at that slot's own confirmed position)",
				id, prev.SystemID, s.cfg.Slot, prev.SystemID)
		}
	case recorded != (Identity{}):
		prev = recorded
		if id.SystemID != prev.SystemID {
			return prev, fatalf("slot %q is recorded in %s as streamed from the database cluster with system identifier %s, but this server is another one (%s): this database was copied from that cluster (restored from a dump, or upgraded with pg_upgrade), so the slot here is not the one the relay streamed, and events committed there after its last confirmed position may not have been published. Check for them (backfill), then, if this slot is the one to stream from now, clear the record: UPDATE %s SET system_identifier = NULL WHERE slot = '%s'",
				s.cfg.Slot, LedgerTable, prev.SystemID, id, LedgerTable, s.cfg.Slot)
		}
	}
	s.identity = id
	return prev, nil
}

// recordIdentity notes the server in the ledger, so that a restart still recognises another
// cluster or a failover. Like the rest of the ledger it is optional: failing is worth a warning.
func (s *Stream) recordIdentity(ctx context.Context) {
	conn, err := pgx.Connect(ctx, s.cfg.DSN)
	if err == nil {
		defer conn.Close(context.WithoutCancel(ctx))
		var exists bool
		if exists, err = s.ledger.Exists(ctx, conn); err == nil && !exists {
			return // recordSlot warned when it created the slot
		}
		if err == nil {
			err = s.ledger.RecordIdentity(ctx, conn, s.cfg.Slot, s.identity)
		}
	}
	if err != nil {
		s.log.Warn("cannot record the server's identity in the slot ledger (run outbox-relay migrate; the relay's role needs INSERT and UPDATE on it); a restart cannot tell whether the slot is on another cluster",
			zap.String("table", LedgerTable), zap.Error(err))
		return
	}
	s.ledgerIdentity = s.identity
}

// confirmable is the position a status update may confirm: the checkpoint's, once it belongs to
// the server's timeline and capped at what the publication checks covered (horizon.go), and never
// less than the slot's own confirmed position.
func (s *Stream) confirmable() pglogrepl.LSN {
	// Timeline first: the tracker's Reset stores the position before the timeline.
	if s.ck.Timeline() != s.identity.Timeline {
		return s.floor
	}
	return max(min(s.ck.Safe(), s.guard.Verified()), s.floor)
}
