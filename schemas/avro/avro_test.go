package avro_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	hamba "github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/schemas/avro"
)

func TestInference(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    string // the schema, or the start of the error
		wantErr bool
	}{
		{"strings, booleans and numbers become nullable fields with a null default, in document order",
			`{"s":"x","b":true,"i":1,"l":5000000000,"d":1.5,"e":1e3}`,
			`{"type":"record","name":"payload","namespace":"shop","fields":[` +
				`{"name":"s","type":["null","string"],"default":null},{"name":"b","type":["null","boolean"],"default":null},` +
				`{"name":"i","type":["null","int"],"default":null},{"name":"l","type":["null","long"],"default":null},` +
				`{"name":"d","type":["null","double"],"default":null},{"name":"e","type":["null","double"],"default":null}],"connect.name":"shop.payload"}`, false},
		{"null members and empty arrays are left out",
			`{"a":null,"b":[],"c":[null],"d":"x"}`,
			`{"type":"record","name":"payload","namespace":"shop","fields":[{"name":"d","type":["null","string"],"default":null}],"connect.name":"shop.payload"}`, false},
		{"an object member is a nested record named after it in the enclosing record's namespace, each record with its connect.name after its fields",
			`{"address":{"city":"Oslo"}}`,
			`{"type":"record","name":"payload","namespace":"shop","fields":[{"name":"address","type":["null",` +
				`{"type":"record","name":"address","namespace":"shop.payload","fields":[{"name":"city","type":["null","string"],"default":null}],"connect.name":"shop.payload.address"}],"default":null}],"connect.name":"shop.payload"}`, false},
		{"an array of objects merges its elements into one record and numbers widen",
			`{"items":[{"sku":"a","qty":1},{"qty":2.5,"note":"x"}]}`,
			`{"type":"record","name":"payload","namespace":"shop","fields":[{"name":"items","type":["null",{"type":"array","items":["null",` +
				`{"type":"record","name":"items","namespace":"shop.payload","fields":[{"name":"sku","type":["null","string"],"default":null},` +
				`{"name":"qty","type":["null","double"],"default":null},{"name":"note","type":["null","string"],"default":null}],"connect.name":"shop.payload.items"}]}],"default":null}],"connect.name":"shop.payload"}`, false},
		{"member names that are not Avro names are mended",
			`{"order-id":"1","2nd":true}`,
			`{"type":"record","name":"payload","namespace":"shop","fields":[{"name":"order_id","type":["null","string"],"default":null},` +
				`{"name":"_2nd","type":["null","boolean"],"default":null}],"connect.name":"shop.payload"}`, false},
		{"two members that mend to one name cannot be inferred", `{"a-b":1,"a_b":2}`, `members "a-b" and "a_b" of the payload both become`, true},
		{"an array mixing kinds cannot be inferred", `{"tags":["a",1]}`, `array tags mixes string and int`, true},
		{"a payload that is not an object cannot be inferred", `[1,2]`, `the payload is an array, not a JSON object`, true},
		{"a payload that is not JSON cannot be inferred", `{"a":`, `the payload is not JSON`, true},
	}
	f := avro.New()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := f.Infer("payload", "shop", []byte(tt.payload))
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %v, want one containing %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Schema != tt.want {
				t.Fatalf("schema\n%s\nwant\n%s", s.Schema, tt.want)
			}
			if _, err := hamba.Parse(s.Schema); err != nil {
				t.Fatalf("the inferred schema is not valid Avro: %v", err)
			}
			// The payload encodes in its own schema, and decodes to what Avro's reference
			// library reads from the same bytes.
			_, data, err := f.Encode(s, []byte(tt.payload))
			if err != nil {
				t.Fatal(err)
			}
			var viaLib any
			if err := hamba.Unmarshal(hamba.MustParse(s.Schema), data, &viaLib); err != nil {
				t.Fatalf("hamba cannot read the encoded data: %v", err)
			}
			js, err := f.Decode(s, nil, data)
			if err != nil {
				t.Fatal(err)
			}
			var decoded any
			if err := json.Unmarshal(js, &decoded); err != nil {
				t.Fatalf("decoded %s is not JSON: %v", js, err)
			}
		})
	}
}

