package jsonschema

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

func TestInferredSchemasAcceptTheirPayloads(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload string
		want    string // the data written; empty means the payload itself
	}{
		{"scalars of every kind", `{"id":"o-1","count":3,"big":9007199254740993,"price":12.5,"paid":true}`, ""},
		{"nested objects", `{"customer":{"name":"Ada","address":{"city":"Paris"}}}`, ""},
		{"arrays of scalars and of mixed kinds", `{"tags":["a","b"],"mixed":[1,"x",null,true]}`, ""},
		{"arrays of objects with a member null in one element", `{"lines":[{"sku":"a","qty":1},{"sku":"b","qty":null,"note":"gift"}]}`, ""},
		{"null members and empty arrays are left out", `{"id":"o-1","coupon":null,"tags":[],"c":{"d":null}}`, `{"c":{},"id":"o-1"}`},
		{"a payload that is no object", `["a",1]`, ""},
		{"member names of any text", `{"order-id":"x","ünï":"z","a \"b\"":true}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New()
			s, err := f.Infer("OrderCreated", "com.example", []byte(tc.payload))
			if err != nil {
				t.Fatalf("Infer: %v", err)
			}
			index, data, err := f.Encode(s, []byte(tc.payload))
			if err != nil {
				t.Fatalf("Encode: %v\nschema: %s", err, s.Schema)
			}
			if index != nil {
				t.Errorf("index %v, want none", index)
			}
			want := tc.want
			if want == "" {
				want = tc.payload
			}
			if string(data) != want {
				t.Errorf("data %s, want %s", data, want)
			}
			dec, err := f.Decode(s, nil, data)
			if err != nil || string(dec) != string(data) {
				t.Errorf("Decode = %s, %v; want the data back", dec, err)
			}
		})
	}
}

func TestInferredSchemaText(t *testing.T) {
	s, err := New().Infer("OrderCreated", "shop", []byte(`{"b":{"z":1},"a":"x","c":[1,"y"],"n":null,"l":[{"q":1},{"q":null}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"$schema":"http://json-schema.org/draft-07/schema#","title":"shop.OrderCreated","type":"object","properties":{` +
		`"a":{"type":"string"},` +
		`"b":{"type":"object","properties":{"z":{"type":"number"}},"additionalProperties":false},` +
		`"c":{"type":"array","items":{"type":["number","string"]}},` +
		`"l":{"type":"array","items":{"type":"object","properties":{"q":{"type":["null","number"]}},"additionalProperties":false}}` +
		`},"additionalProperties":false}`
	if s.Type != sr.TypeJSON {
		t.Errorf("type = %v, want JSON", s.Type)
	}
	if s.Schema != want {
		t.Errorf("schema:\n%s\nwant:\n%s", s.Schema, want)
	}
	again, err := New().Infer("OrderCreated", "shop", []byte(`{"n":null,"l":[{"q":1},{"q":null}],"c":[1,"y"],"a":"x","b":{"z":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if again.Schema != s.Schema {
		t.Errorf("members in another order gave another schema:\n%s", again.Schema)
	}
}

const strictSchema = `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object",
  "required": ["order_id"],
  "properties": {
    "order_id": {"type": "string"},
    "total": {"type": "integer", "minimum": 0},
    "coupon": {"type": ["string", "null"]},
    "lines": {"type": "array", "items": {"$ref": "#/definitions/line"}}
  },
  "additionalProperties": false,
  "definitions": {
    "line": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}}
  }
}`

func TestStrictSchemasNameTheMemberThatDoesNotFit(t *testing.T) {
	f := New()
	s := sr.Schema{Schema: strictSchema, Type: sr.TypeJSON}
	for _, tc := range []struct {
		name, payload, wantPath, wantInErr string
	}{
		{"a member the schema has no property for", `{"order_id":"o","gift":true}`, "gift", "allows no others"},
		{"a required member missing", `{"total":1}`, "order_id", "requires it"},
		{"a value of the wrong type", `{"order_id":"o","total":"lots"}`, "total", "want integer"},
		{"a value breaking a bound", `{"order_id":"o","total":-1}`, "total", "minimum"},
		{"a nested member in an array element", `{"order_id":"o","lines":[{"sku":"a","qty":1},{"sku":"b","qty":"two"}]}`, "lines[1].qty", "want integer"},
		{"a payload that is not JSON", `{"order_id":`, "", "not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := f.Encode(s, []byte(tc.payload))
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Encode error %v, want a *FieldError", err)
			}
			if !errors.Is(err, ErrMismatch) {
				t.Errorf("error %q does not wrap ErrMismatch", err)
			}
			if fe.Path != tc.wantPath || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("error %q (path %q), want path %q and %q", err, fe.Path, tc.wantPath, tc.wantInErr)
			}
		})
	}
	// A null that the schema allows stays; one it does not is left out where that makes it fit.
	for payload, want := range map[string]string{
		`{"order_id":"o","coupon":null}`: `{"order_id":"o","coupon":null}`,
		`{"order_id":"o","total":null}`:  `{"order_id":"o"}`,
	} {
		_, data, err := f.Encode(s, []byte(payload))
		if err != nil || string(data) != want {
			t.Errorf("Encode(%s) = %s, %v; want %s", payload, data, err, want)
		}
	}
}

func TestSchemasThatCannotBeUsedSaySo(t *testing.T) {
	for _, tc := range []struct {
		name      string
		s         sr.Schema
		wantInErr string
	}{
		{"a schema that is not JSON", sr.Schema{Schema: `{"type":`, Type: sr.TypeJSON}, "not JSON"},
		{"a schema that breaks the meta-schema", sr.Schema{Schema: `{"type":5}`, Type: sr.TypeJSON}, "does not compile"},
		{"a schema of another type", sr.Schema{Schema: `{}`, Type: sr.TypeProtobuf}, "not JSON"},
		{"a $ref outside the schema", sr.Schema{Schema: `{"$ref":"https://example.com/s.json"}`, Type: sr.TypeJSON}, "outside itself"},
		{"a reference to another subject", sr.Schema{Schema: `{}`, Type: sr.TypeJSON,
			References: []sr.SchemaReference{{Name: "line.json", Subject: "line", Version: 1}}}, "references line.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := New().Encode(tc.s, []byte(`{}`))
			if err == nil || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("Encode error %v, want one saying %q", err, tc.wantInErr)
			}
			if errors.Is(err, ErrMismatch) {
				t.Errorf("a schema problem %q wraps ErrMismatch (the payload is not at fault)", err)
			}
		})
	}
	if _, err := New().Decode(sr.Schema{Type: sr.TypeJSON}, nil, []byte(`{"a":`)); err == nil {
		t.Error("Decode accepted data that is not JSON")
	}
}

func TestPathsTellIndexesFromMembers(t *testing.T) {
	doc, _ := parseJSON([]byte(`{"a":[{"0":{"b":1}}]}`))
	if got := path(doc, []string{"a", "0", "0", "b"}); got != "a[0].0.b" {
		t.Errorf("path = %q, want a[0].0.b", got)
	}
	if got := path(doc, nil); got != "" {
		t.Errorf("path of the document = %q, want empty", got)
	}
}
