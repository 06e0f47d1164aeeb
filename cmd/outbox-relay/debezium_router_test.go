//go:build debezium

package main_test

// The relay against Debezium itself: Kafka Connect with Debezium's PostgreSQL connector and outbox
// event router (the jars bench/debezium-lib.sh assembles) and the relay read the same rows through
// slots of their own, each configured with the same option, and every record must come out the
// same: topic, partition, key, value, headers and timestamp, byte for byte where the relay promises
// bytes. `make test-debezium` runs it (a JVM start costs more than make test's budget allows);
// the records Debezium gave here are the golden records of the router tests in make test.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/dbz"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// routerTable has a column for every option: a second, text payload for the tombstone case, a
// timestamp, envelope, header and partition columns.
const routerTable = `CREATE TABLE %s (
	id            uuid         NOT NULL PRIMARY KEY,
	aggregatetype varchar(255) NOT NULL,
	aggregateid   varchar(255) NOT NULL,
	type          varchar(255) NOT NULL,
	payload       jsonb,
	textpayload   text,
	ts            timestamp,
	tenant        text,
	amount        int,
	flag          boolean,
	partitionno   int
)`

// routerCase is one option (or set of options) on both sides.
type routerCase struct {
	name string
	smt  map[string]string // connector properties beyond the router's basics, e.g. transforms.outbox.*
	args []string          // relay flags beyond the Debezium profile
	// compare says how values are compared: "bytes" exactly, "json" as JSON documents (the relay
	// sends PostgreSQL's jsonb text where Jackson re-serialises).
	compare string
	// timestamps: compare record timestamps (for rows whose ts is set).
	timestamps bool
	// noTopArray leaves out the row whose payload is a JSON array: with table.expand.json.payload,
	// Debezium 3.6 fails the task on it (it infers the array's schema, fails to make a struct of
	// it, and the record's schema and value no longer match).
	noTopArray bool
}

