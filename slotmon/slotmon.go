// Package slotmon watches the replication slot from an ordinary connection: how far its confirmed
// position trails the server's WAL (lag), how much WAL it keeps on disk (retained), whether that
// WAL is still guaranteed (wal_status, safe_wal_size) and whether anything streams it. The numbers
// come from the server, not from the relay, so they stay true while the relay is stuck, a standby,
// or streaming from another host.
package slotmon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/credentials"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// WALStatuses are the values of pg_replication_slots.wal_status (PostgreSQL 13+).
var WALStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// InvalidationReasons are the values of pg_replication_slots.invalidation_reason (PostgreSQL
// 17+; idle_timeout from 18). Another value is published as "other" so the metric's series stay
// a fixed set; status shows the server's word.
var InvalidationReasons = []string{"wal_removed", "rows_removed", "wal_level_insufficient", "idle_timeout"}

// Column is a value the server reports only from some major version on: Known says whether the
// server has it (the column or setting exists), Value is nil when it is NULL. In JSON (with
// omitzero) an unknown column is left out, a known NULL is null: never a made-up default.
type Column[T any] struct {
	Known bool
	Value *T
}

// IsZero reports an unknown column, for omitzero.
func (c Column[T]) IsZero() bool { return !c.Known }

// MarshalJSON writes the value or null.
func (c Column[T]) MarshalJSON() ([]byte, error) { return json.Marshal(c.Value) }

// UnmarshalJSON reads a present key (the value or null) as a known column.
func (c *Column[T]) UnmarshalJSON(b []byte) error {
	c.Known = true
	return json.Unmarshal(b, &c.Value)
}

// State is the slot as the server sees it.
type State struct {
	Slot     string `json:"slot"`
	Database string `json:"database"` // the connected database
	Exists   bool   `json:"exists"`
	Plugin   string `json:"plugin,omitempty"`
	Active   bool   `json:"active"`
	// ActivePID is the walsender streaming the slot; ActiveApplicationName and ActiveClientAddr
	// come from pg_stat_activity (the client address only with pg_read_all_stats or as its role).
	ActivePID             int32  `json:"active_pid,omitempty"`
	ActiveApplicationName string `json:"active_application_name,omitempty"`
	ActiveClientAddr      string `json:"active_client_addr,omitempty"`
	WALStatus             string `json:"wal_status,omitempty"`
	// SafeWALSize is how much more WAL may be written before the slot risks losing WAL it needs;
	// nil when max_slot_wal_keep_size is unlimited (-1).
	SafeWALSize    *int64        `json:"safe_wal_size_bytes"`
	ConfirmedFlush pglogrepl.LSN `json:"-"`
	RestartLSN     pglogrepl.LSN `json:"-"`
	CurrentLSN     pglogrepl.LSN `json:"-"`
	// LagBytes is CurrentLSN - ConfirmedFlush: WAL not yet confirmed by the relay.
	LagBytes int64 `json:"lag_bytes"`
	// AheadOfWALBytes is ConfirmedFlush - CurrentLSN when the slot is confirmed beyond the
	// server's end of WAL (LagBytes is then 0): a sound history never has it; a data directory
	// restored from an earlier copy, streamed by a relay that had gone further, does, and every
	// transaction committed below the slot's position is skipped.
	AheadOfWALBytes int64 `json:"confirmed_ahead_of_wal_bytes,omitempty"`
	// RetainedBytes is CurrentLSN - RestartLSN: WAL the server keeps on disk for the slot.
	RetainedBytes int64 `json:"retained_wal_bytes"`

	// Columns of pg_replication_slots that only newer servers have. Conflicting (16+): a logical
	// slot on a standby lost rows or wal_level it needs (NULL for physical slots).
	// InactiveSince (17+): when the slot stopped being streamed; NULL while active.
	// InvalidationReason (17+): why the slot cannot be used any more (wal_removed,
	// rows_removed, wal_level_insufficient, idle_timeout from 18); NULL while usable.
	Conflicting        Column[bool]      `json:"conflicting,omitzero"`
	InactiveSince      Column[time.Time] `json:"inactive_since,omitzero"`
	InvalidationReason Column[string]    `json:"invalidation_reason,omitzero"`
	// IdleTimeout is the server's idle_replication_slot_timeout (18+) in seconds: a slot inactive
	// for longer is invalidated at the next checkpoint; 0 disables it.
	IdleTimeout Column[int64] `json:"idle_replication_slot_timeout_seconds,omitzero"`
}

