package replication

// Stream's answers to the wire loop (wireOwner): what a status update may confirm, and what ends
// the session instead. serverStopping and streamError, the other two, live in shutdown.go and
// errors.go.

import (
	"github.com/jackc/pglogrepl"
)

// beforeStatus is asked before each status update (wireOwner): a failed publication check ends
// the session, as does the server shutting down.
func (s *Stream) beforeStatus() error {
	if err := s.guard.Err(); err != nil {
		return err
	}
	return s.serverStopping()
}

// confirming notes flush in the process's memory of the slot before the wire loop sends it
// (wireOwner).
func (s *Stream) confirming(flush pglogrepl.LSN) {
	s.mem.note(s.cfg.Slot, s.identity, true, max(s.serverEnd, s.received), flush, s.maxXid, s.hasXid)
}

// confirmable is the position a status update may confirm: the checkpoint's, once it belongs to
// the server's timeline and capped at what the publication checks covered (horizon.go), and never
// less than the slot's own confirmed position.
func (s *Stream) confirmable() pglogrepl.LSN {
	// Timeline first: the tracker's Reset stores the position before the timeline.
	if s.ck.Timeline() != s.identity.Timeline {
		return s.floor
	}
	safe := min(s.ck.Safe(), s.guard.Verified())
	if s.serverEnd != 0 {
		// Never beyond the server's end of WAL: PostgreSQL takes such a position as it is, and
		// after a restore in place every commit below it would be skipped (history.go).
		safe = min(safe, s.serverEnd)
	}
	return max(safe, s.floor)
}
