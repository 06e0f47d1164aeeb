package main

import (
	"context"
	"fmt"
	"io"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/replication"
)

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig("migrate", args, stderr)
	if err != nil {
		return err
	}
	conn, err := connect(ctx, onPrimary(cfg))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	target := migrations.Target{Schema: cfg.Schema, Table: cfg.Table, NoTable: !cfg.UsesTable()}
	apply := migrations.Apply
	if cfg.Source == "poll" {
		apply = migrations.ApplyPoll
	}
	applied, err := apply(ctx, conn, target)
	for _, name := range applied {
		fmt.Fprintf(stdout, "applied %s\n", name)
	}
	if err != nil {
		return scrubbed(cfg, err)
	}
	if cfg.Source == "poll" {
		// No publication: the polling mode needs no logical replication.
		fmt.Fprintf(stdout, "outbox table %s.%s is ready for source: poll (dead letters: %s.%s)\n",
			cfg.Schema, cfg.Table, cfg.Schema, migrations.DeadLetterView(cfg.Table))
		return nil
	}
	if !cfg.UsesTable() {
		// Messages only: the slot ledger, and a publication for pgoutput to start with.
		if err := replication.EnsureMessagePublication(ctx, conn, cfg.Publication, true); err != nil {
			return scrubbed(cfg, err)
		}
		fmt.Fprintf(stdout, "slot ledger and publication %s are ready (outbox_shape messages: no outbox table)\n", cfg.Publication)
		return nil
	}
	if err := replication.EnsurePublication(ctx, conn, cfg.Publication, cfg.Schema, cfg.Table, true); err != nil {
		return scrubbed(cfg, err)
	}
	fmt.Fprintf(stdout, "outbox table %s.%s and publication %s are ready\n", cfg.Schema, cfg.Table, cfg.Publication)
	return nil
}