// versioned are the columns of State that only some servers have, read from the slot's row as
// JSON (to_jsonb), so one query works on every version and a missing key is a missing column.
type versioned struct {
	Conflicting        Column[bool]      `json:"conflicting"`
	InactiveSince      Column[time.Time] `json:"inactive_since"`
	InvalidationReason Column[string]    `json:"invalidation_reason"`
}

// Invalidated returns why the server will not stream the slot any more, or "": the
// invalidation_reason where the server reports one (17+), else a wal_status of lost (WAL
// removed) or conflicting (16, a logical slot on a standby).
func (st State) Invalidated() string {
	switch {
	case !st.Exists:
		return ""
	case st.InvalidationReason.Value != nil:
		return *st.InvalidationReason.Value
	case st.InvalidationReason.Known:
		return "" // the server says it is usable
	case st.WALStatus == "lost":
		return "wal_removed"
	case st.Conflicting.Value != nil && *st.Conflicting.Value:
		return "conflicting"
	}
	return ""
}

// Read returns the slot's state. A missing slot is not an error: Exists is false.
func Read(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, slot string) (State, error) {
	st := State{Slot: slot}
	var plugin, walStatus, app, addr, confirmed, restart *string
	var pid *int32
	var active *bool
	var safe, lag, retained, idleTimeout *int64
	var current, row *string
	// On a hot standby (PostgreSQL 16+ can decode there) pg_current_wal_lsn() fails; the replay
	// position is the standby's end of WAL.
	err := q.QueryRow(ctx, `WITH cur AS (
			SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn)
		SELECT current_database(), cur.lsn::text, s.plugin, s.active, s.active_pid, s.wal_status, s.safe_wal_size,
			s.confirmed_flush_lsn::text, s.restart_lsn::text,
			pg_wal_lsn_diff(cur.lsn, s.confirmed_flush_lsn)::bigint, pg_wal_lsn_diff(cur.lsn, s.restart_lsn)::bigint,
			a.application_name,
			CASE WHEN a.pid IS NULL THEN NULL
				WHEN a.client_addr IS NULL AND a.backend_start IS NOT NULL THEN 'local' ELSE host(a.client_addr) END,
			to_jsonb(s)::text,
			(SELECT setting::bigint * CASE unit WHEN 'min' THEN 60 WHEN 'ms' THEN 0.001 ELSE 1 END
				FROM pg_settings WHERE name = 'idle_replication_slot_timeout')::bigint
		FROM cur
		LEFT JOIN pg_replication_slots s ON s.slot_name = $1
		LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid`, slot).
		Scan(&st.Database, &current, &plugin, &active, &pid, &walStatus, &safe, &confirmed, &restart, &lag, &retained, &app, &addr, &row, &idleTimeout)
	if err != nil {
		return State{}, fmt.Errorf("read replication slot %q from pg_replication_slots: %w", slot, err)
	}
	if current != nil {
		if st.CurrentLSN, err = pglogrepl.ParseLSN(*current); err != nil {
			return State{}, fmt.Errorf("current WAL position %q: %w", *current, err)
		}
	}
	st.IdleTimeout = Column[int64]{Known: idleTimeout != nil, Value: idleTimeout}
	if plugin == nil {
		return st, nil
	}
	st.Exists, st.Plugin = true, *plugin
	if row != nil {
		var v versioned
		if err := json.Unmarshal([]byte(*row), &v); err != nil {
			return State{}, fmt.Errorf("slot %q: read pg_replication_slots row %s: %w", slot, *row, err)
		}
		st.Conflicting, st.InactiveSince, st.InvalidationReason = v.Conflicting, v.InactiveSince, v.InvalidationReason
	}
	st.Active = active != nil && *active
	st.SafeWALSize = safe
	for _, v := range []struct {
		dst *string
		src *string
	}{{&st.WALStatus, walStatus}, {&st.ActiveApplicationName, app}, {&st.ActiveClientAddr, addr}} {
		if v.src != nil {
			*v.dst = *v.src
		}
	}
	if pid != nil {
		st.ActivePID = *pid
	}
	if lag != nil {
		st.LagBytes = max(*lag, 0)
		st.AheadOfWALBytes = max(-*lag, 0)
	}
	if retained != nil {
		st.RetainedBytes = max(*retained, 0)
	}
	for _, v := range []struct {
		dst *pglogrepl.LSN
		src *string
	}{{&st.ConfirmedFlush, confirmed}, {&st.RestartLSN, restart}} {
		if v.src == nil {
			continue
		}
		if *v.dst, err = pglogrepl.ParseLSN(*v.src); err != nil {
			return State{}, fmt.Errorf("slot %q position %q: %w", slot, *v.src, err)
		}
	}
	return st, nil
}

