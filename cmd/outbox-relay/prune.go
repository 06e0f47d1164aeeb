package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/prune"
	"github.com/outbox-relay/outbox-relay/relay"
)

// runPrune deletes outbox rows older than --older-than (default: prune_older_than) in batches and
// prints how many. Streaming never needs the rows after commit (it reads the WAL), so it may run
// next to a running relay, from cron or a Kubernetes CronJob; what reads the table (a backfill, a
// lost slot's recovery: guardPrune keeps its rows within the margin) is docs/operations.md's.
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, loader := newFlags("prune", stderr)
	olderThan := fs.Duration("older-than", 0, "delete rows created more than this long ago, e.g. 24h or 30m; 0 deletes every committed row (default: prune_older_than)")
	batchSize := fs.Int("batch-size", 0, "rows one DELETE statement removes, at most (default: prune_batch_size)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg, err := loader.Load()
	if err != nil {
		return err
	}
	if !cfg.UsesTable() {
		return errors.New("config key outbox_shape is messages: a logical decoding message is stored nowhere but the WAL, so there is no outbox row to prune")
	}
	opts := prune.Options{
		Table:     cfg.Schema + "." + cfg.Table,
		Column:    cfg.Columns.CreatedAt,
		OlderThan: cfg.PruneOlderThan,
		BatchSize: cfg.PruneBatchSize,
		// source: poll reads the table, so it prunes processed rows only, never pending ones.
		OnlyProcessed: cfg.Source == "poll",
	}
	if set["older-than"] {
		if *olderThan < 0 {
			fmt.Fprintf(stderr, "outbox-relay prune: --older-than must not be negative, got %s\n", *olderThan)
			return errUsage
		}
		opts.OlderThan = *olderThan
	}
	if set["batch-size"] {
		if *batchSize <= 0 {
			fmt.Fprintf(stderr, "outbox-relay prune: --batch-size must be positive, got %d\n", *batchSize)
			return errUsage
		}
		opts.BatchSize = *batchSize
	}

	conn, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	guardPrune(&opts, cfg, conn)
	start := time.Now()
	n, err := prune.Prune(ctx, conn, opts)
	if err != nil {
		return scrubbed(cfg, fmt.Errorf("after deleting %d rows: %w", n, err))
	}
	fmt.Fprintf(stdout, "deleted %d rows created more than %s ago from %s.%s in %s\n",
		n, opts.OlderThan, cfg.Schema, cfg.Table, time.Since(start).Round(time.Millisecond))
	return nil
}

// guardPrune keeps, with the WAL source, the rows a lost slot's recovery could need (the slot
// ledger says from when, and from which transaction id), whatever the age limit says, and records
// what pruning deleted.
func guardPrune(opts *prune.Options, cfg *config.Config, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}) {
	if cfg.Source == "poll" {
		return
	}
	opts.Keep = func(ctx context.Context) (time.Time, bool, error) {
		return relay.KeepFrom(ctx, db, cfg.Schema, cfg.Slot, cfg.SlotRecoveryMargin, cfg.OnSlotLost == "recover")
	}
	opts.KeepXmin = func(ctx context.Context) (uint64, bool, error) {
		return relay.KeepXmin(ctx, db, cfg.Schema, cfg.Slot, cfg.OnSlotLost == "recover")
	}
	opts.Pruned = func(ctx context.Context, before time.Time) error {
		return relay.RecordPruned(ctx, db, cfg.Schema, cfg.Slot, before, cfg.OnSlotLost == "recover")
	}
}
