package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/poll"
)

// pollStatus is `outbox-relay status` with source poll: the table's queue at a glance instead of a
// slot. It exits 3 when dead letters wait under the halt policy or the table is not migrated for
// polling, like a slot problem.
func pollStatus(ctx context.Context, cfg *config.Config, asJSON bool, stdout, stderr io.Writer) int {
	conn, err := connect(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %v\n", err)
		return 1
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := poll.ReadStatus(ctx, conn, poll.Config{Schema: cfg.Schema, Table: cfg.Table, Columns: eventColumns(cfg), CreatedColumn: cfg.Columns.CreatedAt})
	if err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %s\n", config.Scrub(err.Error(), cfg.Secrets()...))
		return 1
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(st)
	} else {
		fmt.Fprintf(stdout, "source:              poll\ntable:               %s\npending rows:        %d\noldest pending:      %.1fs\nin backoff:          %d\ndead letters:        %d (%d still pending)\n",
			st.Table, st.Pending, st.OldestPendingSeconds, st.InBackoff, st.DeadLetters, st.DeadPending)
		for _, p := range st.Problems {
			fmt.Fprintf(stdout, "problem:             %s\n", p)
		}
	}
	if !st.OK {
		return exitSlotProblem
	}
	return 0
}
