package relay

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

func TestAPositionSkipsOnlyWhatTheServersTimelineHistoryShares(t *testing.T) {
	const sys, other = "7714668250760685997", "7000000000000000001"
	pos := func(sysID string, tl uint32, lsn pglogrepl.LSN, events int) sink.Position {
		return sink.Position{SystemID: sysID, Timeline: tl, CommitLSN: lsn, Events: events}
	}
	server := func(tl uint32) replication.Identity { return replication.Identity{SystemID: sys, Timeline: tl} }
	// Timeline 1 ended at 0x3000 (timeline 2 forked there), timeline 2 at 0x5000 (timeline 3).
	history := []replication.TimelineSwitch{{Timeline: 1, End: 0x3000}, {Timeline: 2, End: 0x5000}}
	tests := []struct {
		name    string
		pos     sink.Position
		server  replication.Identity
		history []replication.TimelineSwitch
		want    sink.Position
		ok      bool
		why     string // in the log line when something is given up
	}{
		{"the server's timeline: all of it", pos(sys, 2, 0x4000, 3), server(2), nil, pos(sys, 2, 0x4000, 3), true, ""},
		{"another database cluster: nothing", pos(other, 2, 0x4000, 3), server(2), nil, sink.Position{}, false, "another database cluster"},
		{"another database cluster on the same timeline number: nothing", pos(other, 1, 0x100, 1), server(1), nil, sink.Position{}, false, "another database cluster"},
		{"an earlier timeline, below its fork point: all of it", pos(sys, 1, 0x2000, 2), server(2), history[:1], pos(sys, 1, 0x2000, 2), true, ""},
		{"an earlier timeline, beyond its fork point: what lies before the fork", pos(sys, 1, 0x4000, 2), server(2), history[:1], pos(sys, 1, 0x3000, 0), true, "left at 0/3000"},
		{"an earlier timeline, at its fork point: what lies before the fork", pos(sys, 1, 0x3000, 2), server(2), history[:1], pos(sys, 1, 0x3000, 0), true, "left at 0/3000"},
		{"two timelines back, beyond the fork: its own fork point counts", pos(sys, 1, 0x4000, 1), server(3), history, pos(sys, 1, 0x3000, 0), true, "left at 0/3000"},
		{"the previous timeline of three, below its fork", pos(sys, 2, 0x4000, 1), server(3), history, pos(sys, 2, 0x4000, 1), true, ""},
		{"a timeline the history does not hold (a sibling branch): nothing", pos(sys, 2, 0x2000, 1), server(3), []replication.TimelineSwitch{{Timeline: 1, End: 0x3000}}, sink.Position{}, false, "not in this server's history"},
		{"a later timeline than the server's: nothing", pos(sys, 3, 0x2000, 1), server(2), nil, sink.Position{}, false, "later than this server's"},
		{"unknown origin on a server that never forked: all of it", pos("", 0, 0x4000, 2), server(1), nil, pos("", 0, 0x4000, 2), true, ""},
		{"unknown origin below the first fork: all of it", pos("", 0, 0x2000, 2), server(3), history, pos("", 0, 0x2000, 2), true, ""},
		{"unknown origin beyond the first fork: what lies before it", pos("", 0, 0x4000, 2), server(3), history, pos("", 0, 0x3000, 0), true, "no timeline"},
		{"unknown origin, a forked server without history: nothing", pos("", 0, 0x100, 1), server(2), []replication.TimelineSwitch{}, sink.Position{}, false, "no timeline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := needsHistory(tt.pos, tt.server); got != (tt.history != nil) {
				t.Errorf("needsHistory = %v, want %v", got, tt.history != nil)
			}
			got, ok, why := usablePosition(tt.pos, tt.server, tt.history)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("usablePosition = %+v %v, want %+v %v", got, ok, tt.want, tt.ok)
			}
			if (tt.why == "") != (why == "") || !strings.Contains(why, tt.why) {
				t.Fatalf("why = %q, want it to say %q", why, tt.why)
			}
			if ok && got != tt.pos && (got.CommitLSN > tt.pos.CommitLSN) {
				t.Fatalf("the usable part %+v reaches beyond the position %+v", got, tt.pos)
			}
		})
	}
}

