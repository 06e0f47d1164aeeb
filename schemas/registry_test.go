package schemas_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/schemas/avro"
	"github.com/outbox-relay/outbox-relay/schemas/jsonschema"
	"github.com/outbox-relay/outbox-relay/schemas/protobuf"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// withoutCoupon is the first payload of TestInferredSchemasGoThroughTheRealRegistry without its
// null member, which every format leaves out (as Debezium's JSON expansion does).
const withoutCoupon = `{"id":"o-1","total":1250,"price":12.5,"paid":true,"customer":{"name":"Ada"},"lines":[{"sku":"a","qty":2}],"tags":["x"]}`

// registryClient is a client of the shared registry that knows nothing but its URL, as a
// consumer does.
func registryClient(t *testing.T, reg interface{ ConfluentURL() string }) schemas.ClientRegistry {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(reg.ConfluentURL()))
	if err != nil {
		t.Fatal(err)
	}
	return schemas.ClientRegistry{Client: cl}
}

// TestInferredSchemasGoThroughTheRealRegistry: for each format, the schema inferred from a payload
// is one the real registry (Apicurio, Confluent-compatible API) takes with its type; a consumer
// that knows only the registry reads the relay's frames back; a member added later is a new
// version, and a member that changes type is refused (schema_incompatible) under BACKWARD.
func TestInferredSchemasGoThroughTheRealRegistry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := testenv.SharedRegistry(t)
	for _, tc := range []struct {
		name   string
		format schemas.Format
		typ    sr.SchemaType
	}{
		{"protobuf", protobuf.New(), sr.TypeProtobuf},
		{"json-schema", jsonschema.New(), sr.TypeJSON},
		{"avro", avro.New(), sr.TypeAvro},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := testenv.UniqueName(t, "orders")
			subject := topic + "-value"
			if err := reg.SetCompatibility(ctx, subject, "BACKWARD"); err != nil {
				t.Fatal(err)
			}
			ser, err := schemas.New(registryClient(t, reg), schemas.Options{
				Value: tc.format, AutoRegister: true, RecordName: "OrderCreated", RecordNamespace: "com.example.orders"})
			if err != nil {
				t.Fatal(err)
			}
			first := `{"id":"o-1","total":1250,"price":12.5,"paid":true,"coupon":null,"customer":{"name":"Ada"},"lines":[{"sku":"a","qty":2}],"tags":["x"]}`
			added := `{"id":"o-2","total":990,"price":3.5,"paid":false,"customer":{"name":"Bo"},"lines":[{"sku":"b","qty":1}],"tags":["y"],"channel":"web"}`
			changed := `{"id":"o-3","total":"twelve","price":1.5,"paid":true,"customer":{"name":"Cy"},"lines":[],"tags":[]}`

			_, v1, err := ser.Serialize(ctx, topic, "order.created", []byte("o-1"), []byte(first))
			if err != nil {
				t.Fatalf("first event: %v", err)
			}
			_, v2, err := ser.Serialize(ctx, topic, "order.created", []byte("o-2"), []byte(added))
			if err != nil {
				t.Fatalf("an event with a member added (a compatible change): %v", err)
			}
			_, _, err = ser.Serialize(ctx, topic, "order.created", []byte("o-3"), []byte(changed))
			if reason, ok := schemas.Permanent(err); !ok || reason != schemas.ReasonIncompatible {
				t.Fatalf("an event with a member of another type: err %v, want reason %s", err, schemas.ReasonIncompatible)
			}

			// The consumer: a client of its own, the registry's URL, every format.
			consumer := registryClient(t, reg)
			des := schemas.NewDeserializer(consumer, avro.New(), protobuf.New(), jsonschema.New())
			doc1, id1, err := des.Decode(ctx, v1)
			if err != nil {
				t.Fatalf("decode the first event: %v", err)
			}
			doc2, id2, err := des.Decode(ctx, v2)
			if err != nil {
				t.Fatalf("decode the second event: %v", err)
			}
			if id1 == id2 {
				t.Errorf("both events framed with schema id %d; the added member should be a new version", id1)
			}
			stored, err := consumer.SchemaByID(ctx, id1)
			if err != nil {
				t.Fatal(err)
			}
			if stored.Type != tc.typ {
				t.Errorf("the registry holds schema %d as %s, want %s", id1, stored.Type, tc.typ)
			}
			versions, err := consumer.SubjectVersions(ctx, subject)
			if err != nil || len(versions) != 2 {
				t.Errorf("subject %s has versions %v (%v), want 2", subject, versions, err)
			}
			assertSameJSON(t, doc1, withoutCoupon, tc.format.Type())
			assertSameJSON(t, doc2, added, tc.format.Type())
		})
	}
}

