//go:build debezium

package main_test

// The relay's Avro records against Debezium's: Kafka Connect with Debezium's PostgreSQL connector
// and outbox event router, its values and keys written by Apicurio Registry's Avro converter for
// Connect (io.apicurio.registry.utils.converter.AvroConverter, Confluent's wire format), and the
// relay with value_encoding avro and key_encoding avro, both registering in one real registry
// (Apicurio, through its Confluent-compatible API). Each record must come out the same: the
// subject its schema is registered under, the schema after normalisation, and the decoded value;
// where the relay differs by design (docs/migrating-from-debezium.md, "Avro records") the test
// asserts that difference exactly, so that a change on either side shows.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/dbz"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// apicurioAvroConverter is Apicurio's Avro converter for Connect set up as Confluent's AvroConverter
// with auto.register.schemas: the 4-byte Confluent id framing (as-confluent) holding the id the
// Confluent-compatible API serves (the content id), in the record rather than in headers, and
// the schema registered on first use under <topic>-value (<topic>-key for keys). side is
// "key" or "value"; url is the registry's base URL (Apicurio's own API is under it).
func apicurioAvroConverter(side, url string) map[string]string {
	p := side + ".converter"
	return map[string]string{
		p:                                                   "io.apicurio.registry.utils.converter.AvroConverter",
		p + ".apicurio.registry.url":                        url + "/apis/registry/v2",
		p + ".apicurio.registry.auto-register":              "true",
		p + ".apicurio.registry.as-confluent":               "true",
		p + ".apicurio.registry.use-id":                     "contentId",
		p + ".apicurio.registry.headers.enabled":            "false",
		p + ".apicurio.registry.find-latest":                "false",
		p + ".apicurio.registry.artifact-resolver-strategy": "io.apicurio.registry.serde.strategy.TopicIdStrategy",
	}
}

// avroCase is one router setting on both sides.
type avroCase struct {
	name string
	smt  map[string]string // connector properties beyond the converters
	args []string          // relay flags beyond the Debezium profile and the registry's
	rows []avroRow         // written in this order
	// gap, when set, says why the relay has no counterpart to this setting: only Debezium's
	// records are read, and checked against golden.
	gap    string
	golden func(t *testing.T, row string, key, value decoded)
}

// avroRow is one outbox row (a key of avroRows) and how the relay's record compares with
// Debezium's.
type avroRow struct {
	row string
	// widened: the relay's schema is the subject's schema widened to hold this event (package
	// schemas/avro: a subject's inferred schema only grows), where Debezium registers each event's
	// own. Debezium's record read with the relay's schema as the reader (Avro's resolution) must
	// then decode to the relay's value: the relay's schema reads everything Debezium wrote.
	widened bool
	// refused: the registry refuses this event's schema under the subject's rule (BACKWARD).
	// Debezium's task fails on it and writes nothing more; the relay sends it to the dead-letter
	// topic (reason schema_incompatible) and writes the events after it.
	refused bool
}

// avroRows are the outbox rows of the Avro cases: JSON objects with members of every kind, a
// later one with other members (a second version of the subject's schema), numbers that grow
// from int to long, and a NULL payload.
var avroRows = map[string]string{
	"object":  `{"aggregateid": "o-1", "type": "Created", "payload": {"id": 1, "total": 42.5, "big": 12345678901, "ok": true, "name": "grüße \"q\" <&>", "note": null, "tags": [], "items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}], "address": {"city": "Oslo", "zip": "0150"}}}`,
	"same":    `{"aggregateid": "o-1", "type": "Paid", "payload": {"id": 2, "total": 7.25, "big": 12345678902, "ok": false, "name": "x", "note": null, "tags": [], "items": [{"sku": "c", "qty": 3}], "address": {"city": "Bergen", "zip": "5003"}}}`,
	"other":   `{"aggregateid": "o-2", "type": "Tagged", "payload": {"tags": ["a", "b"], "nested": {"deep": {"x": 1.5}}}}`,
	"null":    `{"aggregateid": "o-3", "type": "Nothing", "payload": null}`,
	"scalar":  `{"aggregateid": "o-4", "type": "Scalar", "payload": "just a string"}`,
	"int":     `{"aggregateid": "o-5", "type": "Counted", "payload": {"n": 1}}`,
	"long":    `{"aggregateid": "o-5", "type": "Counted", "payload": {"n": 5000000000}}`,
	"smaller": `{"aggregateid": "o-5", "type": "Counted", "payload": {"n": 2}}`,
	"text":    `{"aggregateid": "o-5", "type": "Counted", "payload": {"n": "many"}}`,
}

