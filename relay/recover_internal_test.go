package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
)

// TestTheXminRuleChoosesTheRowsAtOrPastTheHorizonAcrossAnEpoch evaluates the xmin rule's clause
// in PostgreSQL on 32-bit ids around an epoch boundary: a row's id is the full id below the
// snapshot's next one with its low bits, so ids from the horizon on (in either epoch) are chosen,
// older ones are not, and an id at or past next (only a frozen row from long ago can show one)
// maps to the previous epoch and is left to the older rows.
func TestTheXminRuleChoosesTheRowsAtOrPastTheHorizonAcrossAnEpoch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.SharedPostgres(t)
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const epoch = 1 << 32
	next := uint64(epoch + 5)     // epoch 1, low bits 5
	horizon := uint64(epoch - 10) // epoch 0, low bits 4294967286
	g, err := gapQuery(outboxTable{name: "t", created: "created_at"}, replication.LostSlot{Slot: "s", Xmin: horizon, Since: time.Now()}, 0, false, next)
	if err != nil {
		t.Fatal(err)
	}
	if g.rule != replication.RuleXmin {
		t.Fatalf("rule %q, want %q", g.rule, replication.RuleXmin)
	}
	for _, tc := range []struct {
		name string
		xmin uint32
		want bool
	}{
		{"the horizon itself is in the gap", epoch - 10, true},
		{"an id just below the horizon is not", epoch - 11, false},
		{"the last id of the previous epoch is in the gap", epoch - 1, true},
		{"an id of the next epoch below next is in the gap", 3, true},
		{"next itself, not yet assigned, maps to the previous epoch", 5, false},
		{"an old id far below the horizon is not", 1000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			where := strings.ReplaceAll(g.where, "xmin", "$1::text::xid")
			var got bool
			if err := conn.QueryRow(ctx, "SELECT "+where, fmt.Sprint(tc.xmin)).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("xmin %d with next %d and horizon %d: in the gap %v, want %v (%s)", tc.xmin, next, horizon, got, tc.want, g.where)
			}
		})
	}
}

