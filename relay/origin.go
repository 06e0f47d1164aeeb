package relay

// Which part of the position committed in Kafka may be used to skip events on the server a session
// streams from. A position is (system identifier, timeline, commit LSN, events): an LSN names one
// transaction only in one database cluster's WAL history. A promoted standby that was behind starts
// a new timeline below where the old primary had gone, so the new timeline's first transactions
// reuse LSNs the old one's position passed; skipping by that position would drop them for good (and
// confirm the slot past them). The decision rests on what the position itself records and on the
// server's own timeline history, read at every session's start: no memory of an earlier session,
// term or process is needed, so a leader's next term, a relay restarted after ErrRestart and a new
// process all decide alike.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// usablePosition returns the part of pos that may skip events on server, whose timeline history
// is history (TimelineHistory; needed only where needsHistory says so). ok is false when nothing
// of it may; why says, for the log, what was given up ("" when pos is used whole).
//
//   - Another database cluster: nothing. Its LSNs name other transactions.
//   - The server's timeline: all of it.
//   - An earlier timeline of the server's history: the part below the LSN where that timeline
//     ended (the fork point). A commit below it is a record both timelines share, and the position
//     says Kafka has it; from the fork point on, the old timeline's transactions are not this
//     server's, and the new timeline's all commit at or after it, so a position beyond it covers
//     "every transaction committed before the fork point" and nothing more.
//   - A timeline the server's history does not hold (a later one, or a sibling branch): nothing.
//   - Unknown origin (a version 1 position, written before positions carried one): the relay that
//     wrote it streamed this cluster (the default transactional id names the cluster, and the
//     stream refuses another cluster than the one the slot ledger recorded), but on which timeline
//     is unknown. On a server that never forked (timeline 1) it is used whole; otherwise only the
//     part below the first fork point of the server's history, which every timeline of that
//     history shares. Positions written from then on carry their origin.
func usablePosition(pos sink.Position, server replication.Identity, history []replication.TimelineSwitch) (use sink.Position, ok bool, why string) {
	switch {
	case pos.SystemID != "" && server.SystemID != "" && pos.SystemID != server.SystemID:
		return sink.Position{}, false, fmt.Sprintf("the position was committed streaming another database cluster (system identifier %s), not this server's (%s); it skips nothing here",
			pos.SystemID, server.SystemID)
	case pos.Timeline == server.Timeline || (pos.Timeline == 0 && server.Timeline <= 1):
		return pos, true, ""
	case pos.Timeline == 0:
		if len(history) == 0 {
			return sink.Position{}, false, fmt.Sprintf("the position has no timeline (written by an older relay) and this server's timeline %d shows no history; it skips nothing here", server.Timeline)
		}
		return belowFork(pos, history[0].End, fmt.Sprintf("the position has no timeline (written by an older relay), and this server's history forked first at %s (end of timeline %d)", history[0].End, history[0].Timeline))
	case pos.Timeline > server.Timeline:
		return sink.Position{}, false, fmt.Sprintf("the position was committed on timeline %d, later than this server's %d (a server promoted over this one); it skips nothing here", pos.Timeline, server.Timeline)
	}
	for _, sw := range history {
		if sw.Timeline == pos.Timeline {
			return belowFork(pos, sw.End, fmt.Sprintf("the position was committed on timeline %d, which this server's history left at %s (timeline %d now)", pos.Timeline, sw.End, server.Timeline))
		}
	}
	return sink.Position{}, false, fmt.Sprintf("the position was committed on timeline %d, which is not in this server's history (timeline %d); it skips nothing here", pos.Timeline, server.Timeline)
}

// belowFork is the part of pos below fork: pos itself when it lies below, else every transaction
// committed before fork.
func belowFork(pos sink.Position, fork pglogrepl.LSN, where string) (sink.Position, bool, string) {
	if pos.CommitLSN < fork {
		return pos, true, ""
	}
	return sink.Position{CommitLSN: fork, SystemID: pos.SystemID, Timeline: pos.Timeline}, true,
		where + fmt.Sprintf("; its commit LSN %s lies at or beyond that fork, so it skips only the transactions committed before %s, and the new timeline's are published", pos.CommitLSN, fork)
}

