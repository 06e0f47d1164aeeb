package slotmon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/slotmon"
)

func TestAStandbysCopyIsReadyOnlyWhenAPromotionWouldKeepIt(t *testing.T) {
	ready := slotmon.Standby{Address: "db2:5432", Recovery: true, Supported: true, SyncReplicationSlots: true,
		HotStandbyFeedback: true, PrimarySlotName: "standby1", SlotExists: true, Synced: true}
	tests := []struct {
		name   string
		change func(*slotmon.Standby)
		says   string // "" for ready
	}{
		{"a synced, persistent, valid copy is ready", func(*slotmon.Standby) {}, ""},
		{"a server before 17 has no failover slots", func(s *slotmon.Standby) { s.Supported = false }, "before 17"},
		{"a server that is not in recovery is not a standby", func(s *slotmon.Standby) { s.Recovery = false }, "not a standby"},
		{"without sync_replication_slots nothing is copied", func(s *slotmon.Standby) { s.SyncReplicationSlots = false }, "sync_replication_slots = on (now off)"},
		{"without hot_standby_feedback nothing is copied", func(s *slotmon.Standby) { s.HotStandbyFeedback = false }, "hot_standby_feedback = on (now off)"},
		{"without primary_slot_name nothing is copied", func(s *slotmon.Standby) { s.PrimarySlotName = "" }, "primary_slot_name set"},
		{"a missing copy loses the slot", func(s *slotmon.Standby) { s.SlotExists, s.Synced = false, false }, "has no copy"},
		{"a temporary copy is dropped at promotion", func(s *slotmon.Standby) { s.Temporary = true }, "not persisted yet (synced true, temporary true): a promotion now drops it"},
		{"an invalidated copy loses the slot", func(s *slotmon.Standby) { s.InvalidationReason = "rows_removed" }, "invalidated (rows_removed)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ready
			tt.change(&s)
			problem := s.Problem("outbox_relay")
			if s.Ready() != (tt.says == "") {
				t.Fatalf("Ready() = %v with problem %q", s.Ready(), problem)
			}
			if tt.says == "" && problem != "" || !strings.Contains(problem, tt.says) {
				t.Fatalf("Problem = %q, want it to say %q", problem, tt.says)
			}
		})
	}
}

func TestFailoverIsDescribedWithWhatProtectsIt(t *testing.T) {
	tests := []struct {
		name      string
		f         slotmon.Failover
		protected bool
		says      string
	}{
		{"before 17", slotmon.Failover{}, false, "before 17 has no failover slots"},
		{"not a failover slot", slotmon.Failover{Supported: true}, false, "failover: true makes it one"},
		{"unprotected", slotmon.Failover{Supported: true, Failover: true}, false, "synchronized_standby_slots is empty"},
		{"a streamed standby slot", slotmon.Failover{Supported: true, Failover: true,
			StandbySlots: []slotmon.StandbySlot{{Name: "s1", Exists: true, Active: true}}}, true, "s1 (streamed)"},
		{"a standby slot nothing streams", slotmon.Failover{Supported: true, Failover: true,
			StandbySlots: []slotmon.StandbySlot{{Name: "s1", Exists: true, Active: true}, {Name: "s2", Exists: true}}}, false, "s2 (not streamed)"},
		{"a missing standby slot", slotmon.Failover{Supported: true, Failover: true,
			StandbySlots: []slotmon.StandbySlot{{Name: "gone"}}}, false, "gone (missing)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f.Protected(); got != tt.protected {
				t.Errorf("Protected() = %v, want %v", got, tt.protected)
			}
			if got := tt.f.Describe(); !strings.Contains(got, tt.says) {
				t.Errorf("Describe() = %q, want it to say %q", got, tt.says)
			}
		})
	}
}