// TestDebeziumAvroConverterRecordsMatchTheRelays writes the same rows to an outbox table that
// Debezium (outbox router, Apicurio's AvroConverter for keys and values) and the relay
// (value_encoding avro, key_encoding avro) read through slots of their own, and compares each
// pair of records as a consumer that knows only the registry's URL sees them: the subject the
// record's schema id is registered under (relative to the topic), the schema after
// normalisation (normalAvro), and the decoded key and value.
func TestDebeziumAvroConverterRecordsMatchTheRelays(t *testing.T) {
	lib := dbz.Lib()
	if err := dbz.LibReady(lib); err != nil {
		t.Fatal(err) // make test-debezium assembles the jars first
	}
	if jars, _ := filepath.Glob(filepath.Join(lib, "apicurio-registry-utils-converter-*.jar")); len(jars) == 0 {
		t.Fatalf("Apicurio's AvroConverter is missing in %s (assembled before bench/debezium/pom.xml had it): run bash bench/debezium-lib.sh", lib)
	}
	f := newDbzFixture(t)
	ctx := context.Background()
	k := testenv.SharedKafka(t)
	reg := testenv.SharedRegistry(t)
	expand := map[string]string{"transforms.outbox.table.expand.json.payload": "true"}
	cases := []avroCase{
		// With table.expand.json.payload: the payload as a record inferred from the JSON, a NULL
		// payload as a null value. An event with other members ("other") gets a schema of its
		// own from Debezium, the widened one from the relay.
		{name: "avroexpanded", smt: expand, rows: []avroRow{{row: "object"}, {row: "same"}, {row: "other", widened: true}, {row: "null"}}},
		// A number that grows from int to long: a second version, compatible under BACKWARD. A
		// smaller number again: Debezium goes back to the int version, the relay stays on long.
		{name: "avroevolve", smt: expand, rows: []avroRow{{row: "int"}, {row: "long"}, {row: "smaller", widened: true}}},
		// A member that was a number and is now a string: refused under BACKWARD.
		{name: "avrorefused", smt: expand, rows: []avroRow{{row: "int"}, {row: "text", refused: true}, {row: "smaller"}}},
		// Without it: the payload as an optional string of Debezium's Json type.
		{name: "avrostring", rows: []avroRow{{row: "object"}, {row: "scalar"}, {row: "null"}},
			gap: "the relay has no Avro encoding of the payload as a string: value_encoding avro infers a record from the JSON " +
				"(a payload that is not an object goes to the failure policy, reason schema_mismatch)",
			golden: func(t *testing.T, row string, key, value decoded) {
				if key.schema != `"string"` || key.value != strings.Trim(rowMember(t, row, "aggregateid"), `"`) {
					t.Errorf("%s: Debezium's key %s, want an Avro string of the aggregate id", row, key)
				}
				want := payloadText(t, f, row)
				if row == "null" {
					if !value.null {
						t.Errorf("%s: Debezium's value %s, want null", row, value)
					}
					return
				}
				if value.schema != debeziumJSONString || !reflect.DeepEqual(value.value, want) {
					t.Errorf("%s: Debezium's value %s, want schema %s and value %s", row, value, debeziumJSONString, jsonText(want))
				}
			}},
	}
	run := fmt.Sprintf("a%08x", time.Now().UnixNano()&0xffffffff) // short: slot names hold 63 characters
	var connectors []map[string]string
	var relays []*relayproc.Proc
	topics := map[string][]string{} // case -> Debezium's topic, the relay's
	for _, c := range cases {
		table, pub := "outbox_"+c.name, "pub_"+c.name+"_"+run
		f.exec(fmt.Sprintf(routerTable, table))
		f.exec(fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", pub, table))
		dslot, rslot := "dbz_"+c.name+"_"+run, "rly_"+c.name+"_"+run
		aggType := run + "_" + c.name
		dtopic, rtopic := "dbz."+aggType, "rly."+aggType
		for _, tp := range []string{dtopic, rtopic} {
			if err := k.CreateTopic(ctx, tp, 4); err != nil {
				t.Fatal(err)
			}
			// Set explicitly: Apicurio's default (NONE) is not Confluent's (BACKWARD).
			for _, s := range []string{tp + "-value", tp + "-key"} {
				if err := reg.SetCompatibility(ctx, s, "BACKWARD"); err != nil {
					t.Fatal(err)
				}
			}
		}
		topics[c.name] = []string{dtopic, rtopic}
		if err := k.CreateTopic(ctx, rtopic+".dlq", 1); err != nil {
			t.Fatal(err)
		}
		f.exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", dslot)
		if c.gap == "" {
			f.exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", rslot)
		}
		extra := maps.Clone(c.smt)
		if extra == nil {
			extra = map[string]string{}
		}
		maps.Copy(extra, apicurioAvroConverter("key", reg.URL()))
		maps.Copy(extra, apicurioAvroConverter("value", reg.URL()))
		connectors = append(connectors, connectorProps(t, f.dsn, "c_"+c.name+"_"+run, dslot, pub, "public."+table, "dbz.${routedByValue}", extra))
		if c.gap != "" {
			continue
		}
		relays = append(relays, f.relay(rslot, append([]string{"--profile=debezium", "--table=public." + table, "--publication=" + pub,
			"--create-publication=false", "--create-slot=false", "--topic-template=rly.{aggregate_type}",
			"--value-encoding=avro", "--key-encoding=avro", "--schema-registry.urls=" + reg.ConfluentURL(),
			"--on-failure=dead-letter", "--dead-letter-topic=" + rtopic + ".dlq"}, c.args...)...))
	}
	worker := startConnect(t, lib, f.brokers, connectors)
	defer worker.stop()
	waitSlots(t, f, worker, "dbz_%_"+run)

	for ci, c := range cases {
		for ri, r := range c.rows {
			f.exec(fmt.Sprintf(`INSERT INTO %[1]s (id, aggregatetype, aggregateid, type, payload)
				SELECT $1, $2, r.aggregateid, r.type, r.payload FROM json_populate_record(NULL::%[1]s, $3::json) r`, "outbox_"+c.name),
				avroRowID(ci, ri), run+"_"+c.name, avroRows[r.row])
		}
	}
	sr := &ccompat{url: reg.ConfluentURL()}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dtopic, rtopic := topics[c.name][0], topics[c.name][1]
			// Debezium writes the rows before the first refused one, then its task fails.
			first := slices.IndexFunc(c.rows, func(r avroRow) bool { return r.refused })
			if first < 0 {
				first = len(c.rows)
			}
			dbzRecs := readTopic(t, f.brokers, dtopic, first)
			rows := map[string]avroRow{} // by event id
			for ri, r := range c.rows {
				rows[avroRowID(ci, ri)] = r
			}
			if c.gap != "" {
				t.Logf("no relay counterpart: %s", c.gap)
				for _, d := range dbzRecs {
					key, value := sr.decode(t, dtopic, d.Key), sr.decode(t, dtopic, d.Value)
					t.Logf("%s: Debezium's key %s\n  value %s", d.Header("id"), key, value)
					c.golden(t, rows[d.Header("id")].row, key, value)
				}
				return
			}
			var refused []string
			for ri, r := range c.rows {
				if r.refused {
					refused = append(refused, avroRowID(ci, ri))
				}
			}
			if len(refused) == 0 {
				compareAvro(t, sr, rows, dtopic, rtopic, dbzRecs, readTopic(t, f.brokers, rtopic, len(c.rows)))
				return
			}
			// The relay wrote every other row and dead-lettered the refused ones; the records
			// before the first refused one are compared.
			rlyRecs := readTopic(t, f.brokers, rtopic, len(c.rows)-len(refused))
			before := func(recs []harness.Record) []harness.Record {
				return slices.DeleteFunc(slices.Clone(recs), func(r harness.Record) bool { return r.Header("id") >= avroRowID(ci, first) })
			}
			compareAvro(t, sr, rows, dtopic, rtopic, before(dbzRecs), before(rlyRecs))
			if len(dbzRecs) != first {
				t.Errorf("Debezium wrote %d records, want the %d before the refused one", len(dbzRecs), first)
			}
			status := worker.waitTaskFailed(t, "c_"+c.name+"_"+run)
			if !strings.Contains(status, "RuleViolationException") {
				t.Errorf("Debezium's task failed for another reason than the registry's refusal: %s", status)
			}
			for _, d := range readTopic(t, f.brokers, rtopic+".dlq", len(refused)) {
				if !slices.Contains(refused, d.Header("id")) || d.Header("outbox.dlq.reason") != "schema_incompatible" {
					t.Errorf("the relay's dead letter %s has reason %q (%s), want one of %v with schema_incompatible",
						d.Header("id"), d.Header("outbox.dlq.reason"), d.Header("outbox.dlq.error"), refused)
				}
			}
		})
	}
	for _, p := range relays {
		f.stop(p)
	}
	if t.Failed() {
		for _, c := range cases {
			t.Logf("connector %s: %s", c.name, worker.status(t, "c_"+c.name+"_"+run))
		}
		t.Logf("Kafka Connect log:\n%s", worker.tail())
	}
}

