// Command outbox-relay streams committed outbox INSERTs from PostgreSQL's WAL to Kafka.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `outbox-relay moves transactional outbox events from PostgreSQL to Kafka.

Usage:
  outbox-relay run      [flags]   stream outbox events to Kafka until SIGTERM/SIGINT
  outbox-relay migrate  [flags]   create the outbox table and publication (idempotent); --source=poll: the polling mode's columns instead of a publication
  outbox-relay status   [--json]  the replication slot at a glance (exit 3: slot missing or lost)
  outbox-relay forget-slot         after recovering from a lost slot, let the next run create a new one
  outbox-relay prune    [flags]   delete outbox rows older than --older-than (default 24h), in batches
  outbox-relay replay   [flags]   publish rows still in the outbox table again (by --event-id, aggregate, or --since)
  outbox-relay redrive  [flags]   publish dead-lettered records to their original topics again, once each
  outbox-relay retry    [flags]   source poll: publish rows again (--ids, --dead-letters, --since/--until)
  outbox-relay version            print the version, the commit and the commit's time the binary was built from

Every configuration key has a flag, an OUTBOX_* environment variable and a YAML key
(--config file.yaml); flags win over the environment, which wins over the file. One file serves
every command. "outbox-relay COMMAND -h" lists the command's flags and the keys it uses, by group.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks a command-line mistake (exit status 2).
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run":
		err = runRelay(ctx, rest, stderr)
	case "status":
		return runStatus(ctx, rest, stdout, stderr)
	case "migrate":
		err = runMigrate(ctx, rest, stdout, stderr)
	case "forget-slot":
		err = runForgetSlot(ctx, rest, stdout, stderr)
	case "prune":
		err = runPrune(ctx, rest, stdout, stderr)
	case "replay":
		err = runReplay(ctx, rest, stdout, stderr)
	case "redrive":
		err = runRedrive(ctx, rest, stdout, stderr)
	case "retry":
		err = runRetry(ctx, rest, stdout, stderr)
	case "version", "--version", "-version":
		printVersion(stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "outbox-relay: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.Is(err, errStillFailing):
		fmt.Fprintf(stderr, "outbox-relay: %v\n", err)
		return 3
	}
	fmt.Fprintf(stderr, "outbox-relay: %v\n", err)
	return 1
}
