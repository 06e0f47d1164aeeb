package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/config"
)

// about says what each subcommand does, at the top of its --help.
var about = map[string]string{
	"run":         "Streams outbox events to Kafka until SIGTERM or SIGINT.",
	"migrate":     "Creates the outbox table, the publication and the relay's own tables (idempotent); with --source=poll, the polling mode's columns instead of a publication.",
	"status":      "Shows the replication slot at a glance: lag, retained WAL, the last position Kafka acknowledged, recoveries (exit 3: the slot is missing or lost). Repeat --config for each shard of a sharded outbox: each is reported, and the exit code is the worst.",
	"forget-slot": "After recovering from a lost slot by hand, lets the next run create a new one.",
	"prune":       "Deletes outbox rows older than --older-than, in batches, keeping what a lost slot's recovery would need.",
	"replay":      "Publishes rows still in the outbox table again (by --event-id, aggregate, or --since), marked outbox.replay=true.",
	"redrive":     "Publishes dead-lettered records to their original topics again, once each across runs.",
	"retry":       "Source poll: makes rows pending again (--ids, --dead-letters, narrowed by --since/--until).",
}

// newFlags is the command line of the subcommand name: its own flags go on the returned set, the
// configuration keys it uses are on the loader. Its errors go to stderr.
func newFlags(name string, stderr io.Writer) (*flag.FlagSet, *config.Loader) {
	fs := flag.NewFlagSet("outbox-relay "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	loader := config.NewLoader(fs, nil, config.CommandKeys(name)...)
	switch name {
	case "run", "replay", "redrive":
	default:
		loader.WithoutKafka()
	}
	if name == "redrive" {
		loader.WithoutPostgres()
	}
	fs.Usage = func() { loader.Usage(fs.Output(), about[name]) }
	return fs, loader
}

// parseFlags parses a subcommand's arguments: flag.ErrHelp for -h, errUsage for a mistake (said
// on fs's output) or a positional argument, which no subcommand takes.
func parseFlags(fs *flag.FlagSet, args []string) error {
	// flag prints a mistake with the whole usage, over a hundred lines for run; one line that
	// points at -h reads better.
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return err
	}
	if err != nil {
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag --" + name
		} else if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
			msg = "--" + name + " needs a value"
		}
		fmt.Fprintf(out, "%s: %s\nRun '%s -h' for its flags.\n", fs.Name(), msg, fs.Name())
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		hint := ""
		if _, err := strconv.ParseBool(fs.Arg(0)); err == nil {
			hint = " (a boolean flag takes its value after =, as in --failover=false)"
		}
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q%s\n", fs.Name(), fs.Arg(0), hint)
		return errUsage
	}
	return nil
}
