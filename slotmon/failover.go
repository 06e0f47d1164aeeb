package slotmon

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/metrics"
)

// failoverMajor is the first PostgreSQL major version with failover slots.
const failoverMajor = 17

// Failover is what the server streamed from knows about the slot surviving a promotion of one of
// its standbys. Whether a standby really holds a usable copy only that standby knows
// (ReadStandby).
type Failover struct {
	// Supported is false before PostgreSQL 17, which has no failover slots: the rest is then zero.
	Supported bool `json:"supported"`
	// Failover: the slot is a failover slot, copied to standbys with sync_replication_slots = on.
	Failover bool `json:"failover"`
	// Synced: the slot was synchronised from a primary, so this server is a promoted standby (or
	// still a standby).
	Synced bool `json:"synced"`
	// StandbySlots are the physical slots in synchronized_standby_slots: PostgreSQL sends a
	// failover slot's changes only once the standbys streaming them have received the WAL. Empty:
	// the relay may publish transactions no standby has yet.
	StandbySlots []StandbySlot `json:"synchronized_standby_slots"`
}

// StandbySlot is one entry of synchronized_standby_slots as the primary sees it.
type StandbySlot struct {
	Name string `json:"name"`
	// Exists: a physical slot of that name exists. When it does not, or is not streamed (Active),
	// PostgreSQL holds the failover slot's changes back.
	Exists bool `json:"exists"`
	Active bool `json:"active"`
	// RestartLSN is how far its standby has flushed the WAL.
	RestartLSN string `json:"restart_lsn,omitempty"`
}

// Protected reports whether every slot of synchronized_standby_slots is a physical slot being
// streamed, and there is at least one.
func (f Failover) Protected() bool {
	for _, s := range f.StandbySlots {
		if !s.Exists || !s.Active {
			return false
		}
	}
	return len(f.StandbySlots) > 0
}

type queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func serverMajor(ctx context.Context, q queryer) (int, error) {
	var num int
	if err := q.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		return 0, fmt.Errorf("read the server version: %w", err)
	}
	return num / 10000, nil
}

