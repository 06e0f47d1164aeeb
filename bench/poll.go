package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// pollReady prepares the table for a polling side: its migration (once), the NOTIFY trigger on,
// and every row marked pending for a drain (the backlog) or processed for a steady state (so the
// poller starts with nothing to do). The trigger is dropped again after each poll side
// (pollTrigger), so the WAL sides' writers never pay for its NOTIFY.
//
// Every drain marks every row pending by an UPDATE and vacuums, also the first one (the migration
// leaves the rows pending without writing them), so that poll and poll-standby drain a table in
// the same state whichever runs first: not one just written by the backlog for the first and one
// updated by a drain and vacuumed for the second.
//
// The cluster runs without autovacuum (pgSettings: the WAL sides only insert). A poller updates
// every row it publishes, and each update leaves a dead entry in the pending index that every
// claim walks past until a vacuum removes it. The steady state therefore starts from a vacuumed
// and analyzed table, as autovacuum leaves a queue drained a while ago: otherwise it would pay for
// the dead entries of the drain before it and of the bulk mark below, which are the benchmark's
// doing. The statistics then describe an empty queue, the planner's usual view of a healthy one,
// which the claim must survive once a backlog builds (poll's plan test).
func (b *bench) pollReady(ctx context.Context, processed bool) error {
	conn, err := pgx.Connect(ctx, b.svc.DSN)
	if err != nil {
		return fmt.Errorf("poll side: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := migrations.ApplyPoll(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
		return fmt.Errorf("poll side: migrate: %w", err)
	}
	mark, what := "UPDATE public.outbox_events SET processed_at = now() WHERE processed_at IS NULL", "processed"
	if !processed {
		mark, what = "UPDATE public.outbox_events SET processed_at = NULL", "pending"
	}
	if _, err := conn.Exec(ctx, mark); err != nil {
		return fmt.Errorf("poll side: mark the table %s: %w", what, err)
	}
	if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) public.outbox_events"); err != nil {
		return fmt.Errorf("poll side: vacuum: %w", err)
	}
	return b.pollTrigger(ctx, true)
}

// pollTrigger creates or drops the polling migration's NOTIFY trigger.
func (b *bench) pollTrigger(ctx context.Context, on bool) error {
	sql := "DROP TRIGGER IF EXISTS outbox_relay_notify ON public.outbox_events"
	if on {
		sql += "; CREATE TRIGGER outbox_relay_notify AFTER INSERT ON public.outbox_events FOR EACH STATEMENT EXECUTE FUNCTION public.outbox_events_notify()"
	}
	if _, err := b.pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("poll side: trigger: %w", err)
	}
	return nil
}