// The standby's copy of a failover slot is what a promotion keeps, and PostgreSQL keeps a synced
// copy temporary (dropping it at promotion) until the primary's slot passes the standby's catalog
// xmin: right after the slot is created the monitor reports it not persisted and not ready, and
// once the primary's slot has moved on it reports it persisted, ready, and how far it trails.
func TestTheMonitorReportsAStandbysCopyTemporaryUntilThePrimarysSlotPassesItThenPersistedWithItsTrail(t *testing.T) {
	ctx := context.Background()
	primary := testenv.Postgres(t, devenv.PostgresOptions{Version: "18"})
	standby := testenv.FailoverStandby(t, primary)
	const database = "postgres"
	slot := testenv.TemporaryFailoverCopy(t, primary, standby, database, testenv.UniqueName(t, "slot"))

	m := metrics.New(prometheus.NewRegistry())
	mctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		slotmon.New(slotmon.Config{DSN: primary.DSN(database), Slot: slot, Interval: 100 * time.Millisecond,
			StandbyDSN: standby.DSN(database)}, zaptest.NewLogger(t), m).Run(mctx)
	}()
	defer func() { stop(); <-done }()

	await.True(t, time.Minute, "a poll to reach the standby", func() bool { up, _ := series(m.StandbyUp); return up == 1 })
	up, _ := series(m.StandbyUp)
	persisted, _ := series(m.StandbySlotPersisted)
	ready, _ := series(m.StandbySlotReady)
	if up != 1 || persisted != 0 || ready != 0 {
		t.Fatalf("right after the slot's creation: standby_up %v, standby_slot_persisted %v, standby_slot_ready %v; want 1, 0, 0 (a temporary copy)", up, persisted, ready)
	}
	sb := readStandby(t, standby, database, slot)
	if !sb.SlotExists || !sb.Temporary || sb.Persisted || !strings.Contains(sb.Problem(slot), "not persisted yet") {
		t.Fatalf("the standby's copy right after the slot's creation: %+v, problem %q; want a temporary copy, not persisted", sb, sb.Problem(slot))
	}

	took := await.True(t, 2*time.Minute, "the copy is persisted once the primary's slot moves on", func() bool {
		if err := testenv.NudgeSlotSync(ctx, primary, standby, database, slot); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		persisted, _ := series(m.StandbySlotPersisted)
		ready, _ := series(m.StandbySlotReady)
		return persisted == 1 && ready == 1
	})
	t.Logf("the copy was persisted %s after the primary's slot started to move", took.Round(time.Millisecond))

	// Nothing moves the primary's slot now: the copy catches up, and the trail the monitor reports
	// is the difference of the two servers' positions.
	await.True(t, time.Minute, "the copy's trail is what the servers say", func() bool {
		_ = standby.Exec(ctx, database, "SELECT pg_sync_replication_slots()")
		var primaryConfirmed, primaryRestart string
		conn, err := pgx.Connect(ctx, primary.DSN(database))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).
			Scan(&primaryConfirmed, &primaryRestart); err != nil {
			t.Fatal(err)
		}
		sb := readStandby(t, standby, database, slot)
		trail, ok := series(m.StandbySlotTrailBytes)
		restartTrail, rok := series(m.StandbySlotRestartTrailBytes)
		want, wantRestart := lsnDiff(t, primaryConfirmed, sb.ConfirmedFlushLSN), lsnDiff(t, primaryRestart, sb.RestartLSN)
		t.Logf("trail %v (servers: %d), restart trail %v (servers: %d)", trail, want, restartTrail, wantRestart)
		return ok && rok && trail == float64(want) && restartTrail == float64(wantRestart) && trail >= 0
	})
}

func readStandby(t *testing.T, standby *devenv.Postgres, database, slot string) slotmon.Standby {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, standby.DSN(database))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	sb, err := slotmon.ReadStandby(ctx, conn, "standby", slot)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func lsnDiff(t *testing.T, a, b string) int64 {
	t.Helper()
	la, err := pglogrepl.ParseLSN(a)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := pglogrepl.ParseLSN(b)
	if err != nil {
		t.Fatal(err)
	}
	return int64(la) - int64(lb)
}

// series reads the one series of a gauge vector without labels; false when it has none.
func series(g *prometheus.GaugeVec) (float64, bool) {
	ch := make(chan prometheus.Metric, 4)
	g.Collect(ch)
	close(ch)
	for m := range ch {
		var out dto.Metric
		if err := m.Write(&out); err != nil {
			panic(err)
		}
		return out.GetGauge().GetValue(), true
	}
	return 0, false
}

// A failover standby the relay cannot reach is no ready copy (the alert must not stay silent),
// and does not make PostgreSQL itself count as unreachable: every poll of the primary (what
// readiness and postgres_up follow) succeeds.
func TestAnUnreachableFailoverStandbyIsNotReadyAndLeavesThePrimarysHealthAlone(t *testing.T) {
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	polls := make(chan error, 100)
	mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	slotmon.New(slotmon.Config{DSN: dsn, Slot: "s", Interval: 100 * time.Millisecond,
		StandbyDSN: "postgres://u:p@127.0.0.1:1/db?sslmode=disable&connect_timeout=1",
		OnPoll: func(err error) {
			select {
			case polls <- err:
			default:
			}
		}}, zaptest.NewLogger(t), m).Run(mctx)
	close(polls)
	n := 0
	for err := range polls {
		n++
		if err != nil {
			t.Errorf("a poll of the reachable primary reported %v", err)
		}
	}
	up, upOK := series(m.StandbyUp)
	ready, readyOK := series(m.StandbySlotReady)
	_, persistedOK := series(m.StandbySlotPersisted)
	_, trailOK := series(m.StandbySlotTrailBytes)
	switch {
	case n == 0:
		t.Fatal("no poll in 2s")
	case !upOK || up != 0 || !readyOK || ready != 0:
		t.Errorf("standby_up %v (series %v), standby_slot_ready %v (series %v); want both 0", up, upOK, ready, readyOK)
	case persistedOK || trailOK:
		t.Errorf("an unreachable standby's copy has series: persisted %v, trail %v; want none", persistedOK, trailOK)
	}
}