// ReadFailover reads the slot's failover flags and the server's synchronized_standby_slots. A
// missing slot reads as not a failover slot.
func ReadFailover(ctx context.Context, q queryer, slot string) (Failover, error) {
	major, err := serverMajor(ctx, q)
	if err != nil || major < failoverMajor {
		return Failover{}, err
	}
	f := Failover{Supported: true, StandbySlots: []StandbySlot{}}
	if err := q.QueryRow(ctx, `SELECT coalesce(bool_or(failover), false), coalesce(bool_or(synced), false)
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&f.Failover, &f.Synced); err != nil {
		return Failover{}, fmt.Errorf("read the failover flags of slot %q: %w", slot, err)
	}
	rows, err := q.Query(ctx, `SELECT n, s.slot_type IS NOT DISTINCT FROM 'physical', coalesce(s.active, false), s.restart_lsn::text
		FROM unnest(string_to_array(replace(current_setting('synchronized_standby_slots'), ' ', ''), ',')) WITH ORDINALITY AS l(n, i)
		LEFT JOIN pg_replication_slots s ON s.slot_name = l.n
		ORDER BY l.i`)
	if err != nil {
		return Failover{}, fmt.Errorf("read synchronized_standby_slots: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s StandbySlot
		var restart *string
		if err := rows.Scan(&s.Name, &s.Exists, &s.Active, &restart); err != nil {
			return Failover{}, fmt.Errorf("read synchronized_standby_slots: %w", err)
		}
		if restart != nil {
			s.RestartLSN = *restart
		}
		f.StandbySlots = append(f.StandbySlots, s)
	}
	if err := rows.Err(); err != nil {
		return Failover{}, fmt.Errorf("read synchronized_standby_slots: %w", err)
	}
	return f, nil
}

// Standby is what a standby says about its copy of the slot (PostgreSQL 17+).
type Standby struct {
	Address   string `json:"address"` // host:port the connection reached
	Recovery  bool   `json:"in_recovery"`
	Supported bool   `json:"supported"` // PostgreSQL 17+
	// The settings slot synchronisation needs: sync_replication_slots = on, hot_standby_feedback =
	// on, primary_slot_name set (and a dbname in primary_conninfo, which only superusers may read).
	SyncReplicationSlots bool   `json:"sync_replication_slots"`
	HotStandbyFeedback   bool   `json:"hot_standby_feedback"`
	PrimarySlotName      string `json:"primary_slot_name"`
	// The standby's copy of the slot: Synced and not Temporary (sync-ready) and not invalidated is
	// a copy a promotion keeps; a temporary copy is dropped at promotion.
	SlotExists         bool   `json:"slot_exists"`
	Synced             bool   `json:"synced"`
	Temporary          bool   `json:"temporary"`
	InvalidationReason string `json:"invalidation_reason,omitempty"`
	ConfirmedFlushLSN  string `json:"confirmed_flush_lsn,omitempty"`
	RestartLSN         string `json:"restart_lsn,omitempty"`
	// Persisted: the copy is synced and no longer temporary. PostgreSQL keeps a synced copy
	// temporary until the primary's slot has passed the standby's catalog xmin and restart LSN,
	// which takes the relay's confirmations and a running-transactions record on the primary
	// (minutes after a slot's creation under load), and drops a temporary copy at promotion.
	Persisted bool `json:"persisted"`
	// TrailBytes is the primary's confirmed_flush_lsn minus the copy's, RestartTrailBytes the
	// same of restart_lsn (Trail fills them; nil without a copy or a slot on the primary): a
	// promotion restarts the relay from the copy's position, so what it trails is published again,
	// and a copy whose trail only grows is no longer synchronised.
	TrailBytes        *int64 `json:"trail_bytes,omitempty"`
	RestartTrailBytes *int64 `json:"restart_trail_bytes,omitempty"`

	confirmed, restart pglogrepl.LSN
}

// Trail sets TrailBytes and RestartTrailBytes from the primary's slot (slotmon.Read on the
// primary), when both it and the copy exist.
func (s *Standby) Trail(primary State) {
	s.TrailBytes, s.RestartTrailBytes = nil, nil
	if !s.SlotExists || !primary.Exists {
		return
	}
	if s.confirmed != 0 && primary.ConfirmedFlush != 0 {
		d := int64(primary.ConfirmedFlush) - int64(s.confirmed)
		s.TrailBytes = &d
	}
	if s.restart != 0 && primary.RestartLSN != 0 {
		d := int64(primary.RestartLSN) - int64(s.restart)
		s.RestartTrailBytes = &d
	}
}

// Ready reports whether a promotion of this standby now would keep a usable slot: a copy that is
// synchronised, persistent and valid, and kept so (a standby that stopped synchronising keeps a
// copy that falls behind, or is invalidated without hot_standby_feedback).
func (s Standby) Ready() bool { return s.Problem("") == "" }

// Problem says why a promotion of this standby would lose the slot (or lose it later), with the
// fix; "" when it would not.
func (s Standby) Problem(slot string) string {
	switch {
	case !s.Supported:
		return fmt.Sprintf("standby %s runs a PostgreSQL without failover slots (before 17): a promotion loses slot %q", s.Address, slot)
	case !s.Recovery:
		return fmt.Sprintf("%s is not a standby (it is not in recovery): give --standby-dsn a standby's address", s.Address)
	case !s.SyncReplicationSlots || !s.HotStandbyFeedback || s.PrimarySlotName == "":
		return fmt.Sprintf("standby %s does not synchronise failover slots: it needs sync_replication_slots = on (now %v), hot_standby_feedback = on (now %v), primary_slot_name set (now %q) and a dbname in primary_conninfo",
			s.Address, onOff(s.SyncReplicationSlots), onOff(s.HotStandbyFeedback), s.PrimarySlotName)
	case !s.SlotExists:
		return fmt.Sprintf("standby %s has no copy of slot %q: a promotion of it now loses the slot (make it a failover slot: failover: true, and check the standby's log for slot synchronisation errors)", s.Address, slot)
	case s.InvalidationReason != "":
		return fmt.Sprintf("standby %s's copy of slot %q is invalidated (%s): a promotion of it now loses the slot", s.Address, slot, s.InvalidationReason)
	case !s.Synced || s.Temporary:
		return fmt.Sprintf("standby %s's copy of slot %q is not persisted yet (synced %v, temporary %v): a promotion now drops it and loses the slot. PostgreSQL persists it once the primary's slot has passed the standby's catalog xmin and restart LSN (the standby logs \"could not synchronize replication slot\" until then): keep the relay streaming and confirming; on an idle primary SELECT pg_log_standby_snapshot() there speeds it up", s.Address, slot, s.Synced, s.Temporary)
	}
	return ""
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// ReadStandby reads a standby's settings for slot synchronisation and its copy of slot.
func ReadStandby(ctx context.Context, q queryer, address, slot string) (Standby, error) {
	st := Standby{Address: address}
	major, err := serverMajor(ctx, q)
	if err != nil {
		return Standby{}, err
	}
	if err := q.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&st.Recovery); err != nil {
		return Standby{}, fmt.Errorf("standby %s: %w", address, err)
	}
	if major < failoverMajor {
		return st, nil
	}
	st.Supported = true
	var sync, feedback string
	var synced, temporary *bool
	var reason, confirmed, restart *string
	err = q.QueryRow(ctx, `SELECT current_setting('sync_replication_slots'), current_setting('hot_standby_feedback'),
			current_setting('primary_slot_name'), s.synced, s.temporary, s.invalidation_reason, s.confirmed_flush_lsn::text,
			s.restart_lsn::text
		FROM (SELECT 1) one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, slot).
		Scan(&sync, &feedback, &st.PrimarySlotName, &synced, &temporary, &reason, &confirmed, &restart)
	if err != nil {
		return Standby{}, fmt.Errorf("standby %s: read its copy of slot %q: %w", address, slot, err)
	}
	st.SyncReplicationSlots, st.HotStandbyFeedback = sync == "on", feedback == "on"
	if synced != nil {
		st.SlotExists, st.Synced = true, *synced
		st.Temporary = temporary != nil && *temporary
	}
	if reason != nil {
		st.InvalidationReason = *reason
	}
	st.Persisted = st.SlotExists && st.Synced && !st.Temporary
	for _, v := range []struct {
		text *string
		src  *string
		lsn  *pglogrepl.LSN
	}{{&st.ConfirmedFlushLSN, confirmed, &st.confirmed}, {&st.RestartLSN, restart, &st.restart}} {
		if v.src == nil {
			continue
		}
		*v.text = *v.src
		if *v.lsn, err = pglogrepl.ParseLSN(*v.src); err != nil {
			return Standby{}, fmt.Errorf("standby %s: copy of slot %q at %q: %w", address, slot, *v.src, err)
		}
	}
	return st, nil
}

