package leader

import "testing"

// TestAStandbyRemembersThePublishedWalsenderOfAnExitingHolder: the last sighting of a holder may
// come while its backend exits (locks still listed, its pg_stat_activity row gone), which reads as
// a holder without a published walsender; the standby must still end the walsender when it takes
// over, or the slot stays busy until wal_sender_timeout.
func TestAStandbyRemembersThePublishedWalsenderOfAnExitingHolder(t *testing.T) {
	published := Holder{PID: 10, ApplicationName: "outbox-relay", ClientAddr: "127.0.0.1", WalsenderPID: 11}
	for _, tc := range []struct {
		name     string
		previous *Holder
		seen     Holder
		want     int32 // the walsender to end on taking over
	}{
		{"first sighting", nil, published, 11},
		{"first sighting, nothing published", nil, Holder{PID: 10}, 0},
		{"same holder, exiting (no activity row)", &published, Holder{PID: 10, exiting: true}, 11},
		{"the same PID, a new session that published nothing", &published, Holder{PID: 10, ApplicationName: "outbox-relay"}, 0},
		{"same holder, still published", &published, published, 11},
		{"same holder, published a new walsender", &published, Holder{PID: 10, WalsenderPID: 12}, 12},
		{"another holder, nothing published", &published, Holder{PID: 20, ApplicationName: "outbox-relay"}, 0},
		{"another holder, published", &published, Holder{PID: 20, WalsenderPID: 21}, 21},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rememberHolder(tc.previous, tc.seen); got.WalsenderPID != tc.want {
				t.Fatalf("remembered walsender %d, want %d (holder %+v)", got.WalsenderPID, tc.want, *got)
			}
		})
	}
}
