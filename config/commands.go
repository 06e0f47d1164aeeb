package config

import "slices"

// The table the configuration reference is generated from (docs/configuration.md, `make docs`).
//go:generate go run ../internal/cmd/configdoc -o ../docs/configuration.md

// commands are the subcommands that read configuration, in the order the reference lists them.
var commands = []string{"run", "migrate", "status", "forget-slot", "prune", "replay", "redrive", "retry"}

// commandKeys are the keys each subcommand uses: its --help lists those (the flags of the others
// are accepted, so that one command line or file serves every command). run uses every key, so it
// has no list.
var commandKeys = func() map[string][]string {
	pg := []string{"pg_dsn", "pg_password_file"}
	kafkaConn := []string{"kafka_brokers", "kafka.client_id", "kafka.write_timeout",
		"kafka.tls.enabled", "kafka.tls.ca_file", "kafka.tls.cert_file", "kafka.tls.key_file", "kafka.tls.insecure_skip_verify",
		"kafka.sasl.mechanism", "kafka.sasl.username", "kafka.sasl.password", "kafka.sasl.password_file",
		"kafka.sasl.oauthbearer.token_file", "kafka.sasl.oauthbearer.token_endpoint_url", "kafka.sasl.oauthbearer.client_id",
		"kafka.sasl.oauthbearer.client_secret_file", "kafka.sasl.oauthbearer.scope"}
	cat := func(lists ...[]string) []string {
		var out []string
		for _, l := range lists {
			out = append(out, l...)
		}
		return out
	}
	of := func(in ...Group) []string {
		var out []string
		for _, s := range settings {
			if slices.Contains(in, s.group) {
				out = append(out, s.key)
			}
		}
		return out
	}
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
		"replay": cat(pg, columns, []string{"backfill_order_column"}, of(GroupKafka, GroupRouting),
			[]string{"on_failure", "dead_letter_topic", "max_in_flight_events", "max_in_flight_bytes", "max_message_bytes",
				"shutdown_timeout", "log_level", "log_format"}),
		// The routing and the positions topic: a dead letter goes where the relay would route it
		// now, never to a topic outbox rows may not reach.
		// The encodings and the registry: a dead letter goes back framed as the relay frames.
		"redrive": cat(kafkaConn, []string{"profile", "dead_letter_topic", "builtin_headers", "key_encoding", "value_encoding", "positions_topic",
			"topic_template", "topic_regex", "topic_replacement", "topic_regex_passthrough", "topic_allow", "topic_deny"}, RegistryKeys()),
	}
}()

// Commands is the subcommands that read configuration, in the order the reference lists them.
func Commands() []string { return slices.Clone(commands) }

// CommandKeys is the keys the subcommand uses, for NewLoader: none (every key) for run and for a
// command that has no list.
func CommandKeys(command string) []string { return commandKeys[command] }

// usedBy is the subcommands that use key, in the order of commands.
func usedBy(key string) []string {
	var out []string
	for _, c := range commands {
		if list, ok := commandKeys[c]; !ok || slices.Contains(list, key) {
			out = append(out, c)
		}
	}
	return out
}

// Groups is the groups in the order help lists them.
func Groups() []Group { return slices.Clone(groups) }