// avroRowID is the event id of case ci's row ri.
func avroRowID(ci, ri int) string { return fmt.Sprintf("%08d-0000-4000-8000-%012d", ci, ri) }

// debeziumJSONString is the value schema Connect's Avro converter writes for the outbox router's
// unexpanded payload: the optional jsonb column, a string of Debezium's Json semantic type.
const debeziumJSONString = `["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]`

// payloadText is the payload of row as PostgreSQL's jsonb prints it (members ordered by length,
// then bytes; ", " and ": " between them), which is what Debezium sends unexpanded.
func payloadText(t *testing.T, f *dbzFixture, row string) string {
	t.Helper()
	var text string
	if err := f.pool.QueryRow(context.Background(), "SELECT ($1::jsonb -> 'payload')::text", avroRows[row]).Scan(&text); err != nil {
		t.Fatal(err)
	}
	return text
}

// rowMember is a member of row's JSON text.
func rowMember(t *testing.T, row, member string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(avroRows[row]), &m); err != nil {
		t.Fatal(err)
	}
	return string(m[member])
}

// compareAvro matches the two sides' records by their id header and compares what a consumer
// decodes from each.
func compareAvro(t *testing.T, sr *ccompat, rows map[string]avroRow, dtopic, rtopic string, dbzRecs, rlyRecs []harness.Record) {
	t.Helper()
	if len(dbzRecs) != len(rlyRecs) {
		t.Errorf("Debezium wrote %d records, the relay %d", len(dbzRecs), len(rlyRecs))
	}
	byID := map[string]harness.Record{}
	for _, r := range dbzRecs {
		byID[r.Header("id")] = r
	}
	for _, r := range rlyRecs {
		id := r.Header("id")
		d, ok := byID[id]
		if !ok {
			t.Errorf("record %s of the relay has no Debezium counterpart", id)
			continue
		}
		for _, part := range []struct {
			name       string
			dbz, relay []byte
		}{{"key", d.Key, r.Key}, {"value", d.Value, r.Value}} {
			dd, rd := sr.decode(t, dtopic, part.dbz), sr.decode(t, rtopic, part.relay)
			t.Logf("%s %s: Debezium's %s\n  the relay's %s", id, part.name, dd, rd)
			if dd.null || rd.null {
				if dd.null != rd.null {
					t.Errorf("%s %s: the relay's is %s, Debezium's %s", id, part.name, rd, dd)
				}
				continue
			}
			if want := strings.TrimPrefix(dd.subject, dtopic); strings.TrimPrefix(rd.subject, rtopic) != want {
				t.Errorf("%s %s: the relay's schema is registered under %q, Debezium's under %q: want <topic>%s", id, part.name, rd.subject, dd.subject, want)
			}
			dn, rn := normalAvro(t, dd.schema), normalAvro(t, rd.schema)
			// Connect's converter names every record in a connect.name property, its full name;
			// the relay writes it too, where Connect does, so that the same shape is the same
			// text and shares Debezium's id (a cut-over reuses the subject's schemas).
			if dp, rp := avroProps(t, dd.schema), avroProps(t, rd.schema); !reflect.DeepEqual(dp, connectNames(t, dd.schema)) || !reflect.DeepEqual(rp, connectNames(t, rd.schema)) {
				t.Errorf("%s %s: properties beyond Avro's: Debezium's %v, the relay's %v; expected connect.name on each record of both: update the expectation and docs/migrating-from-debezium.md", id, part.name, dp, rp)
			}
			if !(part.name == "value" && rows[id].widened) && (dd.schema != rd.schema || dd.id != rd.id) {
				t.Errorf("%s %s: the relay's schema id %d text %s, Debezium's id %d text %s: the same shape must be the same text and share Debezium's id", id, part.name, rd.id, rd.schema, dd.id, dd.schema)
			}
			if part.name == "value" && rows[id].widened {
				// The relay's schema is not Debezium's, but reads Debezium's record as the relay's.
				if dn == rn {
					t.Errorf("%s value: the relay registered Debezium's schema %s where this test expects the subject's widened one: update the row's expectation (widened)", id, dn)
				}
				if got := sr.resolve(t, rd.schema, dd, part.dbz); !reflect.DeepEqual(got, rd.value) {
					t.Errorf("%s value: Debezium's record read with the relay's schema decodes to\n  %s\nthe relay's to\n  %s", id, jsonText(got), jsonText(rd.value))
				}
				continue
			}
			if dn != rn {
				t.Errorf("%s %s: the relay's schema after normalisation\n  %s\nDebezium's\n  %s", id, part.name, rn, dn)
			}
			if !reflect.DeepEqual(dd.value, rd.value) {
				t.Errorf("%s %s: the relay's decodes to\n  %s\nDebezium's to\n  %s", id, part.name, jsonText(rd.value), jsonText(dd.value))
			}
		}
	}
}