// Config configures a Monitor.
type Config struct {
	DSN          string
	PasswordFile string // pg_password_file: read for every connection
	Slot         string
	Interval     time.Duration // default 10s
	// StandbyDSN (failover_standby_dsn), when set, is a standby whose copy of the slot is read
	// at every poll for the standby_slot metrics, with PasswordFile. Its failures do not count
	// against PostgreSQL's (OnPoll, postgres_up): they are standby_up.
	StandbyDSN string
	// OnPoll, when set, is told the outcome of every poll (nil: PostgreSQL answered).
	OnPoll func(error)
}

// Monitor polls the slot and sets the slot metrics.
type Monitor struct {
	cfg Config
	log *zap.Logger
	m   *metrics.Metrics
}

// New returns a Monitor. Nothing is contacted until Run.
func New(cfg Config, log *zap.Logger, m *metrics.Metrics) *Monitor {
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.OnPoll == nil {
		cfg.OnPoll = func(error) {}
	}
	return &Monitor{cfg: cfg, log: log, m: m}
}

// pollTimeout bounds one poll: a server that does not answer a catalog query within it counts as
// unreachable for readiness.
const pollTimeout = 5 * time.Second

// Run polls until ctx ends, reconnecting when the connection fails.
func (mon *Monitor) Run(ctx context.Context) {
	var conn, standby *pgx.Conn
	defer func() {
		for _, c := range []*pgx.Conn{conn, standby} {
			if c != nil {
				c.Close(context.WithoutCancel(ctx))
			}
		}
	}()
	failing, standbyFailing := false, false
	ticker := time.NewTicker(mon.cfg.Interval)
	defer ticker.Stop()
	for {
		st, err := mon.poll(ctx, &conn)
		if ctx.Err() != nil {
			return
		}
		if mon.cfg.StandbyDSN != "" && err == nil {
			serr := mon.pollStandby(ctx, &standby, st)
			if ctx.Err() != nil {
				return
			}
			switch {
			case serr != nil && !standbyFailing:
				mon.log.Warn("cannot read the failover standby's copy of the slot (failover_standby_dsn); standby_slot_ready is 0 until it answers",
					zap.String("slot", mon.cfg.Slot), zap.Error(serr))
				standbyFailing = true
			case serr == nil && standbyFailing:
				mon.log.Info("reading the failover standby's copy of the slot again", zap.String("slot", mon.cfg.Slot))
				standbyFailing = false
			}
		}
		mon.cfg.OnPoll(err)
		switch {
		case err != nil && !failing:
			mon.log.Warn("cannot read the replication slot's state; slot metrics are stale until PostgreSQL answers",
				zap.String("slot", mon.cfg.Slot), zap.Error(err))
			failing = true
		case err == nil && failing:
			mon.log.Info("reading the replication slot's state again", zap.String("slot", mon.cfg.Slot))
			failing = false
		}
		select {
		case <-ticker.C:
		case <-ctx.Done():
			return
		}
	}
}

// connect opens a monitoring connection to dsn with the relay's password file.
func (mon *Monitor) connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := credentials.PostgresConfig(dsn, mon.cfg.PasswordFile)
	if err != nil {
		return nil, err
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "outbox-relay"
	}
	return pgx.ConnectConfig(ctx, cfg)
}

