package replication

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// failoverMajor is the first PostgreSQL major version with failover slots: a logical slot with
// FAILOVER set is copied to standbys that run with sync_replication_slots = on, so it survives a
// promotion.
const failoverMajor = 17

// checkFailoverSupported refuses failover: true on a server without failover slots: the slot
// would not survive a promotion, which is what the setting asks for.
func checkFailoverSupported(major int) error {
	if major >= failoverMajor || major == 0 {
		return nil
	}
	return fatalf("config key failover is true, but PostgreSQL %d has no failover slots (they came with PostgreSQL 17): a logical slot there does not survive a promotion. Set failover: false (and see docs/operations.md, \"Failover\", for what a promotion means on PostgreSQL %d), or upgrade to PostgreSQL 17 or later", major, major)
}

// slotFailoverState is what the replication connection's server says of the slot's failover
// properties (PostgreSQL 17+).
type slotFailoverState struct {
	failover bool // the slot is a failover slot
	synced   bool // the slot was synchronised from a primary (this server is, or was, its standby)
}

// readSlotFailover reads the slot's failover and synced flags on the replication connection (a
// replication=database connection runs simple-protocol SQL). The server must be 17 or later.
func (s *Stream) readSlotFailover(ctx context.Context) (slotFailoverState, error) {
	results, err := s.conn.Exec(ctx, "SELECT failover, synced FROM pg_catalog.pg_replication_slots WHERE slot_name = "+quoteLiteral(s.cfg.Slot)).ReadAll()
	if err != nil {
		return slotFailoverState{}, fmt.Errorf("read the failover flag of slot %q: %w", s.cfg.Slot, err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 {
		return slotFailoverState{}, fmt.Errorf("slot %q is not on the server the replication connection reached; retrying", s.cfg.Slot)
	}
	row := results[0].Rows[0]
	return slotFailoverState{failover: string(row[0]) == "t", synced: string(row[1]) == "t"}, nil
}

// resumesSynced reports whether a session starts from a slot this server synchronised as a standby
// before its promotion: the slot says it was synchronised, and the server is on a later timeline
// than the one the session before streamed on (newTimeline) or than the one the ledger recorded at
// the last stream start. The ledger's side covers a first session on the new timeline that ended
// (a fence, a lost connection) between IDENTIFY_SYSTEM and here: the process then remembers the
// new timeline, but nothing streamed from it yet.
func resumesSynced(st slotFailoverState, newTimeline bool, ledger, current Identity) bool {
	if !st.synced {
		return false
	}
	return newTimeline || ledger.SystemID == current.SystemID && ledger.Timeline != 0 && ledger.Timeline < current.Timeline
}

// ensureFailover makes an existing slot a failover slot when the configuration asks for one, and
// says when the relay resumes from a slot synchronised to a promoted standby.
func (s *Stream) ensureFailover(ctx context.Context, newTimeline bool) error {
	if serverMajor(s.conn.ParameterStatus("server_version")) < failoverMajor {
		return nil
	}
	st, err := s.readSlotFailover(ctx)
	if err != nil {
		return err
	}
	if resumesSynced(st, newTimeline, s.ledgerIdentity, s.identity) {
		s.log.Info("resuming from the failover slot this server kept as a standby: its position is the last one synchronised from the old primary, so events published after it are published again",
			zap.String("slot", s.cfg.Slot))
	}
	if !s.cfg.Failover || st.failover {
		return nil
	}
	// ALTER_REPLICATION_SLOT (17+) acquires the slot, so it runs before START_REPLICATION; the
	// checks saw the slot inactive.
	cmd := fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)", pgx.Identifier{s.cfg.Slot}.Sanitize())
	if _, err := s.conn.Exec(ctx, cmd).ReadAll(); err != nil {
		return fmt.Errorf("make slot %q a failover slot (%s): %w", s.cfg.Slot, cmd, err)
	}
	s.log.Info("made the existing slot a failover slot (failover: true): standbys with sync_replication_slots = on now keep a copy of it",
		zap.String("slot", s.cfg.Slot))
	return nil
}

// createSlotCommand is CREATE_REPLICATION_SLOT for the slot, with FAILOVER when configured. The
// option list syntax is PostgreSQL 15+; without failover the older keyword syntax serves 14 too.
func (s *Stream) createSlotCommand() string {
	name := pgx.Identifier{s.cfg.Slot}.Sanitize()
	if !s.cfg.Failover {
		action := "NOEXPORT_SNAPSHOT"
		if s.cfg.ExportSnapshot || s.lost != nil {
			action = "EXPORT_SNAPSHOT"
		}
		return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput %s", name, action)
	}
	snapshot := "nothing"
	if s.cfg.ExportSnapshot || s.lost != nil {
		snapshot = "export"
	}
	return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT '%s', FAILOVER true)", name, snapshot)
}

