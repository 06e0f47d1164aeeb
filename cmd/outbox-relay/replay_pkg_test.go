package main_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/replay"
	"github.com/outbox-relay/outbox-relay/sink"
)

// The replay package against a real table and broker (here, where both already run for the
// command's tests). One table and topic for every case: each case replays into the topic and looks at the records
// that arrived since the one before.
func TestReplayPublishesWhatIsStillInTheTableAndRefusesWhatWasPruned(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	// After the servers' start, which a loaded machine may take long for.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER TABLE outbox_events ADD COLUMN aggregate_version bigint"); err != nil {
		t.Fatal(err)
	}
	aggType := testenv.UniqueName(t, "order")
	topic := harness.TopicFor(aggType)
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	cols := outbox.DefaultColumns
	cols.AggregateVersion = "aggregate_version"
	w, err := outbox.New(outbox.Config{Columns: cols})
	if err != nil {
		t.Fatal(err)
	}
	// o-1 versions 1..4, o-2 versions 1..2; o-1's first two were written a week ago.
	ids := map[string]string{} // "o-1/3" -> event id
	for _, e := range []struct {
		agg string
		v   int64
	}{{"o-1", 1}, {"o-1", 2}, {"o-2", 1}, {"o-1", 3}, {"o-2", 2}, {"o-1", 4}} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.Write(ctx, tx, outbox.Event{AggregateType: aggType, AggregateID: e.agg, EventType: "OrderChanged",
			AggregateVersion: e.v, Payload: map[string]int64{"v": e.v}, Headers: map[string]string{"tenant": "acme"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		ids[fmt.Sprintf("%s/%d", e.agg, e.v)] = got[0]
	}
	weekAgo := time.Now().Add(-7 * 24 * time.Hour)
	if _, err := conn.Exec(ctx, "UPDATE outbox_events SET created_at = $1 WHERE aggregate_id = 'o-1' AND aggregate_version <= 2", weekAgo); err != nil {
		t.Fatal(err)
	}

	s, err := sink.New(replay.SinkConfig(sink.Config{Brokers: []string{k.Brokers()}}), zaptest.NewLogger(t), metrics.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	table := replay.Table{Name: "outbox_events", Columns: decoder.Columns{ID: "id", AggregateType: "aggregate_type",
		AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload", Headers: "headers", AggregateVersion: "aggregate_version"}}

	type position struct {
		partition int
		offset    int64
	}
	seen := map[position]bool{}
	// arrived returns "aggregate/version" of the records that reached the topic since the last call,
	// sorted, after checking that each is marked as a replay and kept its headers. (Records are told
	// apart by their offsets: a replayed record carries its event's timestamp, a week old for some.)
	arrived := func(t *testing.T, want int) []string {
		t.Helper()
		var fresh []harness.Record
		deadline := time.Now().Add(30 * time.Second)
		for {
			recs, err := harness.Reread(ctx, k.Brokers(), topic)
			if err != nil {
				t.Fatal(err)
			}
			fresh = fresh[:0]
			for _, r := range recs {
				if !seen[position{r.Partition, r.Offset}] {
					fresh = append(fresh, r)
				}
			}
			if len(fresh) >= want || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(fresh) != want {
			t.Fatalf("%d new records on %s, want %d", len(fresh), topic, want)
		}
		var out []string
		for _, r := range fresh {
			seen[position{r.Partition, r.Offset}] = true
			key := fmt.Sprintf("%s/%s", r.Key, r.Header("aggregate_version"))
			if r.Header(replay.Header) != "true" || r.Header("tenant") != "acme" || r.Header("id") != ids[key] {
				t.Errorf("record %s: headers %v; want outbox.replay=true, tenant=acme and id %s", key, r.Headers, ids[key])
			}
			out = append(out, key)
		}
		sort.Strings(out)
		return out
	}
	run := func(sel replay.Selection) (replay.Result, error) {
		return replay.Run(ctx, conn, table, sel, s)
	}

	t.Run("by event ids", func(t *testing.T) {
		res, err := run(replay.Selection{EventIDs: []string{ids["o-1/3"], ids["o-2/1"]}})
		if err != nil || res.Published != 2 {
			t.Fatalf("Run = %+v, %v; want 2 published", res, err)
		}
		if got := arrived(t, 2); !slices.Equal(got, []string{"o-1/3", "o-2/1"}) {
			t.Fatalf("arrived %v", got)
		}
	})
	t.Run("by aggregate and version range, in version order", func(t *testing.T) {
		res, err := run(replay.Selection{AggregateType: aggType, AggregateID: "o-1", FromVersion: 2, ToVersion: 3})
		if err != nil || res.Published != 2 {
			t.Fatalf("Run = %+v, %v; want 2 published", res, err)
		}
		if got := arrived(t, 2); !slices.Equal(got, []string{"o-1/2", "o-1/3"}) {
			t.Fatalf("arrived %v", got)
		}
	})
	t.Run("by time: the week-old events only", func(t *testing.T) {
		res, err := run(replay.Selection{Since: weekAgo.Add(-time.Minute), Until: weekAgo.Add(time.Minute)})
		if err != nil || res.Published != 2 {
			t.Fatalf("Run = %+v, %v; want 2 published", res, err)
		}
		if got := arrived(t, 2); !slices.Equal(got, []string{"o-1/1", "o-1/2"}) {
			t.Fatalf("arrived %v", got)
		}
	})
	t.Run("a dry run publishes nothing", func(t *testing.T) {
		res, err := run(replay.Selection{AggregateType: aggType, AggregateID: "o-2", DryRun: true})
		if err != nil || res.Selected != 2 || res.Published != 0 {
			t.Fatalf("Run = %+v, %v; want 2 selected, none published", res, err)
		}
	})

	// Pruning takes o-1's week-old versions 1 and 2.
	if _, err := conn.Exec(ctx, "DELETE FROM outbox_events WHERE created_at < now() - interval '1 day'"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		sel  replay.Selection
		want string
	}{
		{"an aggregate whose first versions were pruned", replay.Selection{AggregateType: aggType, AggregateID: "o-1"}, "versions 1..2 of aggregate"},
		{"a version range reaching into the pruned ones", replay.Selection{AggregateType: aggType, AggregateID: "o-1", FromVersion: 2}, "versions 2 of aggregate"},
		{"a version range beyond the newest", replay.Selection{AggregateType: aggType, AggregateID: "o-1", FromVersion: 3, ToVersion: 6}, "versions 5..6"},
		{"an aggregate with no events", replay.Selection{AggregateType: aggType, AggregateID: "o-9"}, "versions 1 and later"},
		{"an id that was pruned", replay.Selection{EventIDs: []string{ids["o-1/4"], ids["o-1/1"]}}, "1 of 2 events are not in"},
		{"a time range that starts before the oldest row", replay.Selection{Since: weekAgo}, "rows in the range may have been pruned"},
	} {
		t.Run("refused: "+c.name, func(t *testing.T) {
			res, err := run(c.sel)
			if !errors.Is(err, replay.ErrRefused) || !strings.Contains(err.Error(), c.want) || res.Published != 0 {
				t.Fatalf("Run = %+v, %v; want a refusal saying %q and nothing published", res, err, c.want)
			}
		})
	}
	t.Run("what is left of a pruned selection goes with Partial", func(t *testing.T) {
		res, err := run(replay.Selection{AggregateType: aggType, AggregateID: "o-1", Partial: true})
		if err != nil || res.Published != 2 {
			t.Fatalf("Run = %+v, %v; want 2 published", res, err)
		}
		if got := arrived(t, 2); !slices.Equal(got, []string{"o-1/3", "o-1/4"}) {
			t.Fatalf("arrived %v", got)
		}
	})
	t.Run("a selection that mixes kinds is an error", func(t *testing.T) {
		if _, err := run(replay.Selection{EventIDs: []string{"x"}, AggregateType: aggType, AggregateID: "o-1"}); err == nil || errors.Is(err, replay.ErrRefused) {
			t.Fatalf("err = %v, want a usage error", err)
		}
	})
}
