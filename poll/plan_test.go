package poll

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// TestTheClaimWalksTheQueueHeadThroughTheIndexWhateverTheStatistics: with statistics from before a
// backlog (here: none since the migration's new index), the planner would fetch every pending row
// and sort them for each claim. On the poller's connections the claim must read the head of the
// pending index in order and stop: no sort and no bitmap scan under the candidate list. (A plan's
// shape, not a timing: measured, the difference was a second against a millisecond per claim for
// 200,000 pending rows; bench/ has the numbers.)
func TestTheClaimWalksTheQueueHeadThroughTheIndexWhateverTheStatistics(t *testing.T) {
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
	target := migrations.Target{Schema: "public", Table: "outbox_events"}
	if _, err := migrations.Apply(ctx, conn, target); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		SELECT 't', 'a' || (i % 1000), 'E', '{}' FROM generate_series(1, 50000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPoll(ctx, conn, target); err != nil {
		t.Fatal(err)
	}
	cfg := Config{}
	cfg.setDefaults()
	q := newQueries(cfg)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, "EXPLAIN "+q.claimSQL, 800, 200)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	cand, _, _ := strings.Cut(plan, "CTE mine")
	if !strings.Contains(cand, "Index Scan using outbox_events_pending_idx") || strings.Contains(cand, "Sort") || strings.Contains(cand, "Bitmap") {
		t.Fatalf("the claim's candidate list is not read in index order:\n%s", plan)
	}
}
