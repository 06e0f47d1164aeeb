package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/replication"
)

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig("migrate", args, stderr)
	if err != nil {
		return err
	}
	scrub := func(err error) error { return errors.New(config.Scrub(err.Error(), cfg.Secrets()...)) }
	conn, err := pgx.Connect(ctx, cfg.PGDSN)
	if err != nil {
		return scrub(fmt.Errorf("connect to PostgreSQL: %w", err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	applied, err := migrations.Apply(ctx, conn, migrations.Target{Schema: cfg.Schema, Table: cfg.Table})
	for _, name := range applied {
		fmt.Fprintf(stdout, "applied %s\n", name)
	}
	if err != nil {
		return scrub(err)
	}
	if err := replication.EnsurePublication(ctx, conn, cfg.Publication, cfg.Schema, cfg.Table, true); err != nil {
		return scrub(err)
	}
	fmt.Fprintf(stdout, "outbox table %s.%s and publication %s are ready\n", cfg.Schema, cfg.Table, cfg.Publication)
	return nil
}