// normalAvro is a schema in Avro's Parsing Canonical Form (full names, only the attributes that
// make the data: no doc, aliases or custom properties, in the canonical order) with each
// field's default kept, since a default decides compatibility: two schemas equal here read and
// write the same data and evolve the same way.
func normalAvro(t *testing.T, text string) string {
	t.Helper()
	var doc any
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("schema %s: %v", text, err)
	}
	b, err := json.Marshal(canonical(doc, ""))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// canonical rewrites a schema node: names made full (namespace from the enclosing name), then the
// attributes PCF keeps, in its order, plus default.
func canonical(n any, ns string) any {
	switch v := n.(type) {
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = canonical(x, ns)
		}
		return out
	case map[string]any:
		typ, _ := v["type"].(string)
		if primitive[typ] && v["logicalType"] == nil {
			return typ // {"type":"string","connect.name":...} is "string"
		}
		var out ordered
		if name, ok := v["name"].(string); ok && typ != "" && typ != "array" && typ != "map" {
			full := name
			if nsv, ok := v["namespace"].(string); ok && !strings.Contains(name, ".") {
				if nsv != "" {
					full = nsv + "." + name
				}
			} else if !strings.Contains(name, ".") && ns != "" {
				full = ns + "." + name
			}
			out = append(out, kv{"name", full})
			if i := strings.LastIndex(full, "."); i >= 0 {
				ns = full[:i]
			} else {
				ns = ""
			}
		}
		out = append(out, kv{"type", typ})
		if fields, ok := v["fields"].([]any); ok {
			fs := make([]any, len(fields))
			for i, fl := range fields {
				m := fl.(map[string]any)
				f := ordered{{"name", m["name"]}, {"type", canonical(m["type"], ns)}}
				if d, ok := m["default"]; ok {
					f = append(f, kv{"default", d})
				}
				fs[i] = f
			}
			out = append(out, kv{"fields", fs})
		}
		for _, k := range []string{"symbols", "items", "values", "size"} {
			if x, ok := v[k]; ok {
				out = append(out, kv{k, canonical(x, ns)})
			}
		}
		for _, k := range []string{"logicalType", "precision", "scale"} {
			if x, ok := v[k]; ok {
				out = append(out, kv{k, x})
			}
		}
		return out
	default:
		return v
	}
}

