package main

import (
	"fmt"
	"maps"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/dbz"
)

// DefaultDebeziumLib is where bench/debezium-lib.sh puts Kafka Connect and the Debezium connector.
func DefaultDebeziumLib() string { return dbz.Lib() }

func debeziumLibReady(lib string) error { return dbz.LibReady(lib) }

// debeziumSetup is one Kafka Connect worker running Debezium's PostgreSQL connector with the
// outbox event router, reading its own slot and writing its own topics: a standalone worker, or
// with ExactlyOnce a distributed one with Connect's exactly-once source support (KIP-618).
type debeziumSetup struct {
	Tuned bool
	// ExactlyOnce runs a distributed worker with exactly.once.source.support=enabled (its config,
	// offsets and status in topics named after Name, its group Name) and asks the connector for
	// exactly.once.support=required: each poll's records and their source offsets are written in
	// one Kafka transaction (transaction.boundary=poll, Connect's default).
	ExactlyOnce bool
	DSN         string // the bench database (host, port, user, password and database are taken from it)
	Brokers     string
	Slot        string
	Publication string
	TopicPrefix string // topics are <TopicPrefix>.<aggregate_type>, as the relay's are
	Name        string // connector name and topic.prefix, unique per run
	OffsetsFile string
	RESTPort    int
}

// tunedProducer is what Debezium users typically change on the Connect producer for throughput:
// Connect's defaults are linger.ms=0, batch.size=16384, no compression, and (for source connectors)
// max.in.flight.requests.per.connection=1 with idempotence off; acks=all stays.
var tunedProducer = map[string]string{
	"producer.override.linger.ms":                             "10",
	"producer.override.batch.size":                            "262144",
	"producer.override.compression.type":                      "lz4",
	"producer.override.enable.idempotence":                    "true",
	"producer.override.max.in.flight.requests.per.connection": "5",
	"producer.override.acks":                                  "all",
}

// tunedConnector raises Debezium's own queue and batch (defaults 8192 and 2048) and polls the
// queue more often than its 500ms default.
var tunedConnector = map[string]string{
	"max.batch.size":   "20480",
	"max.queue.size":   "81920",
	"poll.interval.ms": "50",
}

// properties returns the worker's and the connector's configuration.
func (d debeziumSetup) properties() (worker, connector map[string]string, err error) {
	pc, err := pgconn.ParseConfig(d.DSN)
	if err != nil {
		return nil, nil, fmt.Errorf("debezium: parse the bench DSN: %w", err)
	}
	worker = map[string]string{
		"bootstrap.servers": d.Brokers,
		// jsonb reaches the router as a string: StringConverter writes its text, the same bytes
		// the relay sends, and the aggregate id as the key.
		"key.converter":                           "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":                         "org.apache.kafka.connect.storage.StringConverter",
		"offset.storage.file.filename":            d.OffsetsFile,
		"offset.flush.interval.ms":                "60000",
		"listeners":                               "http://127.0.0.1:" + strconv.Itoa(d.RESTPort),
		"connector.client.config.override.policy": "All",
		// Find plugins through their ServiceLoader manifests instead of scanning every jar: the
		// same plugins, found in a second instead of tens of seconds (Connect suggests it at start).
		"plugin.discovery": "service_load",
	}
	connector = map[string]string{
		"name":                                    d.Name,
		"connector.class":                         "io.debezium.connector.postgresql.PostgresConnector",
		"tasks.max":                               "1",
		"plugin.name":                             "pgoutput",
		"database.hostname":                       pc.Host,
		"database.port":                           strconv.Itoa(int(pc.Port)),
		"database.user":                           pc.User,
		"database.password":                       pc.Password,
		"database.dbname":                         pc.Database,
		"topic.prefix":                            d.Name,
		"slot.name":                               d.Slot,
		"publication.name":                        d.Publication,
		"publication.autocreate.mode":             "disabled", // the publication every side shares exists
		"table.include.list":                      "public.outbox_events",
		"snapshot.mode":                           "no_data",
		"skipped.operations":                      "u,d,t",
		"tombstones.on.delete":                    "false",
		"transforms":                              "outbox",
		"transforms.outbox.type":                  "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.table.field.event.id":  "id",
		"transforms.outbox.table.field.event.key": "aggregate_id",
		"transforms.outbox.table.field.event.payload": "payload",
		"transforms.outbox.route.by.field":            "aggregate_type",
		"transforms.outbox.route.topic.replacement":   d.TopicPrefix + ".${routedByValue}",
		// The relay sends event_type and the headers column's members as headers; these are
		// Debezium's equivalents, so both sides carry the same information.
		"transforms.outbox.table.fields.additional.placement": "event_type:header:eventType,headers:header:headers",
	}
	if d.Tuned {
		maps.Copy(connector, tunedProducer)
		maps.Copy(connector, tunedConnector)
	}
	if d.ExactlyOnce {
		delete(worker, "offset.storage.file.filename")
		delete(worker, "offset.flush.interval.ms") // offsets go in each poll's transaction
		maps.Copy(worker, map[string]string{
			"group.id":                    d.Name,
			"config.storage.topic":        d.Name + ".connect-configs",
			"offset.storage.topic":        d.Name + ".connect-offsets",
			"status.storage.topic":        d.Name + ".connect-status",
			"exactly.once.source.support": "enabled",
			// One broker: the internal topics can have one replica, and need few partitions.
			"config.storage.replication.factor": "1",
			"offset.storage.replication.factor": "1",
			"status.storage.replication.factor": "1",
			"offset.storage.partitions":         "1",
			"status.storage.partitions":         "1",
			"rest.advertised.host.name":         "127.0.0.1",
		})
		connector["exactly.once.support"] = "required"
		connector["transaction.boundary"] = "poll"
	}
	return worker, connector, nil
}

// exactlyOnceFallback is the closest configuration Connect accepts when it refuses
// exactly.once.support=required for the connector: the worker still enables exactly-once source
// support, and "requested" runs the task with transactions without the connector's promise.
const exactlyOnceFallback = "requested"

// renderProperties writes a Java properties file, keys sorted.
func renderProperties(props map[string]string) string { return dbz.RenderProperties(props) }

// connectJVM is how Kafka's connect-standalone.sh (or, distributed, connect-distributed.sh) runs
// the worker.
func connectJVM(lib string, distributed bool) []string {
	if distributed {
		return dbz.DistributedJVMArgs(lib)
	}
	return dbz.JVMArgs(lib)
}
