package poll

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// TestTheClaimReadsTheQueueHeadThroughTheIndexWhateverTheStatistics: the claim's plan must stay
// cheap in a backlog whatever the statistics last said about the queue. Three situations mislead
// the planner:
//   - no statistics since the migration's new index: the planner would fetch every pending row
//     and sort them for each claim, instead of reading the head of the pending index in order
//     (measured: a second against a millisecond per claim for 200,000 pending rows; bench/ has
//     the numbers);
//   - statistics taken while the queue was empty, which is what autovacuum sees on a healthy
//     queue most of the time: the planner expects one pending row and joins the pending rows
//     against the claimed ones in a nested loop, every pending row compared with every claimed
//     one (measured: 318 ms against 3 ms per claim for 2,000 pending rows, and it grows with the
//     backlog, so a relay that falls behind never catches up);
//   - statistics taken while a backlog drains: the planner expects a fifth of the table up to the
//     batch's last seq (it cannot know the pending rows are all at the table's end) and verifies
//     each batch with a sequential scan of the whole table and a sort (measured: 1.2 s per batch
//     on a table of 1,000,000 rows).
//
// A plan's shape, not a timing: the candidate list must come from the pending index in order (no
// sort, no bitmap scan), the claimed rows must be fetched by an index lookup of their seqs, never
// by a join filter, and the verification must read the pending index in order too.
func TestTheClaimReadsTheQueueHeadThroughTheIndexWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	insert := func(n int) string {
		return `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
			SELECT 't', 'a' || (i % 1000), 'E', '{}' FROM generate_series(1, ` + strconv.Itoa(n) + `) i`
	}
	for _, tc := range []struct {
		name string
		// beforePoll runs before the polling migration, afterPoll after it.
		beforePoll, afterPoll []string
	}{
		{name: "no statistics since the pending index", beforePoll: []string{insert(50000)}},
		{name: "statistics of an empty queue, then a backlog", afterPoll: []string{
			insert(50000), "UPDATE outbox_events SET processed_at = now()", "ANALYZE outbox_events", insert(20000),
		}},
		{name: "statistics of a backlog being drained", afterPoll: []string{
			insert(100000), "UPDATE outbox_events SET processed_at = now() WHERE seq <= (SELECT min(seq) + 70000 FROM outbox_events)",
			"ANALYZE outbox_events",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
			if err != nil {
				t.Fatal(err)
			}
			conn, err := connect(ctx, dsn, "")
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			exec := func(stmts []string) {
				t.Helper()
				for _, s := range stmts {
					if _, err := conn.Exec(ctx, s); err != nil {
						t.Fatalf("%s: %v", s, err)
					}
				}
			}
			target := migrations.Target{Schema: "public", Table: "outbox_events"}
			if _, err := migrations.Apply(ctx, conn, target); err != nil {
				t.Fatal(err)
			}
			exec(tc.beforePoll)
			if _, err := migrations.ApplyPoll(ctx, conn, target); err != nil {
				t.Fatal(err)
			}
			exec(tc.afterPoll)
			cfg := Config{}
			cfg.setDefaults()
			q := newQueries(cfg)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			explain := func(sql string, args ...any) string {
				t.Helper()
				rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
				if err != nil {
					t.Fatal(err)
				}
				lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				return strings.Join(lines, "\n")
			}

			plan := explain(q.claimSQL, 800, 200, int64(math.MinInt64))
			cand, _, _ := strings.Cut(plan, "CTE mine")
			if !strings.Contains(cand, "Index Scan using outbox_events_pending_idx") || strings.Contains(cand, "Sort") || strings.Contains(cand, "Bitmap") {
				t.Fatalf("the claim's candidate list is not read in index order:\n%s", plan)
			}
			if !strings.Contains(plan, "Index Cond: (seq = ") || strings.Contains(plan, "Join Filter") {
				t.Fatalf("the claimed rows are not fetched by their seqs:\n%s", plan)
			}

			// A window that gave nothing is measured the same way, to look past it.
			plan = explain(q.windowSQL, int64(math.MinInt64), 800)
			if !strings.Contains(plan, "Index Scan using outbox_events_pending_idx") || strings.Contains(plan, "Sort") || strings.Contains(plan, "Seq Scan") {
				t.Fatalf("the claim's window is not read in index order:\n%s", plan)
			}

			// The verification after the locks reads the pending rows up to the batch's last seq.
			var last int64
			if err := tx.QueryRow(ctx, "SELECT min(seq) + 800 FROM outbox_events WHERE processed_at IS NULL").Scan(&last); err != nil {
				t.Fatal(err)
			}
			plan = explain(q.verifySQL, last)
			if !strings.Contains(plan, "Index Scan using outbox_events_pending_idx") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
				t.Fatalf("the verification does not read the queue's head through the pending index:\n%s", plan)
			}
		})
	}
}