// avroProps are the attributes of a schema's nodes that Avro itself does not define (e.g.
// Connect's connect.name), by the path of their node.
func avroProps(t *testing.T, text string) map[string]any {
	t.Helper()
	var doc any
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("schema %s: %v", text, err)
	}
	props := map[string]any{}
	var walk func(n any, path string)
	walk = func(n any, path string) {
		switch v := n.(type) {
		case []any:
			for i, x := range v {
				walk(x, fmt.Sprintf("%s[%d]", path, i))
			}
		case map[string]any:
			for k, x := range v {
				switch k {
				case "type", "items", "values":
					walk(x, path+"/"+k)
				case "fields":
					for _, fl := range x.([]any) {
						m := fl.(map[string]any)
						walk(m["type"], fmt.Sprintf("%s/%v", path, m["name"]))
					}
				case "name", "namespace", "doc", "aliases", "default", "symbols", "size", "logicalType", "precision", "scale", "order":
				default:
					props[path+"/"+k] = x
				}
			}
		}
	}
	walk(doc, "")
	return props
}

var primitive = map[string]bool{"null": true, "boolean": true, "int": true, "long": true, "float": true, "double": true, "bytes": true, "string": true}

// connectNames is what Connect's Avro converter adds to a schema: a connect.name property on
// each record, its full name (by the path avroProps gives it).
func connectNames(t *testing.T, text string) map[string]any {
	t.Helper()
	var doc any
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("schema %s: %v", text, err)
	}
	names := map[string]any{}
	var walk func(n any, path, ns string)
	walk = func(n any, path, ns string) {
		switch v := n.(type) {
		case []any:
			for i, x := range v {
				walk(x, fmt.Sprintf("%s[%d]", path, i), ns)
			}
		case map[string]any:
			switch v["type"] {
			case "record":
				full := v["name"].(string)
				if nsv, ok := v["namespace"].(string); ok && nsv != "" {
					full = nsv + "." + full
				} else if !ok && ns != "" {
					full = ns + "." + full
				}
				names[path+"/connect.name"] = full
				if i := strings.LastIndex(full, "."); i >= 0 {
					ns = full[:i]
				}
				for _, fl := range v["fields"].([]any) {
					m := fl.(map[string]any)
					walk(m["type"], fmt.Sprintf("%s/%v", path, m["name"]), ns)
				}
			case "array":
				walk(v["items"], path+"/items", ns)
			case "map":
				walk(v["values"], path+"/values", ns)
			}
		}
	}
	walk(doc, "", "")
	return names
}

