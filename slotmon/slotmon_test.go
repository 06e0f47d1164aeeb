package slotmon_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/slotmon"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestReadReportsAMissingSlotAndThenTheCreatedOne(t *testing.T) {
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	slot := testenv.UniqueName(t, "slot")

	st, err := slotmon.Read(ctx, conn, slot)
	if err != nil {
		t.Fatal(err)
	}
	if st.Exists || st.CurrentLSN == 0 || st.Database == "" {
		t.Fatalf("missing slot read as %+v; want Exists=false with the current LSN and database", st)
	}
	m := metrics.New(prometheus.NewRegistry())
	slotmon.Publish(m, st)
	if v := value(m.SlotExists); v != 0 {
		t.Errorf("slot_exists = %v for a missing slot", v)
	}

	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })
	// Some WAL after the slot, so lag and retained WAL are positive.
	if _, err := conn.Exec(ctx, "CREATE TABLE filler AS SELECT generate_series(1, 1000) AS n"); err != nil {
		t.Fatal(err)
	}
	st, err = slotmon.Read(ctx, conn, slot)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case !st.Exists || st.Plugin != "pgoutput" || st.Active:
		t.Fatalf("slot read as %+v; want an inactive pgoutput slot", st)
	case st.WALStatus != "reserved":
		t.Errorf("wal_status %q, want reserved", st.WALStatus)
	case st.SafeWALSize != nil:
		t.Errorf("safe_wal_size %d, want NULL (max_slot_wal_keep_size is unlimited by default)", *st.SafeWALSize)
	case st.LagBytes <= 0 || st.RetainedBytes < st.LagBytes:
		t.Errorf("lag %d, retained %d; want 0 < lag <= retained", st.LagBytes, st.RetainedBytes)
	case int64(st.CurrentLSN-st.ConfirmedFlush) != st.LagBytes:
		t.Errorf("lag %d is not current %s - confirmed %s", st.LagBytes, st.CurrentLSN, st.ConfirmedFlush)
	}

	slotmon.Publish(m, st)
	for name, want := range map[string]float64{
		"slot_exists": 1, "slot_active": 0, "slot_lag_bytes": float64(st.LagBytes),
		"slot_retained_wal_bytes": float64(st.RetainedBytes), "slot_safe_wal_size_bytes": -1,
		"wal_status reserved": 1, "wal_status lost": 0,
	} {
		var got float64
		switch name {
		case "slot_exists":
			got = value(m.SlotExists)
		case "slot_active":
			got = value(m.SlotActive)
		case "slot_lag_bytes":
			got = value(m.SlotLagBytes)
		case "slot_retained_wal_bytes":
			got = value(m.SlotRetainedBytes)
		case "slot_safe_wal_size_bytes":
			got = value(m.SlotSafeWALSize)
		case "wal_status reserved":
			got = value(m.SlotWALStatus.WithLabelValues("reserved"))
		case "wal_status lost":
			got = value(m.SlotWALStatus.WithLabelValues("lost"))
		}
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// The metrics of columns that only newer servers have get series only from a server that
// reports them: PostgreSQL 14 to 16 show no invalidation reason and no inactive_since, 17 both,
// 18 also the idle timeout. An unknown reason is "other", so the series stay a fixed set.
func TestVersionedMetricsHaveSeriesOnlyWhereTheServerReportsThem(t *testing.T) {
	reason := func(s string) slotmon.Column[string] { return slotmon.Column[string]{Known: true, Value: &s} }
	since := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	zero := int64(0)
	tests := []struct {
		name string
		st   slotmon.State
		want map[string]float64 // series name (with labels) -> value; no other series of the three
	}{
		{"PostgreSQL 16, lost slot: no invalidation series (wal_status says lost)", slotmon.State{Exists: true, WALStatus: "lost",
			Conflicting: slotmon.Column[bool]{Known: true, Value: new(bool)}}, map[string]float64{}},
		{"PostgreSQL 17, usable inactive slot", slotmon.State{Exists: true, WALStatus: "reserved",
			InvalidationReason: slotmon.Column[string]{Known: true}, InactiveSince: slotmon.Column[time.Time]{Known: true, Value: &since}},
			map[string]float64{`slot_invalidated{reason="wal_removed"}`: 0, `slot_invalidated{reason="rows_removed"}`: 0,
				`slot_invalidated{reason="wal_level_insufficient"}`: 0, `slot_invalidated{reason="idle_timeout"}`: 0,
				`slot_invalidated{reason="other"}`: 0, "slot_inactive_since_timestamp_seconds": float64(since.Unix())}},
		{"PostgreSQL 18, slot invalidated for idleness", slotmon.State{Exists: true, WALStatus: "lost",
			InvalidationReason: reason("idle_timeout"), InactiveSince: slotmon.Column[time.Time]{Known: true, Value: &since},
			IdleTimeout: slotmon.Column[int64]{Known: true, Value: &zero}},
			map[string]float64{`slot_invalidated{reason="wal_removed"}`: 0, `slot_invalidated{reason="rows_removed"}`: 0,
				`slot_invalidated{reason="wal_level_insufficient"}`: 0, `slot_invalidated{reason="idle_timeout"}`: 1,
				`slot_invalidated{reason="other"}`: 0, "slot_inactive_since_timestamp_seconds": float64(since.Unix()),
				"idle_replication_slot_timeout_seconds": 0}},
		{"a reason this version does not know is other", slotmon.State{Exists: true, InvalidationReason: reason("cosmic_ray")},
			map[string]float64{`slot_invalidated{reason="wal_removed"}`: 0, `slot_invalidated{reason="rows_removed"}`: 0,
				`slot_invalidated{reason="wal_level_insufficient"}`: 0, `slot_invalidated{reason="idle_timeout"}`: 0,
				`slot_invalidated{reason="other"}`: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := metrics.New(reg)
			// A 17+ slot first, so the test also sees series removed when the state changes.
			full := reason("wal_removed")
			slotmon.Publish(m, slotmon.State{Exists: true, InvalidationReason: full, InactiveSince: slotmon.Column[time.Time]{Known: true, Value: &since},
				IdleTimeout: slotmon.Column[int64]{Known: true, Value: &zero}})
			slotmon.Publish(m, tt.st)
			got := map[string]float64{}
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range families {
				name := strings.TrimPrefix(f.GetName(), "outbox_relay_")
				if name != "slot_invalidated" && name != "slot_inactive_since_timestamp_seconds" && name != "idle_replication_slot_timeout_seconds" {
					continue
				}
				for _, s := range f.GetMetric() {
					key := name
					for _, l := range s.GetLabel() {
						key += fmt.Sprintf(`{%s=%q}`, l.GetName(), l.GetValue())
					}
					got[key] = s.GetGauge().GetValue()
				}
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("series %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTheMonitorPollsAndReportsAnUnreachableServer(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	var mu sync.Mutex
	var polls []error
	mon := slotmon.New(slotmon.Config{DSN: "postgres://u:p@127.0.0.1:1/db?sslmode=disable", Slot: "s",
		Interval: 100 * time.Millisecond, OnPoll: func(err error) {
			mu.Lock()
			polls = append(polls, err)
			mu.Unlock()
		}}, zaptest.NewLogger(t), m)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	mon.Run(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(polls) < 3 {
		t.Fatalf("%d polls in 700ms at a 100ms interval", len(polls))
	}
	for _, err := range polls {
		if err == nil || errors.Is(err, context.Canceled) {
			t.Fatalf("poll of an unreachable server reported %v", err)
		}
	}
	if v := value(m.PostgresUp); v != 0 {
		t.Errorf("postgres_up = %v, want 0", v)
	}
}

// value reads a gauge (prometheus/testutil would add a module to go.mod for this one call).
func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var out dto.Metric
	if err := (<-ch).Write(&out); err != nil {
		panic(err)
	}
	return out.GetGauge().GetValue()
}
