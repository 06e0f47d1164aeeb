package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/poll"
)

// runRetry is the polling mode's manual retry path: it makes rows pending again (attempts and
// backoff reset, processed_at cleared) by event id, all dead letters, or either narrowed to a
// creation-time range, and prints how many rows it reset.
func runRetry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, loader := newFlags("retry", stderr)
	ids := fs.String("ids", "", "comma-separated event ids to publish again (any state: a dead letter, a pending row in backoff, or a row already published)")
	dead := fs.Bool("dead-letters", false, "every row in the dead-letter view")
	since := fs.String("since", "", "only rows created at or after this RFC 3339 time, or this long ago (e.g. 24h)")
	until := fs.String("until", "", "only rows created before this RFC 3339 time, or this long ago (e.g. 1h)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sel := poll.Selection{DeadLetters: *dead}
	for _, id := range strings.Split(*ids, ",") {
		if id = strings.TrimSpace(id); id != "" {
			sel.IDs = append(sel.IDs, id)
		}
	}
	if len(sel.IDs) == 0 && !sel.DeadLetters {
		fmt.Fprintln(stderr, "outbox-relay retry: say which rows: --ids=ID,... or --dead-letters (either narrowed by --since/--until)")
		return errUsage
	}
	now := time.Now()
	var err error
	if sel.Since, err = pointInTime(*since, now); err != nil {
		fmt.Fprintf(stderr, "outbox-relay retry: --since: %v\n", err)
		return errUsage
	}
	if sel.Until, err = pointInTime(*until, now); err != nil {
		fmt.Fprintf(stderr, "outbox-relay retry: --until: %v\n", err)
		return errUsage
	}
	cfg, err := loader.Load()
	if err != nil {
		return err
	}
	if cfg.Source != "poll" {
		fmt.Fprintln(stderr, "outbox-relay retry: retry resets rows of the polling mode; set source: poll (OUTBOX_SOURCE=poll or --source=poll). In the WAL mode events are not retried from the table: dead letters are in the dead-letter topic")
		return errUsage
	}
	conn, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n, err := poll.Retry(ctx, conn, poll.Config{Schema: cfg.Schema, Table: cfg.Table, CreatedColumn: cfg.Columns.CreatedAt,
		Columns: eventColumns(cfg)}, sel)
	if err != nil {
		return scrubbed(cfg, err)
	}
	fmt.Fprintf(stdout, "reset %d rows of %s.%s: pending again, published by the next claim\n", n, cfg.Schema, cfg.Table)
	return nil
}

// pointInTime reads an RFC 3339 time or a duration before now; empty is the zero time.
func pointInTime(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (24h), got %q", v)
}