// PublishStandby sets the standby_slot metrics from what the standby said of its copy (s, with
// Trail applied) or, with err, from failing to ask it: a copy nobody can see is not counted as
// ready, and its other series are removed rather than left at their last values.
func PublishStandby(m *metrics.Metrics, s Standby, err error) {
	if err != nil {
		m.StandbyUp.WithLabelValues().Set(0)
		m.StandbySlotReady.WithLabelValues().Set(0)
		m.StandbySlotPersisted.Reset()
		m.StandbySlotTrailBytes.Reset()
		m.StandbySlotRestartTrailBytes.Reset()
		return
	}
	m.StandbyUp.WithLabelValues().Set(1)
	m.StandbySlotReady.WithLabelValues().Set(boolGauge(s.Ready()))
	m.StandbySlotPersisted.WithLabelValues().Set(boolGauge(s.Persisted))
	for _, v := range []struct {
		g *prometheus.GaugeVec
		n *int64
	}{{m.StandbySlotTrailBytes, s.TrailBytes}, {m.StandbySlotRestartTrailBytes, s.RestartTrailBytes}} {
		if v.n == nil {
			v.g.Reset()
		} else {
			v.g.WithLabelValues().Set(float64(*v.n))
		}
	}
}

// PublishFailover sets the failover metrics from f.
func PublishFailover(m *metrics.Metrics, f Failover) {
	m.SlotFailover.Set(boolGauge(f.Failover))
	active := 0
	for _, s := range f.StandbySlots {
		if s.Exists && s.Active {
			active++
		}
	}
	m.StandbySlots.Set(float64(len(f.StandbySlots)))
	m.StandbySlotsActive.Set(float64(active))
}

// Describe says in one line what f means for a failover, for `outbox-relay status`.
func (f Failover) Describe() string {
	switch {
	case !f.Supported:
		return "no: PostgreSQL before 17 has no failover slots, so a promoted standby does not have the slot"
	case !f.Failover:
		return "no: the slot is not a failover slot, so a promoted standby does not have it (failover: true makes it one)"
	}
	var names []string
	for _, s := range f.StandbySlots {
		state := "streamed"
		switch {
		case !s.Exists:
			state = "missing"
		case !s.Active:
			state = "not streamed"
		}
		names = append(names, fmt.Sprintf("%s (%s)", s.Name, state))
	}
	if len(names) == 0 {
		return "yes; synchronized_standby_slots is empty"
	}
	return "yes; synchronized_standby_slots: " + strings.Join(names, ", ")
}