// supersededServer refuses a server of pos's own cluster on an earlier timeline than pos was
// reached on: pg_dsn leads to a primary that a promotion superseded (or to a data directory
// restored from before it). Skipping nothing there is not enough: its slot would publish again
// what Kafka holds, and its WAL beyond the fork holds transactions the surviving history does not
// have, which would reach Kafka as events nobody committed on the current primary.
func supersededServer(pos sink.Position, server replication.Identity) error {
	if pos.SystemID == "" || pos.SystemID != server.SystemID || pos.Timeline <= server.Timeline || server.Timeline == 0 {
		return nil
	}
	return replication.Fatal(fmt.Errorf("exactly-once: the position committed in Kafka was reached on timeline %d of database cluster %s, "+
		"but the server pg_dsn leads to is on its timeline %d: it is a primary a promotion superseded (or a data directory restored from before one), "+
		"and streaming it would publish transactions the current primary does not have; point pg_dsn at the current primary "+
		"(list every server with target_session_attrs=read-write)", pos.Timeline, pos.SystemID, server.Timeline))
}

// needsHistory says whether usablePosition needs the server's timeline history for pos.
func needsHistory(pos sink.Position, server replication.Identity) bool {
	if pos.SystemID != "" && server.SystemID != "" && pos.SystemID != server.SystemID {
		return false
	}
	return server.Timeline > 1 && pos.Timeline < server.Timeline
}

// positionOnServer is the part of pos that may skip events in session (usablePosition), reading
// the server's timeline history when it is needed; what was given up is logged.
func (w *walSource) positionOnServer(ctx context.Context, pos sink.Position, session replication.Message) (sink.Position, bool, error) {
	server := replication.Identity{SystemID: session.SystemID, Timeline: session.Timeline}
	if err := supersededServer(pos, server); err != nil {
		return sink.Position{}, false, err
	}
	var history []replication.TimelineSwitch
	if needsHistory(pos, server) {
		var err error
		if history, err = w.readHistory(ctx, server); err != nil {
			return sink.Position{}, false, err
		}
	}
	use, ok, why := usablePosition(pos, server, history)
	if why != "" {
		w.log.Warn("exactly-once: "+why,
			zap.String("transactional_id", w.cfg.Sink.Transactions.ID), zap.Stringer("commit_lsn", pos.CommitLSN),
			zap.Int("events_of_that_transaction", pos.Events), zap.String("position_system_identifier", pos.SystemID),
			zap.Uint32("position_timeline", pos.Timeline), zap.String("system_identifier", server.SystemID),
			zap.Uint32("timeline", server.Timeline), zap.Stringer("skips_before", use.CommitLSN))
	}
	return use, ok, nil
}

// readHistory reads the timeline history of the session's server, retrying what may heal until
// ctx ends: nothing is published until it is known. The answer must come from the session's
// database cluster (a multi-host pg_dsn may lead elsewhere meanwhile).
func (w *walSource) readHistory(ctx context.Context, server replication.Identity) ([]replication.TimelineSwitch, error) {
	for attempt := 0; ; attempt++ {
		id, history, err := w.history(ctx, server.Timeline)
		if err == nil && server.SystemID != "" && id.SystemID != server.SystemID {
			err = fmt.Errorf("pg_dsn led to database cluster %s for the timeline history, not to %s that the session streams from", id.SystemID, server.SystemID)
		}
		if err == nil {
			return history, nil
		}
		if replication.IsFatal(err) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		delay := backoffPosition(attempt)
		w.log.Warn("exactly-once: cannot read the server's timeline history (TIMELINE_HISTORY) to tell which part of the position committed in Kafka belongs to its timeline; retrying (nothing is published until it is known)",
			zap.Uint32("timeline", server.Timeline), zap.Error(err), zap.Duration("retry_in", delay))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
