package main

import (
	"context"
	"fmt"
	"io"

	"github.com/outbox-relay/outbox-relay/replication"
)

// runForgetSlot removes a lost slot from the slot ledger, so the next `run` may create a new slot.
// It is the operator's statement that the gap the lost slot left has been dealt with.
func runForgetSlot(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig("forget-slot", args, stderr)
	if err != nil {
		return err
	}
	conn, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	slot, err := replication.ReadSlot(ctx, conn, cfg.Slot)
	if err != nil {
		return scrubbed(cfg, err)
	}
	if slot.Exists {
		return fmt.Errorf("replication slot %q still exists, so there is nothing to forget; to start over, drop it first with SELECT pg_drop_replication_slot('%s')", cfg.Slot, cfg.Slot)
	}
	forgot, err := replication.NewLedger(cfg.Schema).Forget(ctx, conn, cfg.Slot)
	if err != nil {
		return scrubbed(cfg, fmt.Errorf("update %s: %w", replication.LedgerTable, err))
	}
	if !forgot {
		fmt.Fprintf(stdout, "slot %s is not in %s; nothing to do\n", cfg.Slot, replication.LedgerTable)
		return nil
	}
	fmt.Fprintf(stdout, "forgot lost slot %s: the next start creates a new slot from the current position\n", cfg.Slot)
	return nil
}
