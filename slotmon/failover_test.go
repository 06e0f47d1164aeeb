package slotmon_test

import (
	"strings"
	"testing"

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
		{"a temporary copy is dropped at promotion", func(s *slotmon.Standby) { s.Temporary = true }, "not ready yet"},
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
