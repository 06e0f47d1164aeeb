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

// debeziumSetup is one Kafka Connect standalone worker running Debezium's PostgreSQL connector
// with the outbox event router, reading its own slot and writing its own topics.
type debeziumSetup struct {
	Tuned       bool
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
	return worker, connector, nil
}

// renderProperties writes a Java properties file, keys sorted.
func renderProperties(props map[string]string) string { return dbz.RenderProperties(props) }

// connectJVM is how Kafka's connect-standalone.sh runs the worker.
func connectJVM(lib string) []string { return dbz.JVMArgs(lib) }