// TestStrictSchemasFromTheRealRegistryNameTheField: a schema written by hand and registered as
// the subject's (auto_register false) encodes a payload that fits, and a payload that does not is
// schema_mismatch naming the member.
func TestStrictSchemasFromTheRealRegistryNameTheField(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := testenv.SharedRegistry(t)
	for _, tc := range []struct {
		name   string
		format schemas.Format
		schema sr.Schema
	}{
		{"protobuf", protobuf.New(), sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
message Order {
  message Line { string sku = 1; int32 qty = 2; }
  string order_id = 1;
  repeated Line lines = 2;
  google.protobuf.Timestamp placed_at = 3;
}
`}},
		{"json-schema", jsonschema.New(), sr.Schema{Type: sr.TypeJSON, Schema: `{"$schema":"http://json-schema.org/draft-07/schema#",` +
			`"type":"object","required":["order_id"],"additionalProperties":false,"properties":{"order_id":{"type":"string"},` +
			`"placed_at":{"type":"string"},"lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer"}}}}}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := testenv.UniqueName(t, "orders")
			admin := registryClient(t, reg)
			if _, err := admin.CreateSchema(ctx, topic+"-value", tc.schema); err != nil {
				t.Fatalf("register the subject's schema: %v", err)
			}
			ser, err := schemas.New(registryClient(t, reg), schemas.Options{Value: tc.format})
			if err != nil {
				t.Fatal(err)
			}
			fits := `{"order_id":"o-1","lines":[{"sku":"a","qty":2}],"placed_at":"2026-12-06T10:00:00Z"}`
			_, v, err := ser.Serialize(ctx, topic, "order.created", []byte("o-1"), []byte(fits))
			if err != nil {
				t.Fatalf("a payload that fits: %v", err)
			}
			doc, _, err := schemas.NewDeserializer(registryClient(t, reg), protobuf.New(), jsonschema.New()).Decode(ctx, v)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			assertSameJSON(t, doc, fits, tc.format.Type())

			_, _, err = ser.Serialize(ctx, topic, "order.created", []byte("o-2"), []byte(`{"order_id":"o-2","lines":[{"sku":"a","qty":1},{"sku":"b","qty":"two"}]}`))
			var se *schemas.Error
			if !errors.As(err, &se) || se.Reason != schemas.ReasonMismatch || se.Field != "lines[1].qty" {
				t.Fatalf("a payload that does not fit: err %v, want %s naming lines[1].qty", err, schemas.ReasonMismatch)
			}
		})
	}
}

// assertSameJSON compares documents as values; Protobuf's decoded JSON names members by
// json_name, which for these schemas is the member name but for a hand-written schema is
// lowerCamelCase, so member names are compared without underscores and case there.
func assertSameJSON(t *testing.T, got []byte, want string, typ sr.SchemaType) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("decoded %s is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if typ == sr.TypeProtobuf {
		g, w = foldNames(g), foldNames(w)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("decoded %s, want %s", got, want)
	}
}

func foldNames(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, m := range x {
			key := []rune{}
			for _, r := range k {
				if r != '_' {
					if r >= 'A' && r <= 'Z' {
						r += 'a' - 'A'
					}
					key = append(key, r)
				}
			}
			out[string(key)] = foldNames(m)
		}
		return out
	case []any:
		for i := range x {
			x[i] = foldNames(x[i])
		}
	}
	return v
}

func TestValueFormatsByEncodingName(t *testing.T) {
	for enc, typ := range map[string]sr.SchemaType{"avro": sr.TypeAvro, "protobuf": sr.TypeProtobuf, "json-schema": sr.TypeJSON} {
		f, err := schemas.ValueFormat(enc)
		if err != nil || f.Type() != typ {
			t.Errorf("ValueFormat(%q) = %v, %v; want a %s format", enc, f, err, typ)
		}
	}
	if _, err := schemas.ValueFormat("json-string"); err == nil {
		t.Error("ValueFormat accepted json-string, which needs no registry")
	}
	if n := len(schemas.Formats()); n != 3 {
		t.Errorf("Formats() has %d formats, want 3", n)
	}
}