func TestStrictConversionNamesTheFieldThatFails(t *testing.T) {
	schema := sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":"Order","fields":[
		{"name":"id","type":"string"},
		{"name":"qty","type":"int"},
		{"name":"note","type":["null","string"],"default":null},
		{"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]},"default":"NEW"},
		{"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[{"name":"price","type":"double"}]}}},
		{"name":"at","type":["null",{"type":"long","logicalType":"timestamp-millis"}],"default":null},
		{"name":"amount","type":["null",{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}],"default":null}
	]}`}
	tests := []struct {
		name    string
		payload string
		field   string // "" when it fits
		want    map[string]any
	}{
		{"a payload that fits is written with defaults for what it leaves out",
			`{"id":"o1","qty":2,"lines":[{"price":9.5}],"at":"2026-01-02T03:04:05.006Z","amount":"12.30"}`, "",
			map[string]any{"id": "o1", "qty": 2, "note": nil, "status": "NEW", "lines": []any{map[string]any{"price": 9.5}}, "at": 1767323045006, "amount": 12.3}},
		{"a string where an int belongs names the field", `{"id":"o1","qty":"2","lines":[]}`, "qty", nil},
		{"a long where an int belongs names the field", `{"id":"o1","qty":5000000000,"lines":[]}`, "qty", nil},
		{"a missing field without a default names the field", `{"qty":1,"lines":[]}`, "id", nil},
		{"a nested field names its path", `{"id":"o1","qty":1,"lines":[{"price":1},{"price":"x"}]}`, "lines[1].price", nil},
		{"a symbol the enum lacks names the field", `{"id":"o1","qty":1,"lines":[],"status":"LOST"}`, "status", nil},
		{"a member the schema lacks names the member", `{"id":"o1","qty":1,"lines":[],"extra":1}`, "extra", nil},
		{"a decimal with too many fractional digits names the field", `{"id":"o1","qty":1,"lines":[],"amount":1.234}`, "amount", nil},
	}
	f := avro.New()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, data, err := f.Encode(schema, []byte(tt.payload))
			if tt.field != "" {
				var fe *avro.FieldError
				if !errors.As(err, &fe) || fe.Path != tt.field {
					t.Fatalf("error %v, want a FieldError for %q", err, tt.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			js, err := f.Decode(schema, nil, data)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(js, &got); err != nil {
				t.Fatal(err)
			}
			want, _ := json.Marshal(tt.want)
			var wantMap map[string]any
			_ = json.Unmarshal(want, &wantMap)
			if !reflect.DeepEqual(got, wantMap) {
				t.Fatalf("decoded %s, want %s", js, want)
			}
		})
	}
}

func TestWideningKeepsASubjectsSchemaGrowing(t *testing.T) {
	f := avro.New()
	infer := func(payload string) sr.Schema {
		s, err := f.Infer("payload", "", []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		name            string
		latest, payload string
		want            string // the merged schema's payload that infers it; "" when they do not merge
	}{
		{"a member left out keeps its field", `{"a":1,"b":"x"}`, `{"a":2}`, `{"a":1,"b":"x"}`},
		{"a smaller number keeps the wider type", `{"a":5000000000}`, `{"a":1}`, `{"a":5000000000}`},
		{"a fraction widens an integer to a double", `{"a":1}`, `{"a":1.5}`, `{"a":1.5}`},
		{"new members come after the known ones", `{"a":1}`, `{"c":true,"a":1}`, `{"a":1,"c":true}`},
		{"nested records merge", `{"o":{"x":1}}`, `{"o":{"y":"z"}}`, `{"o":{"x":1,"y":"z"}}`},
		{"a string and a number do not merge", `{"a":1}`, `{"a":"one"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := f.Widen(infer(tt.latest), infer(tt.payload))
			if tt.want == "" {
				if ok {
					t.Fatalf("merged into %s, want no merge", got.Schema)
				}
				return
			}
			if !ok || got.Schema != infer(tt.want).Schema {
				t.Fatalf("merged %v into\n%s\nwant\n%s", ok, got.Schema, infer(tt.want).Schema)
			}
			if _, _, err := f.Encode(got, []byte(tt.payload)); err != nil {
				t.Fatalf("the payload does not fit the merged schema: %v", err)
			}
		})
	}
}

func TestAPayloadBufferReusedAfterInferIsEncodedAsItIsNow(t *testing.T) {
	f := avro.New()
	buf := []byte(`{"a":"x"}`)
	s, err := f.Infer("payload", "", buf)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, `{"a":"y"}`) // the caller's buffer now holds the next event
	_, data, err := f.Encode(s, buf)
	if err != nil {
		t.Fatal(err)
	}
	if js, err := f.Decode(s, nil, data); err != nil || string(js) != `{"a":"y"}` {
		t.Fatalf("encoded %s, %v; want the buffer's current document", js, err)
	}
}