func TestDebeziumRouterOptionsGiveDebeziumsRecords(t *testing.T) {
	lib := dbz.Lib()
	if err := dbz.LibReady(lib); err != nil {
		t.Fatal(err) // make test-debezium assembles the jars first
	}
	f := newDbzFixture(t)
	ctx := context.Background()
	k := testenv.SharedKafka(t)
	cases := []routerCase{
		{name: "timestamp", compare: "bytes", timestamps: true,
			smt:  map[string]string{"transforms.outbox.table.field.event.timestamp": "ts"},
			args: []string{"--columns.timestamp=ts"}},
		{name: "tombstone", compare: "bytes",
			smt:  map[string]string{"transforms.outbox.route.tombstone.on.empty.payload": "true", "transforms.outbox.table.field.event.payload": "textpayload"},
			args: []string{"--tombstone-on-empty-payload=true", "--columns.payload=textpayload"}},
		{name: "notombstone", compare: "bytes",
			smt:  map[string]string{"transforms.outbox.table.field.event.payload": "textpayload"},
			args: []string{"--columns.payload=textpayload"}},
		{name: "envelope", compare: "bytes",
			smt: map[string]string{
				"transforms.outbox.table.fields.additional.placement": "type:envelope:eventType,amount:envelope,flag:envelope,tenant:header,partitionno:partition",
				"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false",
			},
			args: []string{"--value-encoding=json-string", "--extra-fields=type:envelope:eventType,amount:envelope,flag:envelope,tenant:header,partitionno:partition"}},
		{name: "jsonstring", compare: "bytes",
			smt:  map[string]string{"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false"},
			args: []string{"--value-encoding=json-string"}},
		{name: "expanded", compare: "bytes", noTopArray: true,
			smt: map[string]string{
				"transforms.outbox.table.expand.json.payload": "true",
				"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false",
			},
			args: []string{"--value-encoding=json-expanded"}},
		{name: "envelopeexpanded", compare: "bytes", noTopArray: true,
			smt: map[string]string{
				"transforms.outbox.table.fields.additional.placement": "type:envelope:eventType,amount:envelope",
				"transforms.outbox.table.expand.json.payload":         "true",
				"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false",
			},
			args: []string{"--extra-fields=type:envelope:eventType,amount:envelope"}},
		{name: "withschema", compare: "bytes", noTopArray: true,
			smt: map[string]string{
				"transforms.outbox.table.expand.json.payload": "true",
				"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "true",
				"key.converter": "org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable": "true",
			},
			args: []string{"--value-encoding=json-with-schema", "--key-encoding=json-with-schema"}},
	}
	// The regex case routes to topics of its own making, so it is set up apart below.
	regex := routerCase{name: "regex", compare: "bytes",
		smt: map[string]string{
			"transforms.outbox.route.topic.regex":       `(?<routedByValue>[a-z0-9]+)_(?<kind>[a-z]+)`,
			"transforms.outbox.route.topic.replacement": "SIDE.${routedByValue}.x.${kind}",
		}}

	run := fmt.Sprintf("r%08x", time.Now().UnixNano()&0xffffffff) // short: slot names hold 63 characters
	typ := func(c, side string) string { return run + "_" + c + "_" + side }
	// The aggregate types: one per case, and for the regex case a matching and a non-matching one
	// whose topics the test knows.
	regexMatch := strings.ToLower(strings.ReplaceAll(run, "_", "")) + "_kind"
	regexOther := "NoMatch" + strings.ReplaceAll(run, "_", "")
	var connectors []map[string]string
	var relays []*relayproc.Proc
	topics := map[string][]string{} // case -> Debezium's topic, the relay's
	// Each case has a table, a publication and two slots of its own, so that each side of a case
	// reads only that case's rows.
	for _, c := range append(slices.Clone(cases), regex) {
		table, pub := "outbox_"+c.name, "pub_"+c.name+"_"+run
		f.exec(fmt.Sprintf(routerTable, table))
		f.exec(fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", pub, table))
		dslot, rslot := "dbz_"+c.name+"_"+run, "rly_"+c.name+"_"+run
		aggType := typ(c.name, "x")
		dtopic, rtopic := "dbz."+aggType, "rly."+aggType
		replacement := "dbz.${routedByValue}"
		relayArgs := append([]string{"--profile=debezium", "--table=public." + table, "--publication=" + pub, "--create-publication=false",
			"--topic-template=rly.{aggregate_type}"}, c.args...)
		if c.name == "regex" {
			replacement = "dbz" + strings.TrimPrefix(c.smt["transforms.outbox.route.topic.replacement"], "SIDE")
			relayArgs = []string{"--profile=debezium", "--table=public." + table, "--publication=" + pub, "--create-publication=false",
				"--topic-regex=" + c.smt["transforms.outbox.route.topic.regex"],
				"--topic-replacement=rly" + strings.TrimPrefix(c.smt["transforms.outbox.route.topic.replacement"], "SIDE"),
				// Debezium's fall-through, which the relay takes only on request and within an allowlist.
				"--topic-regex-passthrough=true", "--topic-allow=rly.*," + regexOther}
		} else {
			for _, tp := range []string{dtopic, rtopic} {
				if err := k.CreateTopic(ctx, tp, 4); err != nil {
					t.Fatal(err)
				}
			}
		}
		topics[c.name] = []string{dtopic, rtopic}
		f.exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", dslot)
		f.exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", rslot)
		conn := connectorProps(t, f.dsn, "c_"+c.name+"_"+run, dslot, pub, "public."+table, replacement, c.smt)
		conn["transforms.outbox.route.topic.replacement"] = replacement
		connectors = append(connectors, conn)
		relays = append(relays, f.relay(rslot, append(relayArgs, "--create-slot=false")...))
	}
	for _, side := range []string{"dbz", "rly"} {
		for _, tp := range []string{side + "." + regexMatch[:strings.Index(regexMatch, "_")] + ".x.kind", regexOther} {
			if err := k.CreateTopic(ctx, tp, 4); err != nil && !strings.Contains(err.Error(), "exists") {
				t.Fatal(err)
			}
		}
	}
	worker := startConnect(t, lib, f.brokers, connectors)
	defer worker.stop()
	waitSlots(t, f, worker, "dbz_%_"+run)

	// The rows: each case's aggregate type, and the regex case's two.
	n := 0
	write := func(table, aggType string, rows ...string) {
		for _, r := range rows {
			n++
			id := fmt.Sprintf("%08d-0000-4000-8000-000000000000", n)
			f.exec(fmt.Sprintf(`INSERT INTO %[1]s (id, aggregatetype, aggregateid, type, payload, textpayload, ts, tenant, amount, flag, partitionno)
				SELECT $1, $2, r.aggregateid, r.type, r.payload, r.textpayload, r.ts, r.tenant, r.amount, r.flag, r.partitionno
				FROM json_populate_record(NULL::%[1]s, $3::json) r`, table), id, aggType, r)
		}
	}
	rows := []string{
		`{"aggregateid": "o-1", "type": "Created", "payload": {"id": 1, "total": 42.00, "items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}], "note": null, "tags": []},
		  "textpayload": "x", "ts": "2026-01-02T03:04:05.678901", "tenant": "acme", "amount": 7, "flag": true, "partitionno": 2}`,
		`{"aggregateid": "o-1", "type": "Paid", "payload": null, "textpayload": "", "tenant": null, "amount": null, "flag": false, "partitionno": null}`,
		`{"aggregateid": "o-2", "type": "Shipped", "payload": [1, 2, 3], "textpayload": "   ", "ts": "1999-12-31T23:59:59.999", "partitionno": 0}`,
		`{"aggregateid": "o-3", "type": "Odd", "payload": {"mixed": [1, "a"], "big": 12345678901, "f": 1e-7, "t": true, "s": "grüße \"q\" <&>"}, "textpayload": "  y  ", "ts": "2026-06-01T00:00:00", "partitionno": 3}`,
		`{"aggregateid": "o-4", "type": "Scalar", "payload": "just a string", "textpayload": null, "amount": -5, "partitionno": 1}`,
		`{"aggregateid": "o-5", "type": "Nested", "payload": {"a": {"b": {"c": [{"d": 1.5}, {"d": 2.5, "e": "x"}]}}, "empty": {}}, "partitionno": 1}`,
	}
	caseRows := func(c routerCase) []string {
		if c.noTopArray {
			return slices.Concat(rows[:2], rows[3:])
		}
		return rows
	}
	for _, c := range cases {
		write("outbox_"+c.name, typ(c.name, "x"), caseRows(c)...)
	}
	write("outbox_regex", regexMatch, rows[:2]...)
	write("outbox_regex", regexOther, rows[:2]...)

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := len(caseRows(c))
			dbzRecs := readTopic(t, f.brokers, topics[c.name][0], want)
			rlyRecs := readTopic(t, f.brokers, topics[c.name][1], want)
			compareSides(t, c, dbzRecs, rlyRecs)
		})
	}
	t.Run("regex", func(t *testing.T) {
		prefix := regexMatch[:strings.Index(regexMatch, "_")]
		compareSides(t, regex, readTopic(t, f.brokers, "dbz."+prefix+".x.kind", 2), readTopic(t, f.brokers, "rly."+prefix+".x.kind", 2))
		// A type the expression does not match keeps its name as the topic on both sides.
		both := readTopic(t, f.brokers, regexOther, 4)
		if len(both) != 4 {
			t.Fatalf("topic %s holds %d records, want 2 from each side", regexOther, len(both))
		}
	})
	for _, p := range relays {
		f.stop(p)
	}
	if t.Failed() {
		t.Logf("Kafka Connect log:\n%s", worker.tail())
	}
}