// TestTheCommitTimeRuleAlsoChoosesRowsFromTheHorizonOn evaluates the commit time rule's clause in
// PostgreSQL: a commit timestamp is the server's clock (stepped back) or a replication origin's (a
// transaction applied by logical replication carries its origin's), so a transaction committed
// after the acknowledged one may show an earlier time. With a horizon recorded, its rows are in
// the gap all the same; rows below the horizon still go by their commit time.
func TestTheCommitTimeRuleAlsoChoosesRowsFromTheHorizonOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.SharedPostgres(t)
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	since := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const next, horizon = 1000, 900
	g, err := gapQuery(outboxTable{name: "t", created: "created_at"}, replication.LostSlot{Slot: "s", Xmin: horizon, Since: since}, 0, true, next)
	if err != nil {
		t.Fatal(err)
	}
	if g.rule != replication.RuleCommitTime {
		t.Fatalf("rule %q, want %q", g.rule, replication.RuleCommitTime)
	}
	for _, tc := range []struct {
		name      string
		xmin      int
		committed *time.Time
		want      bool
	}{
		{"a row committed after the acknowledged commit is in the gap", 950, ptr(since.Add(time.Minute)), true},
		{"a row from the horizon on whose commit time reads an hour earlier is in the gap", 950, ptr(since.Add(-time.Hour)), true},
		{"a row below the horizon committed within the skew is in the gap", 800, ptr(since.Add(-time.Second / 2)), true},
		{"a row below the horizon committed long before is not", 800, ptr(since.Add(-time.Hour)), false},
		{"a row from the horizon on of unknown commit time is in the gap", 950, nil, true},
		{"a row below the horizon of unknown commit time is not", 800, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			where := strings.ReplaceAll(g.where, "pg_xact_commit_timestamp(xmin)", fmt.Sprintf("$%d::timestamptz", len(g.args)+1))
			where = strings.ReplaceAll(where, "xmin", fmt.Sprintf("$%d::text::xid", len(g.args)+2))
			var got bool
			if err := conn.QueryRow(ctx, "SELECT coalesce("+where+", false) FROM (SELECT $2::timestamptz, $3::timestamptz) AS duplicate_args",
				append(append([]any{}, g.args...), tc.committed, fmt.Sprint(tc.xmin))...).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("in the gap %v, want %v (%s)", got, tc.want, g.where)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestAGapNothingBoundsIsASlotLostError: gapQuery's choice of rule, and its refusals.
func TestAGapNothingBoundsIsASlotLostError(t *testing.T) {
	t.Parallel()
	tbl := outboxTable{name: "t", created: "created_at"}
	since := time.Now()
	for _, tc := range []struct {
		name             string
		lost             replication.LostSlot
		margin           time.Duration
		commitTimestamps bool
		rule             string // "" : refused
	}{
		{"commit timestamps with an acknowledged commit choose by commit time", replication.LostSlot{Since: since}, 0, true, replication.RuleCommitTime},
		{"a horizon without commit timestamps chooses by transaction id", replication.LostSlot{Since: since, Xmin: 900}, 0, false, replication.RuleXmin},
		{"a horizon wins over a margin set by hand", replication.LostSlot{Since: since, Xmin: 900}, time.Minute, false, replication.RuleXmin},
		{"a margin set by hand is used where nothing else bounds the gap", replication.LostSlot{Since: since}, time.Minute, false, replication.RuleCreatedAt},
		{"no horizon, no commit timestamps and no margin is refused", replication.LostSlot{Since: since}, 0, false, ""},
		{"a slot lost before anything was acknowledged is refused without a horizon", replication.LostSlot{Since: since, FromSlotCreation: true}, 0, true, ""},
		{"a slot lost before anything was acknowledged goes by a horizon", replication.LostSlot{Since: since, FromSlotCreation: true, Xmin: 900}, 0, true, replication.RuleXmin},
		{"a horizon more than 2^31 ids old is refused", replication.LostSlot{Since: since, Xmin: 900}, time.Minute, false, "far"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := uint64(1000)
			if tc.rule == "far" {
				next = 900 + 1<<31
			}
			g, err := gapQuery(tbl, tc.lost, tc.margin, tc.commitTimestamps, next)
			switch {
			case tc.rule == "" || tc.rule == "far":
				if !errors.Is(err, replication.ErrSlotLost) {
					t.Fatalf("rule %q, error %v; want ErrSlotLost", g.rule, err)
				}
			case err != nil:
				t.Fatal(err)
			case g.rule != tc.rule:
				t.Errorf("rule %q, want %q", g.rule, tc.rule)
			}
		})
	}
}

// TestTheRecordedHorizonIsTheNewestSampleTheAcknowledgedPositionPassedOnItsTimeline: a sample
// counts once Kafka's acknowledged position reaches the WAL position read after it, on the
// timeline it was taken on; samples taken before the first session are the first timeline's.
func TestTheRecordedHorizonIsTheNewestSampleTheAcknowledgedPositionPassedOnItsTimeline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		samples  []horizonSample
		saw      bool
		safe     uint64
		timeline uint32
		want     uint64
		left     int
	}{
		{"no sample passed", []horizonSample{{xmin: 10, lsn: 100, timeline: 1}}, true, 99, 1, 0, 1},
		{"the newest passed of several", []horizonSample{{10, 100, 1}, {20, 200, 1}, {30, 300, 1}}, true, 250, 1, 20, 1},
		{"a sample of another timeline is never used", []horizonSample{{10, 100, 1}, {20, 200, 2}}, true, 250, 2, 20, 0},
		{"a sample of the old timeline is dropped after a failover", []horizonSample{{10, 100, 1}}, true, 250, 2, 0, 0},
		{"before the first session nothing passes and every sample is kept", []horizonSample{{10, 100, 1}, {20, 200, 2}}, false, 250, 0, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &confirmedRecorder{samples: append([]horizonSample(nil), tc.samples...)}
			if got := c.passed(pglogrepl.LSN(tc.safe), tc.timeline); got != tc.want || len(c.samples) != tc.left {
				t.Errorf("passed(%d, timeline %d) = %d with %d samples left, want %d with %d left", tc.safe, tc.timeline, got, len(c.samples), tc.want, tc.left)
			}
		})
	}
}

// TestAHorizonIsRecordedOnlyFromSamplesOfTheStreamsTimeline: the recorder samples on a connection
// of its own, from the start of a term, before the first session says which server the stream
// reads. Samples taken on a server of another timeline than the stream's (the old primary,
// before a failover the first session followed; a superseded primary still running) must never
// become the recorded horizon: that server assigns ids the stream's does not know. They were
// stamped with the tracker's timeline (0 before the first session, then adopted by it).
func TestAHorizonIsRecordedOnlyFromSamplesOfTheStreamsTimeline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t)) // timeline 1
	slot := testenv.UniqueName(t, "slot")
	tracker := checkpoint.New(0)
	c := newConfirmedRecorder(tracker, &replication.Config{DSN: dsn, Slot: slot, Schema: "public"}, zaptest.NewLogger(t))
	defer c.close(ctx)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	recorded := func() *string {
		t.Helper()
		var xmin *string
		err := admin.QueryRow(ctx, "SELECT confirmed_xmin::text FROM outbox_relay_slots WHERE slot = $1", slot).Scan(&xmin)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return xmin
	}
	far := pglogrepl.LSN(1 << 62) // past every sample's position

	c.write(ctx) // before the first session: a sample of this server, on timeline 1
	tracker.Reset(far, 2)
	c.write(ctx) // the first session streams a server on timeline 2
	if x := recorded(); x != nil {
		t.Fatalf("a horizon sampled on timeline 1 was recorded (%s) for a stream on timeline 2", *x)
	}
	tracker.Reset(far, 1)
	c.write(ctx) // the sample the last write took, on timeline 1, passes
	if recorded() == nil {
		t.Fatal("no horizon recorded from a sample of the stream's own timeline")
	}
}
