package replication

import "testing"

// TestAResumeFromASynchronisedSlotIsToldOnceAfterThePromotion: the relay says it resumes from the
// slot the promoted standby kept, at the first session that streams on the new timeline, also when
// an earlier session on it ended before it got that far (a fence right after IDENTIFY_SYSTEM left
// the new timeline in the process's memory, so the next session sees no timeline change), and not
// at later starts, once the ledger recorded the new timeline.
func TestAResumeFromASynchronisedSlotIsToldOnceAfterThePromotion(t *testing.T) {
	old := Identity{SystemID: "7", Timeline: 1}
	promoted := Identity{SystemID: "7", Timeline: 2}
	synced := slotFailoverState{failover: true, synced: true}
	tests := []struct {
		name        string
		st          slotFailoverState
		newTimeline bool
		ledger      Identity
		want        bool
	}{
		{"the first session after the promotion", synced, true, old, true},
		{"a session after one cut off before it streamed", synced, false, old, true},
		{"a restart once the ledger recorded the new timeline", synced, false, promoted, false},
		{"a slot created on this server", slotFailoverState{failover: true}, true, old, false},
		{"no ledger record", synced, false, Identity{}, false},
		{"a ledger of another cluster", synced, false, Identity{SystemID: "8", Timeline: 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resumesSynced(tt.st, tt.newTimeline, tt.ledger, promoted); got != tt.want {
				t.Errorf("resumesSynced = %v, want %v", got, tt.want)
			}
		})
	}
}