// A Relay that starts on a new timeline (a leader's next term, a restart) with the old timeline's
// position in Kafka: a transaction shared with the old timeline (below the fork) is skipped, the
// new timeline's transactions at LSNs the old position had passed are published.
func TestANewRelayOnANewTimelineSkipsOnlyBelowTheForkPoint(t *testing.T) {
	t.Parallel()
	aggType := testenv.UniqueName(t, "newtimeline")
	const sys = "7714668250760685997"
	r, reg, _ := exactlyOnceWAL(t, sink.Position{SystemID: sys, Timeline: 1, CommitLSN: 400, Events: 1}, true)
	var asked []uint32
	r.history = func(_ context.Context, timeline uint32) (replication.Identity, []replication.TimelineSwitch, error) {
		asked = append(asked, timeline)
		return replication.Identity{SystemID: sys, Timeline: 2}, []replication.TimelineSwitch{{Timeline: 1, End: 150}}, nil
	}
	ctx := context.Background()
	first := session(2, 50)
	first.SystemID = sys
	msgs := stream(first, relationMessage(outboxColumns),
		beginMessage(100), event(aggType, 1, `{}`), commitMessage(100, 110), // before the fork: in Kafka
		beginMessage(200), event(aggType, 2, `{}`), commitMessage(200, 210), // the new timeline's
		beginMessage(400), event(aggType, 3, `{}`), commitMessage(400, 410), // at the old position's LSN
	)
	if err := r.pipeline(ctx, ctx, msgs); err != nil {
		t.Fatal(err)
	}
	waitSafe(t, r, 410)
	if len(asked) != 1 || asked[0] != 2 {
		t.Fatalf("timeline history asked for %v, want timeline 2 once", asked)
	}
	if got := publishedTotal(t, reg); got != 2 {
		t.Fatalf("%v events published, want 2: the new timeline's transactions at 200 and 400", got)
	}
	if got := metricSum(t, reg, "outbox_relay_events_replay_skipped_total"); got != 1 {
		t.Fatalf("%v events skipped, want 1 (the transaction below the fork point)", got)
	}
}

// A position reached on a later timeline of the server's own cluster means pg_dsn leads to a
// superseded primary: the relay stops instead of streaming it (skipping nothing there would publish
// again what Kafka holds, and publish the old primary's transactions beyond the fork).
func TestAPositionFromALaterTimelineOfTheSameClusterStopsTheRelay(t *testing.T) {
	const sys = "7714668250760685997"
	for _, tt := range []struct {
		name   string
		pos    sink.Position
		server replication.Identity
		fatal  bool
	}{
		{"a later timeline of the same cluster", sink.Position{SystemID: sys, Timeline: 2, CommitLSN: 0x4000, Events: 1}, replication.Identity{SystemID: sys, Timeline: 1}, true},
		{"the same timeline", sink.Position{SystemID: sys, Timeline: 2, CommitLSN: 0x4000}, replication.Identity{SystemID: sys, Timeline: 2}, false},
		{"an earlier timeline", sink.Position{SystemID: sys, Timeline: 1, CommitLSN: 0x4000}, replication.Identity{SystemID: sys, Timeline: 2}, false},
		{"another cluster's later timeline", sink.Position{SystemID: "1", Timeline: 5, CommitLSN: 0x4000}, replication.Identity{SystemID: sys, Timeline: 1}, false},
		{"a position of unknown origin", sink.Position{CommitLSN: 0x4000}, replication.Identity{SystemID: sys, Timeline: 1}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := supersededServer(tt.pos, tt.server)
			if tt.fatal != (err != nil) || (err != nil && !replication.IsFatal(err)) {
				t.Fatalf("supersededServer = %v, want a fatal error: %v", err, tt.fatal)
			}
		})
	}
}