func (mon *Monitor) poll(ctx context.Context, conn **pgx.Conn) (State, error) {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	if *conn == nil {
		c, err := mon.connect(ctx, mon.cfg.DSN)
		if err != nil {
			mon.m.PostgresUp.Set(0)
			return State{}, fmt.Errorf("connect to PostgreSQL for the slot monitor: %w", err)
		}
		*conn = c
	}
	st, err := Read(ctx, *conn, mon.cfg.Slot)
	if err != nil {
		mon.m.PostgresUp.Set(0)
		(*conn).Close(context.WithoutCancel(ctx))
		*conn = nil
		if errors.Is(err, context.DeadlineExceeded) {
			return State{}, fmt.Errorf("no answer within %s: %w", pollTimeout, err)
		}
		return State{}, err
	}
	fo, err := ReadFailover(ctx, *conn, mon.cfg.Slot)
	if err != nil {
		mon.m.PostgresUp.Set(0)
		(*conn).Close(context.WithoutCancel(ctx))
		*conn = nil
		return State{}, err
	}
	mon.m.PostgresUp.Set(1)
	Publish(mon.m, st)
	PublishFailover(mon.m, fo)
	return st, nil
}

// pollStandby reads the failover standby's copy of the slot and how far it trails primary (the
// slot as the primary has it, read just before), and sets the standby_slot metrics.
func (mon *Monitor) pollStandby(ctx context.Context, conn **pgx.Conn, primary State) (err error) {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	defer func() {
		if err != nil {
			PublishStandby(mon.m, Standby{}, err)
		}
	}()
	if *conn == nil {
		c, err := mon.connect(ctx, mon.cfg.StandbyDSN)
		if err != nil {
			return fmt.Errorf("connect to the standby of failover_standby_dsn: %w", err)
		}
		*conn = c
	}
	addr := (*conn).PgConn().Conn().RemoteAddr().String()
	sb, err := ReadStandby(ctx, *conn, addr, mon.cfg.Slot)
	if err != nil {
		(*conn).Close(context.WithoutCancel(ctx))
		*conn = nil
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("no answer within %s: %w", pollTimeout, err)
		}
		return err
	}
	sb.Trail(primary)
	PublishStandby(mon.m, sb, nil)
	return nil
}

// Publish sets the slot metrics from st.
func Publish(m *metrics.Metrics, st State) {
	m.SlotExists.Set(boolGauge(st.Exists))
	m.SlotActive.Set(boolGauge(st.Active))
	for _, s := range WALStatuses {
		m.SlotWALStatus.WithLabelValues(s).Set(boolGauge(st.Exists && st.WALStatus == s))
	}
	publishVersioned(m, st)
	m.SlotAheadOfWALBytes.Set(float64(st.AheadOfWALBytes))
	if !st.Exists {
		m.SlotLagBytes.Set(0)
		m.SlotRetainedBytes.Set(0)
		m.SlotSafeWALSize.Set(0)
		return
	}
	m.SlotLagBytes.Set(float64(st.LagBytes))
	m.SlotRetainedBytes.Set(float64(st.RetainedBytes))
	switch {
	case st.SafeWALSize != nil:
		m.SlotSafeWALSize.Set(float64(*st.SafeWALSize))
	case st.WALStatus == "lost":
		m.SlotSafeWALSize.Set(0) // nothing is safe any more
	default:
		m.SlotSafeWALSize.Set(-1) // max_slot_wal_keep_size = -1: the slot may retain WAL without limit
	}
}

// publishVersioned sets the metrics of columns that only newer servers have; on an older server
// they have no series at all rather than a value the server never reported.
func publishVersioned(m *metrics.Metrics, st State) {
	// Series are set in place or deleted, never reset and set again: a scrape in between would
	// see them vanish.
	if st.InvalidationReason.Known && st.Exists {
		reason := ""
		if st.InvalidationReason.Value != nil {
			reason = *st.InvalidationReason.Value
			if !slices.Contains(InvalidationReasons, reason) {
				reason = "other"
			}
		}
		for _, r := range append(InvalidationReasons, "other") {
			m.SlotInvalidated.WithLabelValues(r).Set(boolGauge(r == reason))
		}
	} else {
		m.SlotInvalidated.Reset()
	}
	if st.Exists && st.InactiveSince.Value != nil {
		m.SlotInactiveSince.WithLabelValues().Set(float64(st.InactiveSince.Value.UnixNano()) / 1e9)
	} else {
		m.SlotInactiveSince.Reset()
	}
	if st.IdleTimeout.Value != nil {
		m.IdleSlotTimeout.WithLabelValues().Set(float64(*st.IdleTimeout.Value))
	} else {
		m.IdleSlotTimeout.Reset()
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
