package protobuf

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

func TestInferredSchemasCarryPayloadsThere(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload string
		want    string // the decoded JSON; empty means the payload itself
	}{
		{"scalars of every kind come back as written", `{"id":"o-1","count":3,"big":9007199254740993,"price":12.5,"paid":true}`, ""},
		{"zero values keep their presence", `{"count":0,"note":"","paid":false,"price":0.0}`, `{"count":0,"note":"","paid":false,"price":0}`},
		{"null members and empty arrays are left out", `{"id":"o-1","coupon":null,"tags":[]}`, `{"id":"o-1"}`},
		{"nested objects become nested messages", `{"customer":{"name":"Ada","address":{"city":"Paris"}}}`, ""},
		{"arrays of scalars become repeated fields", `{"tags":["a","b"],"qty":[1,2.5]}`, `{"tags":["a","b"],"qty":[1,2.5]}`},
		{"arrays of objects merge their members", `{"lines":[{"sku":"a","qty":1},{"sku":"b","note":"gift"},{"sku":"c","qty":2.5,"extra":null}]}`,
			`{"lines":[{"sku":"a","qty":1},{"sku":"b","note":"gift"},{"sku":"c","qty":2.5}]}`},
		{"member names that are no identifiers survive", `{"order-id":"x","1st":1,"_id":"y","ünï":"z","a b":true}`, ""},
		{"names that meet after cleaning stay apart", `{"a-b":1,"a_b":2,"a.b":3}`, ""},
		{"names with quotes, backslashes and control characters survive", `{"tab\tkey":1,"q\"b":2,"back\\slash":3,"del\u007f":4}`, ""},
		{"a member and a nested type of one name stay apart", `{"Address":{"x":1},"address":"s"}`, ""},
		{"an empty object is an empty message", `{"meta":{}}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f Format
			s, err := f.Infer("OrderCreated", "com.example.orders", []byte(tc.payload))
			if err != nil {
				t.Fatalf("Infer: %v", err)
			}
			index, data, err := f.Encode(s, []byte(tc.payload))
			if err != nil {
				t.Fatalf("Encode: %v\nschema:\n%s", err, s.Schema)
			}
			if !reflect.DeepEqual(index, []int{0}) {
				t.Errorf("message-index list %v, want [0] (the first message)", index)
			}
			dec, err := f.Decode(s, index, data)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			want := tc.want
			if want == "" {
				want = tc.payload
			}
			assertSameJSON(t, dec, want)
		})
	}
}

func TestInferredSchemaText(t *testing.T) {
	var f Format
	s, err := f.Infer("order created", "shop", []byte(`{"b":{"z":1},"a":"x","c":[1]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `syntax = "proto3";
package shop;

message OrderCreated {
  message B {
    optional int64 z = 17585197 [json_name = "z"];
  }
  optional string a = 797087 [json_name = "a"];
  B b = 17575513 [json_name = "b"];
  repeated int64 c = 797894 [json_name = "c"];
}
`
	if s.Type != sr.TypeProtobuf {
		t.Errorf("type = %v, want PROTOBUF", s.Type)
	}
	if s.Schema != want {
		t.Errorf("schema:\n%s\nwant:\n%s", s.Schema, want)
	}
}

func TestFieldNumbersDependOnNamesOnly(t *testing.T) {
	var f Format
	a, err := f.Infer("E", "", []byte(`{"total":1,"id":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Infer("E", "", []byte(`{"id":"y","added":true,"total":2}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(a.Schema, "\n") {
		if strings.Contains(line, "json_name") && !strings.Contains(b.Schema, line) {
			t.Errorf("field %q moved when a member was added:\n%s", line, b.Schema)
		}
	}
	c, err := f.Infer("E", "", []byte(`{"id":"z","total":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Schema != a.Schema {
		t.Errorf("members in another order gave another schema:\n%s\nand\n%s", a.Schema, c.Schema)
	}
}

func TestFieldNumberCollisionsResolveByName(t *testing.T) {
	fields := []*protoField{{key: "a"}, {key: "b"}}
	// Force a collision by numbering the same key twice: the second takes the next number.
	fields[1].key = "a"
	numberFields(fields)
	if fields[0].number == fields[1].number {
		t.Fatalf("two fields got number %d", fields[0].number)
	}
	if fields[1].number != nextNumber(fields[0].number) {
		t.Errorf("collision gave %d, want the next number %d", fields[1].number, nextNumber(fields[0].number))
	}
	for _, n := range []int{18999, 19999, fieldNumberSpace} {
		if got := nextNumber(n); got >= 19000 && got <= 19999 || got > fieldNumberSpace || got < 1 {
			t.Errorf("nextNumber(%d) = %d, a reserved or out-of-range number", n, got)
		}
	}
}

func TestInferRefusesWhatProtobufCannotSay(t *testing.T) {
	for _, tc := range []struct {
		name, payload, wantInErr string
	}{
		{"a payload that is not an object", `[1,2]`, "payload: a JSON array"},
		{"a payload that is not JSON", `{"a":`, "not JSON"},
		{"an array holding a null", `{"tags":["a",null]}`, `field tags[1]: null in an array`},
		{"an array of arrays", `{"m":[[1]]}`, `field m: an array of arrays`},
		{"an array mixing kinds", `{"v":[1,"a"]}`, `field v: an array mixing a JSON number and a JSON string`},
		{"array elements disagreeing on a member", `{"l":[{"x":1},{"x":"a"}]}`, `field l[].x: a JSON number in one array element`},
		{"nested arrays elements disagreeing", `{"l":[{"o":{"x":1}},{"o":{"x":true}}]}`, `field l[].o.x: a JSON number`},
		{"content after the value", `{"a":1} x`, "not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f Format
			_, err := f.Infer("E", "", []byte(tc.payload))
			if err == nil {
				t.Fatal("Infer succeeded")
			}
			if !errors.Is(err, ErrMismatch) {
				t.Errorf("error %q does not wrap ErrMismatch", err)
			}
			if !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("error %q does not say %q", err, tc.wantInErr)
			}
		})
	}
	var f Format
	if _, err := f.Infer("E", "com..x", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("a bad namespace gave %v, want an error naming the namespace", err)
	}
	if _, err := f.Infer("--", "", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "record name") {
		t.Errorf("a bad record name gave %v, want an error naming the record name", err)
	}
}

const strictSchema = `syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";

message Other { string x = 1; }

message Order {
  enum Status { UNKNOWN = 0; PAID = 1; }
  message Line { string sku = 1; int32 qty = 2; }
  string order_id = 1;
  int64 total_cents = 2;
  Status status = 3;
  repeated Line lines = 4;
  google.protobuf.Timestamp placed_at = 5;
  map<string, string> attrs = 6;
  bytes blob = 7;
}
`

func TestStrictSchemasEncodeTheirMessage(t *testing.T) {
	f := Format{Message: "shop.v1.Order"}
	s := sr.Schema{Schema: strictSchema, Type: sr.TypeProtobuf}
	payload := `{"order_id":"o-1","totalCents":"9007199254740993","status":"PAID","lines":[{"sku":"a","qty":2}],` +
		`"placed_at":"2026-12-06T10:00:00Z","attrs":{"k":"v"},"blob":"AAE="}`
	index, data, err := f.Encode(s, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	framed, _ := (&sr.ConfluentHeader{}).AppendEncode(nil, 7, index)
	if want := []byte{0, 0, 0, 0, 7, 2, 2}; !bytes.Equal(framed, want) { // count 1, index 1 (zigzag varints)
		t.Errorf("framing % x, want % x (the second message)", framed, want)
	}
	dec, err := f.Decode(s, index, data)
	if err != nil {
		t.Fatal(err)
	}
	assertSameJSON(t, dec, `{"orderId":"o-1","totalCents":9007199254740993,"status":"PAID","lines":[{"sku":"a","qty":2}],`+
		`"placedAt":"2026-12-06T10:00:00Z","attrs":{"k":"v"},"blob":"AAE="}`)
}

func TestStrictSchemasNameTheMemberThatDoesNotFit(t *testing.T) {
	f := Format{Message: "shop.v1.Order"}
	s := sr.Schema{Schema: strictSchema, Type: sr.TypeProtobuf}
	for _, tc := range []struct {
		name, payload, wantInErr string
	}{
		{"a member the schema has no field for", `{"order_id":"o","coupon":"x"}`, `field coupon: message shop.v1.Order has no field for it`},
		{"a string where a number belongs", `{"total_cents":"lots"}`, `field total_cents: want an integer`},
		{"a number out of a field's range", `{"lines":[{"qty":3000000000}]}`, `field lines[0].qty: want an integer (int32), got "3000000000" (out of range)`},
		{"a fraction where an integer belongs", `{"totalCents":2.5}`, `field totalCents: want an integer`},
		{"a null in a repeated field", `{"lines":[null]}`, `field lines[0]: null`},
		{"a timestamp that is none", `{"placed_at":"yesterday"}`, `field placed_at: not a google.protobuf.Timestamp`},
		{"bytes that are not base64", `{"blob":"!!"}`, `field blob: want base64`},
		{"an object where a string belongs", `{"order_id":{"a":1}}`, `field order_id: want a string, got object`},
		{"a nested member of the wrong type", `{"lines":[{"sku":"a","qty":1},{"sku":"a","qty":"two"}]}`, `field lines[1].qty: want an integer (int32), got "two"`},
		{"an unknown enum name", `{"status":"SHIPPED"}`, `field status: "SHIPPED" is not a value of enum shop.v1.Order.Status`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := f.Encode(s, []byte(tc.payload))
			if err == nil {
				t.Fatal("Encode succeeded")
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrMismatch) {
				t.Errorf("error %q is no *FieldError wrapping ErrMismatch", err)
			}
			if !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("error %q does not say %q", err, tc.wantInErr)
			}
		})
	}
}

func TestSchemasThatCannotBeUsedSaySo(t *testing.T) {
	for _, tc := range []struct {
		name      string
		message   string
		s         sr.Schema
		wantInErr string
	}{
		{"a schema that does not compile", "", sr.Schema{Schema: "syntax = \"proto3\"; message {", Type: sr.TypeProtobuf}, "does not compile"},
		{"a schema of another type", "", sr.Schema{Schema: "{}", Type: sr.TypeJSON}, "not PROTOBUF"},
		{"a message the schema lacks", "shop.v1.Nope", sr.Schema{Schema: strictSchema, Type: sr.TypeProtobuf}, "no message shop.v1.Nope"},
		{"a reference to another subject", "", sr.Schema{Schema: strictSchema, Type: sr.TypeProtobuf,
			References: []sr.SchemaReference{{Name: "other.proto", Subject: "other", Version: 1}}}, "references other.proto"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Format{Message: tc.message}
			_, _, err := f.Encode(tc.s, []byte(`{}`))
			if err == nil || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("Encode error %v, want one saying %q", err, tc.wantInErr)
			}
			if errors.Is(err, ErrMismatch) {
				t.Errorf("a schema problem %q wraps ErrMismatch (the payload is not at fault)", err)
			}
		})
	}
}

func TestDecodeRefusesBadFraming(t *testing.T) {
	var f Format
	s, err := f.Infer("E", "", []byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Decode(s, []int{3}, nil); err == nil || !strings.Contains(err.Error(), "names no message") {
		t.Errorf("an index past the schema's messages gave %v", err)
	}
	if _, err := f.Decode(s, nil, nil); err == nil {
		t.Error("an empty message-index list decoded")
	}
	if _, err := f.Decode(s, []int{0}, []byte{0xff}); err == nil {
		t.Error("a truncated message decoded")
	}
}

func assertSameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	g, err := parseJSON(got)
	if err != nil {
		t.Fatalf("decoded %s is not JSON: %v", got, err)
	}
	w, err := parseJSON([]byte(want))
	if err != nil {
		t.Fatalf("bad want %s: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("decoded %s, want %s", got, want)
	}
}
