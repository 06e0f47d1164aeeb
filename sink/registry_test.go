package sink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/redrive"
	"github.com/outbox-relay/outbox-relay/schemaregistry"
	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/schemas/avro"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestAvroThroughARealRegistry publishes Avro records through a real schema registry (Apicurio's
// Confluent-compatible API) and a real broker, and reads them back with a consumer that knows
// nothing but the registry's URL. One dedicated registry serves every case (a start costs ~8 s),
// the outage case last, since it stops it.
func TestAvroThroughARealRegistry(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	r := testenv.Registry(t)
	relayRegistry := registryClient(t, r)

	// consumer reads topic back through a registry client of its own, knowing only the URL.
	consumer := schemas.NewDeserializer(registryClient(t, r), avro.New())
	decode := func(t *testing.T, framed []byte) string {
		t.Helper()
		doc, _, err := consumer.Decode(context.Background(), framed)
		if err != nil {
			t.Fatalf("decoding % x: %v", framed[:min(len(framed), 16)], err)
		}
		return string(doc)
	}
	newAvroSink := func(t *testing.T, topic string, o schemas.Options) (*testSink, string) {
		t.Helper()
		if o.FrameOnly == "" {
			o.Value = avro.New()
		}
		ser, err := schemas.New(relayRegistry, o)
		if err != nil {
			t.Fatal(err)
		}
		dlq := testenv.UniqueName(t, "dlq")
		return readySink(t, k.Brokers(), sink.Config{
			Record:          record.Options{TopicTemplate: topic},
			DeadLetterTopic: dlq,
			Serializer:      ser,
		}), dlq
	}

	t.Run("the value and the key are Avro, and schema changes become versions while compatible", func(t *testing.T) {
		topic := testenv.UniqueName(t, "avro")
		ctx := context.Background()
		if err := r.SetCompatibility(ctx, topic+"-value", "BACKWARD"); err != nil {
			t.Fatal(err)
		}
		s, dlq := newAvroSink(t, topic, schemas.Options{AvroKey: true, AutoRegister: true, RecordNamespace: "shop"})
		payloads := []string{
			`{"id":"o1","qty":1,"address":{"city":"Oslo"}}`,
			`{"id":"o2","qty":2,"address":{"city":"Bergen"}}`,
			`{"id":"o3","qty":3,"address":{"city":"Oslo"},"note":"gift"}`, // a new field: compatible
			`{"id":"o4","qty":5000000000}`,                                // int to long: compatible
			`{"id":"o5","qty":"five"}`,                                    // a number to a string: not
			`{"id":"o6","qty":6}`,                                         // fits the widened schema: no new version
		}
		var acked atomic.Int64
		for i, p := range payloads {
			s.publish(t, newEvent(fmt.Sprintf("e%d", i), []byte("Order"), fmt.Sprintf("order-%d", i), "Created", []byte(p)), &acker{total: &acked})
		}
		eventually(t, 30*time.Second, "every event settled", func() bool { return acked.Load() == int64(len(payloads)) })

		// The incompatible event went to the failure policy, named, with its payload as written.
		dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), dlq)
		if len(dead) != 1 || dead[0].Header(sink.HeaderDLQReason) != sink.ReasonSchemaIncompatible || string(dead[0].Value) != payloads[4] {
			for _, d := range dead {
				t.Logf("dead letter %s: %s (%s)", d.Value, d.Header(sink.HeaderDLQReason), d.Header(sink.HeaderDLQError))
			}
			t.Fatalf("%d dead letters, want the fifth event with reason %s", len(dead), sink.ReasonSchemaIncompatible)
		}
		records := readBack(t, k.Brokers(), 30*time.Second, atLeast(5), topic)
		want := map[string]string{ // key -> value
			"order-0": `{"id":"o1","qty":1,"address":{"city":"Oslo"}}`,
			"order-1": `{"id":"o2","qty":2,"address":{"city":"Bergen"}}`,
			"order-2": `{"id":"o3","qty":3,"address":{"city":"Oslo"},"note":"gift"}`,
			"order-3": `{"id":"o4","qty":5000000000,"address":null,"note":null}`,
			"order-5": `{"id":"o6","qty":6,"address":null,"note":null}`,
		}
		if len(records) != len(want) {
			t.Fatalf("%d records on %s, want %d", len(records), topic, len(want))
		}
		for _, rec := range records {
			key, err := strconv.Unquote(decode(t, rec.Key))
			if err != nil {
				t.Fatalf("key %s: %v", rec.Key, err)
			}
			if got := decode(t, rec.Value); got != want[key] {
				t.Errorf("the record of %s decodes to %s, want %s", key, got, want[key])
			}
		}
		// Three versions: the first shape, the added field, the long (a subject's inferred schema
		// only grows: o4 and o6 leave members out and fit it).
		versions, err := relayRegistry.SubjectVersions(ctx, topic+"-value")
		if err != nil || len(versions) != 3 {
			t.Fatalf("subject versions %v, %v; want 3", versions, err)
		}

		// Once the rule allows the change, redrive sends the dead letter back framed as the relay
		// frames: its payload, written as JSON, is serialized on the way.
		if err := r.SetCompatibility(ctx, topic+"-value", "NONE"); err != nil {
			t.Fatal(err)
		}
		ser, err := schemas.New(relayRegistry, schemas.Options{Value: avro.New(), AvroKey: true, AutoRegister: true, RecordNamespace: "shop"})
		if err != nil {
			t.Fatal(err)
		}
		res, err := redrive.Run(ctx, redrive.Config{Brokers: []string{k.Brokers()}, DeadLetterTopic: dlq, Partition: -1, FromOffset: -1, ToOffset: -1,
			Serializer: ser, BuiltinHeaders: record.BuiltinHeaders})
		if err != nil || res.Redriven != 1 {
			t.Fatalf("redrive: %+v, %v", res, err)
		}
		back := readBack(t, k.Brokers(), 30*time.Second, atLeast(len(want)+1), topic)
		last := back[len(back)-1]
		for _, rec := range back {
			if rec.Header(redrive.Header) == "true" {
				last = rec
			}
		}
		if got := decode(t, last.Value); got != payloads[4] || decode(t, last.Key) != `"order-4"` {
			t.Fatalf("the redriven record decodes to %s (key %s), want %s", got, decode(t, last.Key), payloads[4])
		}
	})

	t.Run("a payload that does not fit the strict schema goes to the failure policy naming the field", func(t *testing.T) {
		topic := testenv.UniqueName(t, "strict")
		ctx := context.Background()
		if _, err := relayRegistry.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeAvro,
			Schema: `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`}); err != nil {
			t.Fatal(err)
		}
		s, dlq := newAvroSink(t, topic, schemas.Options{})
		var acked atomic.Int64
		for i, p := range []string{`{"id":"o1","qty":1}`, `{"id":"o2","qty":"two"}`, `{"id":"o3","qty":3}`} {
			s.publish(t, newEvent(fmt.Sprintf("e%d", i), []byte("Order"), "order", "Created", []byte(p)), &acker{total: &acked})
		}
		eventually(t, 30*time.Second, "every event settled", func() bool { return acked.Load() == 3 })
		records := readBack(t, k.Brokers(), 30*time.Second, atLeast(2), topic)
		if len(records) != 2 || decode(t, records[0].Value) != `{"id":"o1","qty":1}` || decode(t, records[1].Value) != `{"id":"o3","qty":3}` {
			t.Fatalf("records %+v", records)
		}
		dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), dlq)
		if len(dead) != 1 || dead[0].Header(sink.HeaderDLQReason) != sink.ReasonSchemaMismatch || !strings.Contains(dead[0].Header(sink.HeaderDLQError), "field qty") {
			t.Fatalf("dead letters %+v, want one with reason %s naming field qty", dead, sink.ReasonSchemaMismatch)
		}

		// Redrive without the registry would send the JSON payload back unframed: it refuses.
		rc := redrive.Config{Brokers: []string{k.Brokers()}, DeadLetterTopic: dlq, Partition: -1, FromOffset: -1, ToOffset: -1,
			BuiltinHeaders: record.BuiltinHeaders}
		if res, err := redrive.Run(ctx, rc); err != nil || res.Redriven != 0 || len(res.Failed) != 1 || !strings.Contains(res.Failed[0].Err.Error(), "schema_registry") {
			t.Fatalf("redrive without a registry: %+v, %v; want the dead letter refused, naming schema_registry", res, err)
		}
		// Once the subject has a version the payload fits, redrive sends it back framed with it
		// (a payload that did not fit the registry's schema is not a row that lacked a column).
		if _, err := relayRegistry.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeAvro,
			Schema: `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"qty","type":["int","string"]}]}`}); err != nil {
			t.Fatal(err)
		}
		ser, err := schemas.New(relayRegistry, schemas.Options{Value: avro.New()})
		if err != nil {
			t.Fatal(err)
		}
		rc.Serializer = ser
		if res, err := redrive.Run(ctx, rc); err != nil || res.Redriven != 1 {
			t.Fatalf("redrive: %+v, %v; want the dead letter back", res, err)
		}
		back := readBack(t, k.Brokers(), 30*time.Second, atLeast(3), topic)
		if len(back) != 3 || decode(t, back[2].Value) != `{"id":"o2","qty":"two"}` {
			t.Fatalf("%d records, want the redriven one third, decoding to the payload", len(back))
		}
	})

	t.Run("protobuf and json-schema values go through the registry and the broker alike", func(t *testing.T) {
		// A consumer that knows only the registry's URL and reads every format.
		anyFormat := schemas.NewDeserializer(registryClient(t, r), schemas.Formats()...)
		for _, enc := range []string{schemas.EncodingProtobuf, schemas.EncodingJSONSchema} {
			topic := testenv.UniqueName(t, enc)
			ctx := context.Background()
			if err := r.SetCompatibility(ctx, topic+"-value", "BACKWARD"); err != nil {
				t.Fatal(err)
			}
			f, err := schemas.ValueFormat(enc)
			if err != nil {
				t.Fatal(err)
			}
			ser, err := schemas.New(relayRegistry, schemas.Options{Value: f, AvroKey: true, AutoRegister: true, RecordNamespace: "shop"})
			if err != nil {
				t.Fatal(err)
			}
			dlq := testenv.UniqueName(t, "dlq")
			s := readySink(t, k.Brokers(), sink.Config{Record: record.Options{TopicTemplate: topic}, DeadLetterTopic: dlq, Serializer: ser})
			payloads := []string{
				`{"id":"o1","qty":1,"address":{"city":"Oslo"}}`,
				`{"id":"o2","qty":2,"address":{"city":"Bergen"},"note":"gift"}`, // a new member: compatible
				`{"id":"o3","qty":"three","address":{"city":"Oslo"}}`,           // a number to a string: not
				`{"id":"o4","qty":4,"address":{"city":"Oslo"}}`,                 // the first shape: the subject's schema again
				`{"id":"o5","qty":null}`,                                        // members left out or null: likewise
			}
			var acked atomic.Int64
			for i, p := range payloads {
				s.publish(t, newEvent(fmt.Sprintf("e%d", i), []byte("Order"), fmt.Sprintf("order-%d", i), "Created", []byte(p)), &acker{total: &acked})
			}
			eventually(t, 30*time.Second, enc+": every event settled", func() bool { return acked.Load() == int64(len(payloads)) })
			dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), dlq)
			if len(dead) != 1 || dead[0].Header(sink.HeaderDLQReason) != sink.ReasonSchemaIncompatible || string(dead[0].Value) != payloads[2] {
				t.Fatalf("%s: %d dead letters, want the third event with reason %s", enc, len(dead), sink.ReasonSchemaIncompatible)
			}
			records := readBack(t, k.Brokers(), 30*time.Second, atLeast(4), topic)
			want := map[string]string{"order-0": payloads[0], "order-1": payloads[1], "order-3": payloads[3], "order-4": `{"id":"o5"}`}
			if len(records) != len(want) {
				t.Fatalf("%s: %d records on %s, want %d", enc, len(records), topic, len(want))
			}
			for _, rec := range records {
				keyDoc, _, err := anyFormat.Decode(ctx, rec.Key)
				if err != nil {
					t.Fatalf("%s: key % x: %v", enc, rec.Key, err)
				}
				key, err := strconv.Unquote(string(keyDoc))
				if err != nil {
					t.Fatalf("%s: key %s: %v", enc, keyDoc, err)
				}
				doc, id, err := anyFormat.Decode(ctx, rec.Value)
				if err != nil {
					t.Fatalf("%s: the record of %s: %v", enc, key, err)
				}
				var got, exp any
				if json.Unmarshal(doc, &got) != nil || json.Unmarshal([]byte(want[key]), &exp) != nil || !reflect.DeepEqual(got, exp) {
					t.Errorf("%s: the record of %s (schema %d) decodes to %s, want %s", enc, key, id, doc, want[key])
				}
			}
			versions, err := relayRegistry.SubjectVersions(ctx, topic+"-value")
			if err != nil || len(versions) != 2 {
				t.Fatalf("%s: subject versions %v, %v; want 2", enc, versions, err)
			}
			latest, err := relayRegistry.SchemaByVersion(ctx, topic+"-value", -1)
			if err != nil || latest.Type != f.Type() {
				t.Fatalf("%s: the registry holds the subject's schema as %v (%v), want %s", enc, latest.Type, err, f.Type())
			}
			s.mustClose(t)
		}
	})

	t.Run("strict protobuf and json-schema subjects take what fits and name the field of what does not", func(t *testing.T) {
		anyFormat := schemas.NewDeserializer(registryClient(t, r), schemas.Formats()...)
		for _, tc := range []struct {
			encoding string
			schema   sr.Schema
		}{
			// A well-known import: the registry takes it without a reference, and so does the relay.
			{schemas.EncodingProtobuf, sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
message Order {
  message Line { string sku = 1; int32 qty = 2; }
  string id = 1;
  repeated Line lines = 2;
  google.protobuf.Timestamp placed_at = 3 [json_name = "placed_at"];
}
`}},
			{schemas.EncodingJSONSchema, sr.Schema{Type: sr.TypeJSON, Schema: `{"$schema":"http://json-schema.org/draft-07/schema#",` +
				`"type":"object","required":["id"],"additionalProperties":false,"properties":{"id":{"type":"string"},"placed_at":{"type":"string"},` +
				`"lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer"}}}}}}`}},
		} {
			topic := testenv.UniqueName(t, "strict-"+tc.encoding)
			ctx := context.Background()
			if _, err := relayRegistry.CreateSchema(ctx, topic+"-value", tc.schema); err != nil {
				t.Fatalf("%s: register the subject's schema: %v", tc.encoding, err)
			}
			f, err := schemas.ValueFormat(tc.encoding)
			if err != nil {
				t.Fatal(err)
			}
			ser, err := schemas.New(relayRegistry, schemas.Options{Value: f})
			if err != nil {
				t.Fatal(err)
			}
			dlq := testenv.UniqueName(t, "dlq")
			s := readySink(t, k.Brokers(), sink.Config{Record: record.Options{TopicTemplate: topic}, DeadLetterTopic: dlq, Serializer: ser})
			payloads := []string{
				`{"id":"o1","lines":[{"sku":"a","qty":2}],"placed_at":"2026-12-06T10:00:00Z"}`,
				`{"id":"o2","lines":[{"sku":"a","qty":1},{"sku":"b","qty":"two"}]}`,
			}
			var acked atomic.Int64
			for i, p := range payloads {
				s.publish(t, newEvent(fmt.Sprintf("e%d", i), []byte("Order"), "order", "Created", []byte(p)), &acker{total: &acked})
			}
			eventually(t, 30*time.Second, tc.encoding+": every event settled", func() bool { return acked.Load() == int64(len(payloads)) })
			records := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), topic)
			if len(records) != 1 {
				t.Fatalf("%s: %d records, want 1", tc.encoding, len(records))
			}
			doc, _, err := anyFormat.Decode(ctx, records[0].Value)
			var got, exp any
			if err != nil || json.Unmarshal(doc, &got) != nil || json.Unmarshal([]byte(payloads[0]), &exp) != nil || !reflect.DeepEqual(got, exp) {
				t.Errorf("%s: the record decodes to %s (%v), want %s", tc.encoding, doc, err, payloads[0])
			}
			dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), dlq)
			if len(dead) != 1 || dead[0].Header(sink.HeaderDLQReason) != sink.ReasonSchemaMismatch || !strings.Contains(dead[0].Header(sink.HeaderDLQError), "field lines[1].qty") {
				t.Fatalf("%s: dead letters %+v, want one with reason %s naming field lines[1].qty", tc.encoding, dead, sink.ReasonSchemaMismatch)
			}
			s.mustClose(t)
		}
	})

	t.Run("a strict subject's new version serves the first event that needs it, not the cached latest", func(t *testing.T) {
		// The relay's own client, whose latest is cached like the serializer's: a version
		// registered since is read before an event that fits only it is called a mismatch.
		topic := testenv.UniqueName(t, "newversion")
		ctx := context.Background()
		v1 := `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"}]}`
		v2 := `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"note","type":"string","default":""}]}`
		if _, err := relayRegistry.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeAvro, Schema: v1}); err != nil {
			t.Fatal(err)
		}
		client, err := schemaregistry.New(schemaregistry.Options{URLs: []string{r.ConfluentURL()}, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		ser, err := schemas.New(client, schemas.Options{Value: avro.New()})
		if err != nil {
			t.Fatal(err)
		}
		dlq := testenv.UniqueName(t, "dlq")
		s := readySink(t, k.Brokers(), sink.Config{Record: record.Options{TopicTemplate: topic}, DeadLetterTopic: dlq, Serializer: ser})
		var acked atomic.Int64
		s.publish(t, newEvent("e0", []byte("Order"), "order", "Created", []byte(`{"id":"o1"}`)), &acker{total: &acked})
		eventually(t, 30*time.Second, "the first event settled", func() bool { return acked.Load() == 1 })
		if _, err := relayRegistry.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeAvro, Schema: v2}); err != nil {
			t.Fatal(err)
		}
		for i, p := range []string{`{"id":"o2","note":"gift"}`, `{"id":"o3","lines":1}`} {
			s.publish(t, newEvent(fmt.Sprintf("e%d", i+1), []byte("Order"), "order", "Created", []byte(p)), &acker{total: &acked})
		}
		eventually(t, 30*time.Second, "every event settled", func() bool { return acked.Load() == 3 })
		// A payload that fits no version is still the event's fault, naming the field; the one
		// that fits the new version is not.
		dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), dlq)
		if len(dead) != 1 || dead[0].Header(sink.HeaderDLQReason) != sink.ReasonSchemaMismatch || !strings.Contains(dead[0].Header(sink.HeaderDLQError), "field lines") {
			for _, d := range dead {
				t.Logf("dead letter %s: %s (%s)", d.Value, d.Header(sink.HeaderDLQReason), d.Header(sink.HeaderDLQError))
			}
			t.Fatalf("%d dead letters, want only the third event's, naming field lines", len(dead))
		}
		records := readBack(t, k.Brokers(), 30*time.Second, atLeast(2), topic)
		if len(records) != 2 || decode(t, records[1].Value) != `{"id":"o2","note":"gift"}` {
			t.Fatalf("%d records on %s, want 2, the second framed with the subject's new version", len(records), topic)
		}
		s.mustClose(t)
	})

	t.Run("frame-only mode frames the application's Avro bytes with the subject's schema id", func(t *testing.T) {
		topic := testenv.UniqueName(t, "frame")
		ctx := context.Background()
		if _, err := relayRegistry.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeAvro,
			Schema: `{"type":"record","name":"Count","fields":[{"name":"n","type":"long"}]}`}); err != nil {
			t.Fatal(err)
		}
		s, _ := newAvroSink(t, topic, schemas.Options{FrameOnly: schemas.FrameBytes})
		var acked atomic.Int64
		s.publish(t, newEvent("e0", []byte("Count"), "c", "Counted", []byte{0x0e}), &acker{total: &acked}) // {"n": 7}, as the application wrote it
		eventually(t, 30*time.Second, "the event settled", func() bool { return acked.Load() == 1 })
		records := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), topic)
		if len(records) != 1 || decode(t, records[0].Value) != `{"n":7}` {
			t.Fatalf("records %+v, want one decoding to {\"n\":7}", records)
		}
	})

	t.Run("redrive frames a frame-only dead letter the sink never framed, even when its bytes start with a zero", func(t *testing.T) {
		// {"n": 0, "s": "abcd"} in Avro starts 00 08: five bytes or more after a zero look like a
		// frame (magic byte 0, an id); only the dead letter can say the sink never framed them.
		topic := testenv.UniqueName(t, "frameredrive")
		ctx := context.Background()
		if _, err := relayRegistry.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeAvro,
			Schema: `{"type":"record","name":"Pair","fields":[{"name":"n","type":"long"},{"name":"s","type":"string"}]}`}); err != nil {
			t.Fatal(err)
		}
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
		o := schemas.Options{FrameOnly: schemas.FrameBytes}
		s, dlq := newAvroSink(t, topic, o)
		var acked atomic.Int64
		data := []byte{0x00, 0x08, 'a', 'b', 'c', 'd'}
		if err := s.Reject(ctx, newEvent("e0", []byte("Pair"), "p", "Paired", data), sink.ReasonInvalidTimestamp, errors.New("a row past max_attempts"), &acker{total: &acked}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the event settled", func() bool { return acked.Load() == 1 })
		s.mustClose(t)
		ser, err := schemas.New(relayRegistry, o)
		if err != nil {
			t.Fatal(err)
		}
		res, err := redrive.Run(ctx, redrive.Config{Brokers: []string{k.Brokers()}, DeadLetterTopic: dlq, Partition: -1, FromOffset: -1, ToOffset: -1,
			Serializer: ser, BuiltinHeaders: record.BuiltinHeaders})
		if err != nil || res.Redriven != 1 {
			t.Fatalf("redrive: %+v, %v", res, err)
		}
		back := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), topic)
		if len(back) != 1 {
			t.Fatalf("%d records on %s, want the redriven one", len(back), topic)
		}
		doc, _, err := consumer.Decode(ctx, back[0].Value)
		if err != nil || string(doc) != `{"n":0,"s":"abcd"}` {
			t.Fatalf("the redriven record % x decodes to %s, %v; want it framed, decoding to {\"n\":0,\"s\":\"abcd\"}", back[0].Value, doc, err)
		}
	})

	t.Run("a registry stopped mid-stream holds the stream, and it resumes with nothing lost or unframed", func(t *testing.T) {
		topic := testenv.UniqueName(t, "outage")
		// Every event is a subject of its own (the record strategy, an event type each), so every
		// event needs the registry.
		s, _ := newAvroSink(t, topic, schemas.Options{AutoRegister: true, Strategy: schemas.StrategyRecord, RecordNamespace: topic})
		var acked, published atomic.Int64
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		finished := make(chan struct{})
		defer func() { cancel(); <-finished }() // a failed test stops the publisher before it ends
		go func() {
			defer close(finished)
			for i := 0; ; i++ {
				ev := newEvent(fmt.Sprintf("e%d", i), []byte("Order"), "order", fmt.Sprintf("E%d", i), fmt.Appendf(nil, `{"seq":%d}`, i))
				if err := s.Publish(ctx, ev, &acker{total: &acked}); err != nil {
					done <- err
					return
				}
				published.Add(1)
			}
		}()
		eventually(t, 30*time.Second, "events flowing before the outage", func() bool { return acked.Load() >= 20 })
		stopCtx, stopCancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer stopCancel()
		if err := r.Stop(stopCtx); err != nil {
			t.Fatal(err)
		}
		// The stream holds: the sink says it waits for the registry, and publishes nothing more.
		eventually(t, 30*time.Second, "the sink waiting for the registry", func() bool {
			return s.logs.FilterMessageSnippet("schema registry cannot serve the event").Len() > 0
		})
		held := published.Load()
		eventually(t, 10*time.Second, "everything handed over acknowledged", func() bool { return acked.Load() == held })
		// Readiness names the wait once it lasts (registryGrace), without the error's text.
		eventually(t, 30*time.Second, "readiness naming the wait for the registry", func() bool {
			why, stalled := s.Stalled()
			return stalled && strings.Contains(why, "waiting for the schema registry") && !strings.Contains(why, "127.0.0.1")
		})
		if err := r.Start(stopCtx); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "the stream resuming", func() bool { return acked.Load() >= held+20 })
		cancel()
		if err := <-done; err != context.Canceled {
			t.Fatalf("Publish: %v", err)
		}
		s.mustClose(t)
		total := int(acked.Load())
		records := readBack(t, k.Brokers(), 30*time.Second, atLeast(total), topic)
		if len(records) != total {
			t.Fatalf("%d records, %d acknowledged", len(records), total)
		}
		for i, rec := range records {
			var doc struct{ Seq int }
			if err := json.Unmarshal([]byte(decode(t, rec.Value)), &doc); err != nil || doc.Seq != i {
				t.Fatalf("record %d: seq %d (%v): an event lost or out of order", i, doc.Seq, err)
			}
		}
	})
}

// registryClient is a client of r's Confluent-compatible API that knows nothing but its URL.
func registryClient(t *testing.T, r *devenv.Registry) schemas.ClientRegistry {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(r.ConfluentURL()), sr.HTTPClient(&http.Client{Timeout: 5 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	return schemas.ClientRegistry{Client: cl}
}