// ordered is a JSON object whose members keep their order.
type ordered []kv

type kv struct {
	k string
	v any
}

func (o ordered) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, m := range o {
		if i > 0 {
			b = append(b, ',')
		}
		kb, _ := json.Marshal(m.k)
		vb, err := json.Marshal(m.v)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, kb...), ':'), vb...)
	}
	return append(b, '}'), nil
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// ccompat reads a registry's Confluent-compatible API, the only thing a consumer knows.
type ccompat struct{ url string }

func (c *ccompat) get(t *testing.T, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", path, resp.Status, b)
	}
	return string(b)
}

// decoded is what a consumer knowing only the registry makes of a framed key or value.
type decoded struct {
	null    bool   // a null (tombstone) record part
	id      int    // the schema id in the frame
	subject string // the subject of topic the id is registered under (the first if several)
	schema  string
	value   any // as hamba/avro decodes it: a union of null and a named type as {"full name": value}
}

func (d decoded) String() string {
	if d.null {
		return "null"
	}
	return fmt.Sprintf("id %d subject %s schema %s value %s", d.id, d.subject, d.schema, jsonText(d.value))
}

// decode reads a record part of topic in Confluent's wire format: magic byte 0, the 4-byte schema
// id, Avro data; the schema and its subjects come from the registry.
func (c *ccompat) decode(t *testing.T, topic string, b []byte) decoded {
	t.Helper()
	if b == nil {
		return decoded{null: true}
	}
	if len(b) < 5 || b[0] != 0 {
		t.Fatalf("not Confluent's wire format (magic byte 0 and a 4-byte id): % x", b[:min(len(b), 16)])
	}
	id := int(binary.BigEndian.Uint32(b[1:5]))
	var s struct {
		Schema string `json:"schema"`
	}
	if err := json.Unmarshal([]byte(c.get(t, fmt.Sprintf("/schemas/ids/%d", id))), &s); err != nil {
		t.Fatal(err)
	}
	// One id may serve several subjects (the registry keeps one copy of equal schemas): the one of
	// this topic is the record's.
	var versions []struct {
		Subject string `json:"subject"`
	}
	if err := json.Unmarshal([]byte(c.get(t, fmt.Sprintf("/schemas/ids/%d/versions", id))), &versions); err != nil {
		t.Fatal(err)
	}
	d := decoded{id: id, schema: s.Schema}
	for _, v := range versions {
		if strings.HasPrefix(v.Subject, topic) || d.subject == "" {
			d.subject = v.Subject
		}
	}
	schema, err := avro.ParseWithCache(s.Schema, "", &avro.SchemaCache{})
	if err != nil {
		t.Fatalf("schema %d: %v", id, err)
	}
	if err := avro.Unmarshal(schema, b[5:], &d.value); err != nil {
		t.Fatalf("schema %d: decoding % x: %v", id, b, err)
	}
	return d
}