// connectorProps is a Debezium PostgreSQL connector with the outbox event router on slot,
// routing to replacement, plus extra (which may override the converters).
func connectorProps(t *testing.T, dsn, name, slot, publication, table, replacement string, extra map[string]string) map[string]string {
	t.Helper()
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := map[string]string{
		"name": name, "connector.class": "io.debezium.connector.postgresql.PostgresConnector", "tasks.max": "1",
		"plugin.name": "pgoutput", "database.hostname": pc.Host, "database.port": fmt.Sprint(pc.Port),
		"database.user": pc.User, "database.password": pc.Password, "database.dbname": pc.Database,
		"topic.prefix": name, "slot.name": slot, "publication.name": publication, "publication.autocreate.mode": "disabled",
		"table.include.list": table, "snapshot.mode": "no_data", "tombstones.on.delete": "false",
		"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter",
		"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.route.topic.replacement": replacement,
	}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

type connectWorker struct {
	port int // the REST API's, on 127.0.0.1
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// tail is the log's errors and warnings and its last lines; the whole log is kept in
// $OUTBOX_DEBEZIUM_LOG when set.
func (w *connectWorker) tail() string {
	b, _ := os.ReadFile(w.log)
	if keep := os.Getenv("OUTBOX_DEBEZIUM_LOG"); keep != "" {
		_ = os.WriteFile(keep, b, 0o644)
	}
	lines := strings.Split(string(b), "\n")
	var out []string
	for i, l := range lines {
		if strings.Contains(l, " ERROR ") || strings.Contains(l, " WARN ") || strings.Contains(l, "Exception") || i >= len(lines)-30 {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (w *connectWorker) stop() {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
	}
}

// startConnect runs a standalone Connect worker with the connectors.
func startConnect(t *testing.T, lib, brokers string, connectors []map[string]string) *connectWorker {
	t.Helper()
	dir := t.TempDir()
	port := freePort(t)
	worker := map[string]string{
		"bootstrap.servers": brokers, "offset.storage.file.filename": filepath.Join(dir, "offsets"),
		"offset.flush.interval.ms": "1000", "listeners": fmt.Sprintf("http://127.0.0.1:%d", port),
		"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter",
		"plugin.discovery": "service_load",
	}
	args := dbz.JVMArgs(lib)
	files := []string{filepath.Join(dir, "worker.properties")}
	if err := os.WriteFile(files[0], []byte(dbz.RenderProperties(worker)), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, c := range connectors {
		file := filepath.Join(dir, fmt.Sprintf("connector%d.properties", i))
		if err := os.WriteFile(file, []byte(dbz.RenderProperties(c)), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, file)
	}
	w := &connectWorker{port: port, log: filepath.Join(dir, "connect.log"), done: make(chan struct{})}
	logf, err := os.Create(w.log)
	if err != nil {
		t.Fatal(err)
	}
	w.cmd = exec.Command("java", append(args, files...)...)
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	waited, err := devenv.StartPinned(w.cmd) // the death signal follows the forking thread
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-waited; logf.Close(); close(w.done) }()
	t.Cleanup(w.stop)
	return w
}

// waitSlots waits until every slot LIKE pattern is streamed by its connector.
func waitSlots(t *testing.T, f *dbzFixture, w *connectWorker, pattern string) {
	t.Helper()
	await.State(t, 4*time.Minute, "the connectors to stream their slots", func() (bool, string) {
		select {
		case <-w.done:
			t.Fatalf("Kafka Connect exited:\n%s", w.tail())
		default:
		}
		var idle int
		if err := f.pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1 AND NOT active", pattern).Scan(&idle); err != nil {
			return false, err.Error()
		}
		return idle == 0, fmt.Sprintf("%d slots not streamed; Kafka Connect's log is %s", idle, w.log)
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	ports, err := devenv.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

func readTopic(t *testing.T, brokers, topic string, n int) []harness.Record {
	t.Helper()
	c := harness.NewConsumer(brokers, topic)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := c.ReadUntil(ctx, 2*time.Second, func(recs []harness.Record) bool { return len(recs) >= n })
	if err == nil {
		return c.Records()
	}
	// A consumer stuck on a partition (seen on a loaded machine): read again, independently.
	rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
	defer rcancel()
	recs, rerr := harness.Reread(rctx, brokers, topic)
	if rerr != nil || len(recs) < n {
		t.Fatalf("topic %s: %v; read again: %d records (%v)", topic, err, len(recs), rerr)
	}
	t.Logf("topic %s: the consumer failed (%v); read again independently", topic, err)
	return recs
}

// compareSides matches records by their id header and compares everything but the topic.
func compareSides(t *testing.T, c routerCase, dbzRecs, rlyRecs []harness.Record) {
	t.Helper()
	byID := map[string]harness.Record{}
	for _, r := range dbzRecs {
		byID[r.Header("id")] = r
	}
	if len(dbzRecs) != len(rlyRecs) {
		t.Errorf("Debezium wrote %d records, the relay %d", len(dbzRecs), len(rlyRecs))
	}
	for _, r := range rlyRecs {
		d, ok := byID[r.Header("id")]
		if !ok {
			t.Errorf("record %s of the relay has no Debezium counterpart", r.Header("id"))
			continue
		}
		t.Logf("%s: Debezium key %q value %s headers %v partition %d time %s", r.Header("id"), d.Key, show(d.Value), d.Headers, d.Partition, d.Time.UTC().Format(time.RFC3339Nano))
		if !bytes.Equal(d.Key, r.Key) {
			t.Errorf("%s: key %q, Debezium's %q", r.Header("id"), r.Key, d.Key)
		}
		if (d.Value == nil) != (r.Value == nil) {
			t.Errorf("%s: value %s, Debezium's %s (a tombstone on one side only)", r.Header("id"), show(r.Value), show(d.Value))
		} else if !sameValue(c.compare, d.Value, r.Value) {
			t.Errorf("%s: value\n  %s\nDebezium's\n  %s", r.Header("id"), show(r.Value), show(d.Value))
		}
		if d.Partition != r.Partition {
			t.Errorf("%s: partition %d, Debezium's %d", r.Header("id"), r.Partition, d.Partition)
		}
		// Debezium 3 adds headers about itself (__debezium.context.*); the relay does not.
		for k := range d.Headers {
			if strings.HasPrefix(k, "__debezium.") {
				delete(d.Headers, k)
			}
		}
		if !reflect.DeepEqual(d.Headers, r.Headers) {
			t.Errorf("%s: headers %v, Debezium's %v", r.Header("id"), r.Headers, d.Headers)
		}
		if c.timestamps && d.Time.UnixMilli() != r.Time.UnixMilli() && d.Time.Year() < 2100 {
			// Rows without ts: Debezium stamps its processing time, the relay the commit time.
			if !(d.Time.After(time.Now().Add(-time.Hour)) && r.Time.After(time.Now().Add(-time.Hour))) {
				t.Errorf("%s: timestamp %s, Debezium's %s", r.Header("id"), r.Time.UTC(), d.Time.UTC())
			}
		}
	}
}

func sameValue(how string, a, b []byte) bool {
	if how == "bytes" {
		return bytes.Equal(a, b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(x, y)
}

func show(b []byte) string {
	if b == nil {
		return "null (tombstone)"
	}
	return fmt.Sprintf("%q", b)
}
