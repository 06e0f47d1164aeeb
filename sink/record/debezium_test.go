package record

import (
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// The golden records below are what Debezium 3.6.1 (PostgreSQL connector, outbox event router,
// Kafka Connect 4.3.1) wrote for the same rows in `make test-debezium`
// (cmd/outbox-relay/debezium_router_test.go): the payloads are the jsonb text PostgreSQL sends.
var goldenPayloads = map[string]string{
	"created": `{"id": 1, "note": null, "tags": [], "items": [{"qty": 2, "sku": "a"}, {"qty": 1, "sku": "b"}], "total": 42.00}`,
	"array":   `[1, 2, 3]`,
	"odd":     `{"f": 0.0000001, "s": "grüße \"q\" <&>", "t": true, "big": 12345678901, "mixed": [1, "a"]}`,
	"scalar":  `"just a string"`,
	"nested":  `{"a": {"b": {"c": [{"d": 1.5}, {"d": 2.5, "e": "x"}]}}, "empty": {}}`,
}

func newBuilder(t *testing.T, o Options) *Builder {
	t.Helper()
	b, err := NewBuilder(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func payloadEvent(name string) *decoder.Event {
	ev := &decoder.Event{ID: []byte("e"), AggregateType: []byte("order"), AggregateID: []byte("o-1")}
	if p, ok := goldenPayloads[name]; ok {
		ev.Payload = []byte(p)
	}
	return ev
}

func TestValuesAreTheRecordsDebeziumWrites(t *testing.T) {
	tests := []struct {
		name, payload, encoding string
		want                    string // nil is a tombstone
		tombstone               bool
	}{
		// JsonConverter, schemas disabled, no expansion: value_encoding json-string.
		{"json-string: an object is a JSON string", "created", "json-string",
			`"{\"id\": 1, \"note\": null, \"tags\": [], \"items\": [{\"qty\": 2, \"sku\": \"a\"}, {\"qty\": 1, \"sku\": \"b\"}], \"total\": 42.00}"`, false},
		{"json-string: a NULL payload is the JSON null, not a tombstone", "null", "json-string", `null`, false},
		{"json-string: a jsonb string is quoted again", "scalar", "json-string", `"\"just a string\""`, false},
		// table.expand.json.payload, schemas disabled: value_encoding json-expanded.
		{"json-expanded: an object as Connect data, null members and empty arrays left out, 42.00 a double", "created", "json-expanded",
			`{"id":1,"items":[{"qty":2,"sku":"a"},{"qty":1,"sku":"b"}],"total":42.0}`, false},
		{"json-expanded: an array mixing types cannot be expanded and stays a string", "odd", "json-expanded",
			`"{\"f\": 0.0000001, \"s\": \"grüße \\\"q\\\" <&>\", \"t\": true, \"big\": 12345678901, \"mixed\": [1, \"a\"]}"`, false},
		{"json-expanded: a jsonb string stays a string", "scalar", "json-expanded", `"\"just a string\""`, false},
		{"json-expanded: elements with different members are merged, a missing one null", "nested", "json-expanded",
			`{"a":{"b":{"c":[{"d":1.5,"e":null},{"d":2.5,"e":"x"}]}},"empty":{}}`, false},
		{"json-expanded: NULL is the JSON null", "null", "json-expanded", `null`, false},
		// table.expand.json.payload, JsonConverter schemas enabled: json-with-schema.
		{"json-with-schema: the inferred schema and the data", "created", "json-with-schema",
			`{"schema":{"type":"struct","fields":[{"type":"int32","optional":true,"field":"id"},{"type":"array","items":{"type":"struct","fields":[{"type":"int32","optional":true,"field":"qty"},{"type":"string","optional":true,"field":"sku"}],"optional":true,"name":"payload.items"},"optional":true,"field":"items"},{"type":"double","optional":true,"field":"total"}],"optional":true,"name":"payload"},"payload":{"id":1,"items":[{"qty":2,"sku":"a"},{"qty":1,"sku":"b"}],"total":42.0}}`, false},
		{"json-with-schema: a NULL payload has the jsonb column's schema", "null", "json-with-schema",
			`{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}`, false},
		{"json-with-schema: what cannot be expanded is a string of the jsonb column's schema", "odd", "json-with-schema",
			`{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"f\": 0.0000001, \"s\": \"grüße \\\"q\\\" <&>\", \"t\": true, \"big\": 12345678901, \"mixed\": [1, \"a\"]}"}`, false},
		{"json-with-schema: a jsonb string", "scalar", "json-with-schema",
			`{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"\"just a string\""}`, false},
		{"json-with-schema: merged array elements lose the optional flag", "nested", "json-with-schema",
			`{"schema":{"type":"struct","fields":[{"type":"struct","fields":[{"type":"struct","fields":[{"type":"array","items":{"type":"struct","fields":[{"type":"double","optional":true,"field":"d"},{"type":"string","optional":true,"field":"e"}],"optional":false,"name":"payload.a.b.c"},"optional":true,"field":"c"}],"optional":true,"name":"payload.a.b","field":"b"}],"optional":true,"name":"payload.a","field":"a"},{"type":"struct","fields":[],"optional":true,"name":"payload.empty","field":"empty"}],"optional":true,"name":"payload"},"payload":{"a":{"b":{"c":[{"d":1.5,"e":null},{"d":2.5,"e":"x"}]}},"empty":{}}}`, false},
		{"json-with-schema with a tombstone for the NULL payload", "null", "json-with-schema", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newBuilder(t, Options{ValueEncoding: Encoding(tt.encoding), TombstoneOnEmptyPayload: tt.tombstone})
			got := s.value(payloadEvent(tt.payload))
			if tt.tombstone {
				if got != nil {
					t.Fatalf("value %q, want a tombstone", got)
				}
				return
			}
			if string(got) != tt.want {
				t.Errorf("value\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestKeyWithSchemaIsDebeziumsKey(t *testing.T) {
	s := newBuilder(t, Options{KeyEncoding: JSONWithSchema})
	if got := string(s.key(payloadEvent("created"))); got != `{"schema":{"type":"string","optional":false},"payload":"o-1"}` {
		t.Errorf("key %s", got)
	}
}

func TestEnvelopePlacementIsDebeziumsEnvelope(t *testing.T) {
	// table.fields.additional.placement=type:envelope:eventType,amount:envelope,flag:envelope with
	// JsonConverter, schemas disabled; with json-string the payload stays a string, with raw it is
	// expanded like table.expand.json.payload.
	ev := func(payload string, eventType, amount, flag []byte) *decoder.Event {
		e := payloadEvent(payload)
		e.Extra = [][]byte{eventType, amount, flag}
		e.ExtraKinds = []decoder.ValueKind{decoder.KindString, decoder.KindNumber, decoder.KindBool}
		return e
	}
	cfg := Options{ExtraHeaders: []string{"eventType", "amount", "flag"}, ExtraPlacement: []Placement{PlaceEnvelope, PlaceEnvelope, PlaceEnvelope}}
	tests := []struct {
		name, encoding string
		ev             *decoder.Event
		want           string
	}{
		{"json-string: the payload a string, an int and a boolean column typed", "json-string", ev("created", []byte("Created"), []byte("7"), []byte("t")),
			`{"payload":"{\"id\": 1, \"note\": null, \"tags\": [], \"items\": [{\"qty\": 2, \"sku\": \"a\"}, {\"qty\": 1, \"sku\": \"b\"}], \"total\": 42.00}","eventType":"Created","amount":7,"flag":true}`},
		{"json-string: NULL payload and columns are null", "json-string", ev("null", []byte("Paid"), nil, []byte("f")),
			`{"payload":null,"eventType":"Paid","amount":null,"flag":false}`},
		{"json-string: an array payload is a string", "json-string", ev("array", []byte("Shipped"), nil, nil),
			`{"payload":"[1, 2, 3]","eventType":"Shipped","amount":null,"flag":null}`},
		{"raw: the payload expanded", "raw", ev("created", []byte("Created"), []byte("7"), nil),
			`{"payload":{"id":1,"items":[{"qty":2,"sku":"a"},{"qty":1,"sku":"b"}],"total":42.0},"eventType":"Created","amount":7,"flag":null}`},
		{"raw: a payload that cannot be expanded is a string", "raw", ev("scalar", []byte("Scalar"), []byte("-5"), nil),
			`{"payload":"\"just a string\"","eventType":"Scalar","amount":-5,"flag":null}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			c.ValueEncoding = Encoding(tt.encoding)
			s := newBuilder(t, c)
			if got := string(s.value(tt.ev)); got != tt.want {
				t.Errorf("value\n got %s\nwant %s", got, tt.want)
			}
			hs, err := buildHeaders(tt.ev, s.o.BuiltinHeaders, s.headers, s.nullHeaders)
			if err != nil || len(hs) != 3 {
				t.Errorf("headers %v (%v): envelope columns must not be headers too", hs, err)
			}
		})
	}
}

func TestTombstoneOnEmptyPayload(t *testing.T) {
	// route.tombstone.on.empty.payload: Debezium's payload.toString().trim().isEmpty().
	for _, tt := range []struct {
		payload   []byte
		tombstone bool
	}{{nil, true}, {[]byte(""), true}, {[]byte("   "), true}, {[]byte("\t\n"), true}, {[]byte("  y  "), false}, {[]byte("x"), false}} {
		for _, on := range []bool{false, true} {
			s := newBuilder(t, Options{TombstoneOnEmptyPayload: on})
			got := s.value(&decoder.Event{Payload: tt.payload})
			want := tt.payload
			if on && tt.tombstone {
				want = nil
			}
			if (got == nil) != (want == nil) || string(got) != string(want) {
				t.Errorf("option %t, payload %q: value %q, want %q", on, tt.payload, got, want)
			}
		}
	}
}

func TestTopicRegexRoutesLikeDebeziumsRegexRouter(t *testing.T) {
	tests := []struct {
		regex, replacement, aggregateType, want string
	}{
		{`(?<routedByValue>.*)`, DefaultTopicReplacement, "order", "outbox.event.order"},
		{`(?<routedByValue>[a-z0-9]+)_(?<kind>[a-z]+)`, "dbz.${routedByValue}.x.${kind}", "r1a2b_kind", "dbz.r1a2b.x.kind"},
		{`(?P<t>[a-z]+)-v(\d+)`, "events.$t.v${2}", "order-v3", "events.order.v3"},
		{`(?<t>[a-z]+)`, "events.${t}", "NoMatch", "NoMatch"},            // no match: the routed-by value itself
		{`(?<t>[a-z]+)`, "events.${t}", "order-x", "order-x"},            // the whole value must match
		{`(?<t>[a-z]+)`, "cost$$.${t}", "order", "cost$.order"},          // $$ is a dollar
		{`(?<routedByValue>.*)`, "fixed", "anything", "fixed"},           // no group at all
		{`order|customer`, "domain.events", "customer", "domain.events"}, // alternation is anchored as a whole
	}
	for _, tt := range tests {
		re, err := NewTopicRegex(tt.regex, tt.replacement)
		if err != nil {
			t.Fatalf("%s: %v", tt.regex, err)
		}
		r := &router{regex: &regexRouter{re: re, replacement: tt.replacement, passthrough: true}, cache: map[string]string{}} // Debezium's fall-through
		got, err := r.topic(&decoder.Event{AggregateType: []byte(tt.aggregateType)})
		if strings.Contains(tt.want, "$") && err != nil {
			err = nil // the expansion is right; the name is invalid, and goes to the failure policy
		}
		if err != nil || got != tt.want {
			t.Errorf("%s -> %s on %q: topic %q (%v), want %q", tt.regex, tt.replacement, tt.aggregateType, got, err, tt.want)
		}
	}
	for _, bad := range [][2]string{{`(`, "x"}, {`(?<a>.*)`, "${b}"}, {`(.*)`, "$2"}} {
		if _, err := NewTopicRegex(bad[0], bad[1]); err == nil {
			t.Errorf("regex %q with replacement %q was accepted", bad[0], bad[1])
		}
	}
}

func TestPartitionColumn(t *testing.T) {
	s := newBuilder(t, Options{ExtraHeaders: []string{"tenant", "partitionno"}, ExtraPlacement: []Placement{PlaceHeaderOrNull, PlacePartition}})
	for _, tt := range []struct {
		value []byte
		want  int
		err   bool
	}{{[]byte("2"), 2, false}, {nil, -1, false}, {[]byte("0"), 0, false}, {[]byte("x"), -1, true}, {[]byte("-1"), -1, true}, {[]byte("99999999999"), -1, true}} {
		got, err := s.partitionOf(&decoder.Event{Extra: [][]byte{nil, tt.value}})
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("partition column %q: %d (%v), want %d (error %t)", tt.value, got, err, tt.want, tt.err)
		}
	}
	hs, _ := buildHeaders(&decoder.Event{ID: []byte("e"), Extra: [][]byte{nil, []byte("2")}}, nil, s.headers, s.nullHeaders)
	if len(hs) != 1 || hs[0].Key != "tenant" || hs[0].Value != nil {
		t.Errorf("headers %v: want a null-valued tenant header (Debezium's for a NULL column) and no partition header", hs)
	}
}

func TestRecordTimestamp(t *testing.T) {
	own := time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.UTC)
	commit := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	now := time.Now()
	for _, tt := range []struct {
		ev   decoder.Event
		want time.Time
	}{
		{decoder.Event{Time: own, Tx: decoder.TxInfo{CommitTime: commit}}, own},
		{decoder.Event{Tx: decoder.TxInfo{CommitTime: commit}}, commit},
		{decoder.Event{}, now},
	} {
		if got := recordTime(&tt.ev, now); !got.Equal(tt.want) {
			t.Errorf("record time %s, want %s", got, tt.want)
		}
	}
}

func TestTraceHeadersFromDebeziumsSpanContext(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	// What Debezium's tracing stores (java.util.Properties.store): a date comment, '=' and ':' in
	// values escaped.
	props := "#Tue Jan 02 03:04:05 UTC 2026\ntraceparent=" + tp + "\ntracestate=congo\\=t61rcWkgMzE,rojo\\=00f067aa0ba902b7\n"
	tests := []struct {
		name   string
		before map[string]string
		ctx    string
		want   map[string]string
	}{
		{"Properties text", nil, props, map[string]string{"traceparent": tp, "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}},
		{"colon separators, a continued line and \\u escapes", nil, "traceparent: " + tp + "\ntracestate = a\\u003d1,\\\n   b=2\n",
			map[string]string{"traceparent": tp, "tracestate": "a=1,b=2"}},
		{"a JSON object (a logical decoding message)", nil, `{"traceparent":"` + tp + `","tracestate":"x=1"}`, map[string]string{"traceparent": tp, "tracestate": "x=1"}},
		{"an invalid traceparent is left out with its tracestate", nil, "traceparent=00-zz-01\ntracestate=x=1\n", map[string]string{}},
		{"a traceparent header of the event's own wins", map[string]string{"traceparent": "own"}, props, map[string]string{"traceparent": "own"}},
		{"nothing", nil, "", map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hs []kafka.Header
			for k, v := range tt.before {
				hs = append(hs, kafka.Header{Key: k, Value: []byte(v)})
			}
			got := map[string]string{}
			for _, h := range traceHeaders(hs, []byte(tt.ctx)) {
				got[h.Key] = string(h.Value)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("headers %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("header %s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
	if p := parseProperties("# comment\n! also\n\nkey\\ with\\ spaces = v\\tw\nempty\n"); p["key with spaces"] != "v\tw" || p["empty"] != "" || len(p) != 2 {
		t.Errorf("parseProperties = %v", p)
	}
}

func TestJavaDoubleFormatting(t *testing.T) {
	tenth, fifth := 0.1, 0.2
	for f, want := range map[float64]string{42: "42.0", 1.5: "1.5", 0.001: "0.001", 1e-7: "1.0E-7", 12345678.9: "1.23456789E7", 1e7: "1.0E7",
		9999999: "9999999.0", -2.5e-4: "-2.5E-4", 0: "0.0", tenth + fifth: "0.30000000000000004"} {
		if got := string(appendJavaDouble(nil, f)); got != want {
			t.Errorf("%v: %s, want %s", f, got, want)
		}
	}
	if !strings.HasPrefix(string(expandedValue([]byte(`{"x": 1e-7}`), "payload")), `{"x":1.0E-7}`) {
		t.Errorf("expanded %s", expandedValue([]byte(`{"x": 1e-7}`), "payload"))
	}
}
