package checkpoint_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pglogrepl"
)

func reset(start pglogrepl.LSN, timeline uint32) step {
	return step{fmt.Sprintf("Reset(%s, timeline %d)", start, timeline), func(s *script) error {
		s.tr.Reset(start, timeline)
		return nil
	}}
}

func wantTimeline(timeline uint32) step {
	return step{fmt.Sprintf("Timeline() == %d", timeline), func(s *script) error {
		if got := s.tr.Timeline(); got != timeline {
			return fmt.Errorf("Timeline() = %d, want %d", got, timeline)
		}
		return nil
	}}
}

// After a failover to a server whose WAL diverged (an asynchronous standby that was behind), the
// new timeline reuses LSNs the old one had already passed: nothing learned on the old timeline may
// skip a transaction of the new one or be confirmed to the new server.
func TestTrackerResetForgetsTheOldTimeline(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "a new tracker has timeline 0 until the first Reset names one",
			steps: []step{
				wantTimeline(0), reset(0x100, 1), wantTimeline(1), wantSafe(0x100),
			},
		},
		{
			name: "the watermark goes back to the new server's confirmed position",
			steps: []step{
				reset(0x100, 1),
				begin("old", 0x500), add("old", 1), commit("old", 0x530), ack("old", 1), wantSafe(0x530),
				reset(0x300, 2), wantSafe(0x300), wantTimeline(2),
			},
		},
		{
			name: "a transaction of the new timeline at or below the old last commit is not skipped",
			steps: []step{
				reset(0x100, 1),
				begin("old", 0x500), add("old", 1), commit("old", 0x530), ack("old", 1),
				reset(0x300, 2),
				begin("new", 0x400), add("new", 1), commit("new", 0x430), wantSafe(0x300),
				ack("new", 1), wantSafe(0x430),
			},
		},
		{
			name: "acks of old-timeline transactions still in flight do not move the new watermark",
			steps: []step{
				reset(0x100, 1),
				begin("old1", 0x500), add("old1", 2), commit("old1", 0x530),
				begin("old2", 0x600), add("old2", 1), // open when the session ended
				reset(0x300, 2), wantPending(0), wantDrained(true),
				begin("new", 0x400), add("new", 1), commit("new", 0x430),
				ack("old1", 2), wantSafe(0x300), wantPending(1),
				ack("old2", 1), wantSafe(0x300),
				ack("new", 1), wantSafe(0x430), wantPending(0),
			},
		},
		{
			name: "a Drained channel kept before the reset is closed by it",
			steps: []step{
				reset(0x100, 1),
				begin("old", 0x500), add("old", 1), commit("old", 0x530),
				keepDrained("before"), wantKept("before", false),
				reset(0x300, 2), wantKept("before", true),
				ack("old", 1), wantDrained(true),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runScript(t, 0, tt.steps) })
	}
}
