package main

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/schemas"
)

// TestEveryRegistryValueEncodingIsFramedInItsFormat: the Serializer run builds for each registry
// value_encoding frames the value with a schema of that type in the registry (the package's
// shared registry), never leaves it as the payload.
func TestEveryRegistryValueEncodingIsFramedInItsFormat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := testenv.SharedRegistry(t)
	cl, err := sr.NewClient(sr.URLs(reg.ConfluentURL()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		encoding string
		typ      sr.SchemaType
	}{
		{config.EncodingAvro, sr.TypeAvro},
		{config.EncodingProtobuf, sr.TypeProtobuf},
		{config.EncodingJSONSchema, sr.TypeJSON},
	} {
		t.Run(tc.encoding, func(t *testing.T) {
			c := &config.Config{ValueEncoding: tc.encoding, KeyEncoding: "raw", SchemaRegistry: config.SchemaRegistry{
				URLs: []string{reg.ConfluentURL()}, Timeout: 10 * time.Second, AutoRegister: true,
				LatestRefresh: time.Minute, SubjectStrategy: "topic"}}
			ser, client, err := newSerializer(c, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			payload := []byte(`{"id":"o-1","qty":2}`)
			_, v, err := ser.Serialize(ctx, testenv.UniqueName(t, "orders"), "Created", []byte("order-1"), payload)
			if err != nil {
				t.Fatal(err)
			}
			doc, id, err := schemas.NewDeserializer(schemas.ClientRegistry{Client: cl}, schemas.Formats()...).Decode(ctx, v)
			if err != nil {
				t.Fatalf("value % x does not decode through the registry: %v", v, err)
			}
			s, err := cl.SchemaByID(ctx, id)
			if err != nil || s.Type != tc.typ {
				t.Fatalf("schema %d is %v (%v), want %s", id, s.Type, err, tc.typ)
			}
			if string(doc) != string(payload) {
				t.Errorf("decoded %s, want %s", doc, payload)
			}
		})
	}
}

// TestStrictProtobufPayloadsAreTheNamedMessage: schema_registry.protobuf_message picks the message
// of a strict subject's schema that payloads are (here the second of two), and the frame's
// message-index list names it.
func TestStrictProtobufPayloadsAreTheNamedMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := testenv.SharedRegistry(t)
	cl, err := sr.NewClient(sr.URLs(reg.ConfluentURL()))
	if err != nil {
		t.Fatal(err)
	}
	topic := testenv.UniqueName(t, "orders")
	if _, err := cl.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3";
package shop.v1;
message Audit { string who = 1; }
message Order { string id = 1; int64 total = 2; }
`}); err != nil {
		t.Fatal(err)
	}
	c := &config.Config{ValueEncoding: config.EncodingProtobuf, KeyEncoding: "raw", SchemaRegistry: config.SchemaRegistry{
		URLs: []string{reg.ConfluentURL()}, Timeout: 10 * time.Second, LatestRefresh: time.Minute, SubjectStrategy: "topic",
		ProtobufMessage: "shop.v1.Order"}}
	ser, client, err := newSerializer(c, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	_, v, err := ser.Serialize(ctx, topic, "Created", []byte("order-1"), []byte(`{"id":"o-1","total":1250}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(v) < 7 || v[5] != 2 || v[6] != 2 { // after magic and id: one index (zigzag 2), index 1 (zigzag 2)
		t.Fatalf("value % x: want the message-index list [1] (02 02) after the schema id", v)
	}
	doc, _, err := schemas.NewDeserializer(schemas.ClientRegistry{Client: cl}, schemas.Formats()...).Decode(ctx, v)
	if err != nil || string(doc) != `{"id":"o-1","total":1250}` {
		t.Fatalf("decoded %s, %v; want the order", doc, err)
	}
}