// warnStandbySlots says, once per distinct finding, what the primary's synchronized_standby_slots
// means for a failover slot. Without it the relay may publish transactions that no standby has
// received: after a failover to such a standby they are in Kafka but not in the database. With it,
// a listed slot that is missing or not streamed holds the relay's stream back.
func (s *Stream) warnStandbySlots(ctx context.Context) {
	if !s.cfg.Failover || serverMajor(s.conn.ParameterStatus("server_version")) < failoverMajor {
		return
	}
	// SHOW is a replication command, and the rest is plain SQL: both run on this connection.
	results, err := s.conn.Exec(ctx, `SELECT coalesce(string_agg(n, ','), ''),
			coalesce(string_agg(n, ',') FILTER (WHERE s.slot_name IS NULL OR s.slot_type <> 'physical'), ''),
			coalesce(string_agg(n, ',') FILTER (WHERE s.slot_type = 'physical' AND NOT s.active), '')
		FROM unnest(string_to_array(replace(current_setting('synchronized_standby_slots'), ' ', ''), ',')) n
		LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = n`).ReadAll()
	if err != nil || len(results) != 1 || len(results[0].Rows) != 1 {
		s.log.Debug("cannot read synchronized_standby_slots", zap.Error(err))
		return
	}
	row := results[0].Rows[0]
	names, missing, inactive := string(row[0]), string(row[1]), string(row[2])
	finding := names + "|" + missing + "|" + inactive
	if finding == s.standbySlotsFinding {
		return
	}
	s.standbySlotsFinding = finding
	switch {
	case names == "":
		s.log.Warn("failover is on but this primary's synchronized_standby_slots is empty: the relay may publish transactions no standby has received yet, and after a failover to a standby that never got them, those events are in Kafka but not in the database. Set synchronized_standby_slots on the primary to the physical slots of the standbys that may be promoted (docs/operations.md, \"Failover\")",
			zap.String("slot", s.cfg.Slot))
	case missing != "":
		s.log.Warn("synchronized_standby_slots names slots that are not physical replication slots on this server: PostgreSQL holds the relay's stream back until they exist and their standbys have received the WAL (it logs a warning of its own)",
			zap.String("slot", s.cfg.Slot), zap.String("synchronized_standby_slots", names), zap.String("not_physical_slots", missing))
	case inactive != "":
		s.log.Warn("standby slots of synchronized_standby_slots are not streamed now: PostgreSQL sends the relay nothing beyond what those standbys have received, so the stream waits until they reconnect (or leave synchronized_standby_slots)",
			zap.String("slot", s.cfg.Slot), zap.String("synchronized_standby_slots", names), zap.String("inactive", inactive))
	default:
		s.log.Info("failover slot protected by synchronized_standby_slots: the relay receives a transaction only once those standbys have it",
			zap.String("slot", s.cfg.Slot), zap.String("synchronized_standby_slots", names))
	}
}

// refuseStandby returns a retryable error when conn's server is in recovery (a standby): the relay
// streams only from a primary. A standby reached through pg_dsn is most often one being promoted
// (a single host whose address the failover moved early): waiting for the promotion is the
// remedy. Left to the slot code, PostgreSQL 17+ refuses decoding from its synchronised copy of the
// slot with an error that reads as a lost slot, and 16+ would create a new slot on it.
//
// With primary_dsn set (cfg.PrimaryDSN) a standby is what pg_dsn means to lead to: decoding on a
// standby (PostgreSQL 16+), and nothing is refused.
func refuseStandby(ctx context.Context, conn *pgconn.PgConn, what string, decodeOnStandby bool) error {
	if decodeOnStandby {
		return nil
	}
	results, err := conn.Exec(ctx, "SELECT pg_catalog.pg_is_in_recovery()").ReadAll()
	if err != nil {
		return fmt.Errorf("ask the server of the %s whether it is a standby: %w", what, err)
	}
	if len(results) == 1 && len(results[0].Rows) == 1 && string(results[0].Rows[0][0]) == "t" {
		return fmt.Errorf("pg_dsn leads the %s to a standby (the server at %s is in recovery): the relay streams only from the primary and waits until this server is promoted or pg_dsn leads to the primary (a pg_dsn listing several hosts needs target_session_attrs=read-write)",
			what, conn.Conn().RemoteAddr())
	}
	return nil
}