// resolve decodes the record part b, written with d's schema, through reader (Avro's schema
// resolution: what a consumer holding reader makes of it).
func (c *ccompat) resolve(t *testing.T, reader string, d decoded, b []byte) any {
	t.Helper()
	rs, err := avro.ParseWithCache(reader, "", &avro.SchemaCache{})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := avro.ParseWithCache(d.schema, "", &avro.SchemaCache{})
	if err != nil {
		t.Fatal(err)
	}
	resolved, err := avro.NewSchemaCompatibility().Resolve(rs, ws)
	if err != nil {
		t.Fatalf("schema %s cannot read data of schema %s: %v", reader, d.schema, err)
	}
	var v any
	if err := avro.Unmarshal(resolved, b[5:], &v); err != nil {
		t.Fatalf("decoding % x with schema %s as the reader: %v", b, reader, err)
	}
	return v
}

// waitTaskFailed waits until the connector's task has failed and returns its status.
func (w *connectWorker) waitTaskFailed(t *testing.T, connector string) string {
	t.Helper()
	var status string
	await.State(t, time.Minute, "connector "+connector+"'s task to fail", func() (bool, string) {
		status = w.status(t, connector)
		return strings.Contains(status, `"state":"FAILED"`), status
	})
	return status
}

// status is a connector's status from the worker's REST API.
func (w *connectWorker) status(t *testing.T, connector string) string {
	t.Helper()
	return (&ccompat{url: fmt.Sprintf("http://127.0.0.1:%d", w.port)}).get(t, "/connectors/"+connector+"/status")
}
