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

// keys are the configuration keys each subcommand uses: its --help lists those (the flags of the
// others are accepted, so that one command line or file serves every command). run uses every key.
var keys = func() map[string][]string {
	pg := []string{"pg_dsn", "pg_password_file"}
	kafkaConn := []string{"kafka_brokers", "kafka.client_id", "kafka.write_timeout",
		"kafka.tls.enabled", "kafka.tls.ca_file", "kafka.tls.cert_file", "kafka.tls.key_file", "kafka.tls.insecure_skip_verify",
		"kafka.sasl.mechanism", "kafka.sasl.username", "kafka.sasl.password", "kafka.sasl.password_file"}
	cat := func(lists ...[]string) []string {
		var out []string
		for _, l := range lists {
			out = append(out, l...)
		}
		return out
	}
	of := func(groups ...config.Group) []string { return config.KeyNames(config.Keys(groups...)) }
	columns := []string{"profile", "table", "columns.id", "columns.aggregate_type", "columns.aggregate_id",
		"columns.event_type", "columns.payload", "columns.headers", "columns.aggregate_version", "columns.created_at",
		"columns.timestamp", "columns.tracing_span_context", "outbox_shape"}
	return map[string][]string{
		"migrate":     cat(pg, []string{"table", "publication", "source", "outbox_shape"}),
		"forget-slot": cat(pg, []string{"slot", "table"}),
		"status": cat(pg, []string{"slot", "source", "failover", "delivery", "transactional_id", "positions_topic"},
			columns, kafkaConn),
		"prune": cat(pg, []string{"table", "columns.created_at", "outbox_shape", "source", "slot", "on_slot_lost",
			"slot_recovery_margin", "prune_older_than", "prune_batch_size"}),
		"retry": cat(pg, columns, []string{"source"}),
		"replay": cat(pg, columns, []string{"backfill_order_column"}, of(config.GroupKafka, config.GroupRouting),
			[]string{"on_failure", "dead_letter_topic", "max_in_flight_events", "max_in_flight_bytes", "max_message_bytes",
				"shutdown_timeout", "log_level", "log_format"}),
		// The routing and the positions topic: a dead letter goes where the relay would route it
		// now, never to a topic outbox rows may not reach.
		// The encodings and the registry: a dead letter goes back framed as the relay frames.
		"redrive": cat(kafkaConn, []string{"profile", "dead_letter_topic", "builtin_headers", "key_encoding", "value_encoding", "positions_topic",
			"topic_template", "topic_regex", "topic_replacement", "topic_regex_passthrough", "topic_allow", "topic_deny"}, config.RegistryKeys()),
	}
}()

// about says what each subcommand does, at the top of its --help.
var about = map[string]string{
	"run":         "Streams outbox events to Kafka until SIGTERM or SIGINT.",
	"migrate":     "Creates the outbox table, the publication and the relay's own tables (idempotent); with --source=poll, the polling mode's columns instead of a publication.",
	"status":      "Shows the replication slot at a glance: lag, retained WAL, the last position Kafka acknowledged, recoveries (exit 3: the slot is missing or lost).",
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
	loader := config.NewLoader(fs, nil, keys[name]...)
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
