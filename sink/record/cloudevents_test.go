package record

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
)

var ceCommit = time.Date(2026, 1, 13, 13, 55, 39, 738_123_000, time.FixedZone("CET", 3600))

func ceEvent(payload string) *decoder.Event {
	ev := &decoder.Event{ID: []byte("4d47e190-0402-4048-bc2c-89dd54343cdc"), AggregateType: []byte("order"),
		AggregateID: []byte("o-1"), EventType: []byte("OrderCreated"), Payload: []byte(payload)}
	ev.Tx.CommitTime = ceCommit
	return ev
}

func headerMap(hs []kafka.Header) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}

func TestStructuredCloudEventsAreDebeziumsEnvelopeAroundTheEncodedValue(t *testing.T) {
	tests := []struct {
		name     string
		encoding Encoding
		ce       CloudEvents
		payload  string
		want     string
	}{
		{"raw: the payload is the data as it is", Raw, CloudEvents{}, `{"id": 1}`,
			`{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","source":"/outbox-relay/order","specversion":"1.0","type":"OrderCreated","time":"2026-01-13T12:55:39.738Z","datacontenttype":"application/json","data":{"id": 1}}`},
		{"json-string: the data is the payload's text as a JSON string, as Debezium's converter writes an unexpanded payload", JSONString, CloudEvents{}, `{"id": 1}`,
			`{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","source":"/outbox-relay/order","specversion":"1.0","type":"OrderCreated","time":"2026-01-13T12:55:39.738Z","datacontenttype":"application/json","data":"{\"id\": 1}"}`},
		{"json-expanded: the data is the expanded document", JSONExpanded, CloudEvents{}, `{"id": 1, "n": null}`,
			`{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","source":"/outbox-relay/order","specversion":"1.0","type":"OrderCreated","time":"2026-01-13T12:55:39.738Z","datacontenttype":"application/json","data":{"id":1}}`},
		{"json-with-schema: the data is Connect's schema and payload", JSONWithSchema, CloudEvents{}, `{"id": 1}`,
			`{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","source":"/outbox-relay/order","specversion":"1.0","type":"OrderCreated","time":"2026-01-13T12:55:39.738Z","datacontenttype":"application/json","data":{"schema":{"type":"struct","fields":[{"type":"int32","optional":true,"field":"id"}],"optional":true,"name":"payload"},"payload":{"id":1}}}`},
		{"templates: source, type and subject from the event's values", Raw,
			CloudEvents{Source: "https://shop.example/{aggregate_type}s", Type: "com.example.{aggregate_type}.{event_type}", Subject: "{aggregate_id}"}, `1`,
			`{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","source":"https://shop.example/orders","specversion":"1.0","type":"com.example.order.OrderCreated","time":"2026-01-13T12:55:39.738Z","datacontenttype":"application/json","subject":"o-1","data":1}`},
		{"a data content type that is not JSON: the payload goes base64 in data_base64", Raw, CloudEvents{DataContentType: "application/octet-stream"}, "\x00\x01",
			`{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","source":"/outbox-relay/order","specversion":"1.0","type":"OrderCreated","time":"2026-01-13T12:55:39.738Z","datacontenttype":"application/octet-stream","data_base64":"AAE="}`},
		{"a +json media type holds JSON data", Raw, CloudEvents{DataContentType: "application/vnd.shop+json; charset=utf-8"}, `[1]`,
			`{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","source":"/outbox-relay/order","specversion":"1.0","type":"OrderCreated","time":"2026-01-13T12:55:39.738Z","datacontenttype":"application/vnd.shop+json; charset=utf-8","data":[1]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ce := tt.ce
			b := newBuilder(t, Options{ValueEncoding: tt.encoding, CloudEvents: &ce})
			r := b.Build(ceEvent(tt.payload), time.Now())
			if r.EnvelopeErr != nil {
				t.Fatal(r.EnvelopeErr)
			}
			if string(r.Msg.Value) != tt.want {
				t.Errorf("value\n got %s\nwant %s", r.Msg.Value, tt.want)
			}
			if !json.Valid(r.Msg.Value) {
				t.Errorf("value is not JSON: %s", r.Msg.Value)
			}
			h := headerMap(r.Msg.Headers)
			if h["content-type"] != "application/cloudevents+json; charset=UTF-8" {
				t.Errorf("content-type = %q, want the JSON event format's", h["content-type"])
			}
			if h["id"] != "4d47e190-0402-4048-bc2c-89dd54343cdc" || h["event_type"] != "OrderCreated" {
				t.Errorf("the relay's own headers are gone: %v", h)
			}
			if _, ok := h["ce_id"]; ok {
				t.Errorf("structured mode carries ce_ headers: %v", h)
			}
		})
	}
}

func TestBinaryCloudEventsCarryTheAttributesInCEHeadersAndTheValueAsItIs(t *testing.T) {
	b := newBuilder(t, Options{ValueEncoding: JSONString, CloudEvents: &CloudEvents{Mode: CloudEventsBinary, Subject: "{aggregate_id}"}})
	ev := ceEvent(`{"id": 1}`)
	ev.SpanContext = []byte("traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\ntracestate=a=b")
	r := b.Build(ev, time.Now())
	if r.EnvelopeErr != nil {
		t.Fatal(r.EnvelopeErr)
	}
	if want := `"{\"id\": 1}"`; string(r.Msg.Value) != want {
		t.Errorf("value = %s, want the json-string value %s", r.Msg.Value, want)
	}
	want := map[string]string{
		"ce_specversion": "1.0", "ce_id": "4d47e190-0402-4048-bc2c-89dd54343cdc", "ce_source": "/outbox-relay/order",
		"ce_type": "OrderCreated", "ce_time": "2026-01-13T12:55:39.738Z", "ce_subject": "o-1", "content-type": "application/json",
		"ce_traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "ce_tracestate": "a=b",
		"id": "4d47e190-0402-4048-bc2c-89dd54343cdc", "event_type": "OrderCreated", "aggregate_type": "order",
	}
	got := headerMap(r.Msg.Headers)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestATombstoneStaysATombstoneWithItsAttributesInHeaders(t *testing.T) {
	for _, mode := range []string{CloudEventsStructured, CloudEventsBinary} {
		t.Run(mode, func(t *testing.T) {
			b := newBuilder(t, Options{TombstoneOnEmptyPayload: true, CloudEvents: &CloudEvents{Mode: mode}})
			r := b.Build(ceEvent(""), time.Now())
			if r.EnvelopeErr != nil {
				t.Fatal(r.EnvelopeErr)
			}
			if r.Msg.Value != nil {
				t.Errorf("value = %q, want a tombstone", r.Msg.Value)
			}
			h := headerMap(r.Msg.Headers)
			if h["ce_id"] == "" || h["ce_type"] != "OrderCreated" {
				t.Errorf("headers %v lack the attributes", h)
			}
			if _, ok := h["content-type"]; ok {
				t.Errorf("a tombstone has no data, so no content-type: %v", h)
			}
		})
	}
}

func TestAnEventThatCannotBeACloudEventIsRefusedNotPublishedBare(t *testing.T) {
	tests := []struct {
		name   string
		ce     CloudEvents
		edit   func(*decoder.Event)
		reason string // in the error
	}{
		{"an empty event type leaves the required type empty", CloudEvents{}, func(ev *decoder.Event) { ev.EventType = nil }, "type"},
		{"an event id that is not UTF-8", CloudEvents{}, func(ev *decoder.Event) { ev.ID = []byte{0xff, 'a'} }, "event id"},
		{"an aggregate type with a space makes the source no URI-reference", CloudEvents{}, func(ev *decoder.Event) { ev.AggregateType = []byte("big order") }, "URI-reference"},
		{"a payload that is not JSON while the data content type says JSON", CloudEvents{}, func(ev *decoder.Event) { ev.Payload = []byte("not json") }, "not JSON"},
		{"a headers member named like an attribute header", CloudEvents{Mode: CloudEventsBinary}, func(ev *decoder.Event) { ev.Headers = []byte(`{"ce_type":"x"}`) }, "ce_type"},
		{"a headers member named content-type", CloudEvents{}, func(ev *decoder.Event) { ev.Headers = []byte(`{"Content-Type":"text/plain"}`) }, "content-type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ce := tt.ce
			b := newBuilder(t, Options{CloudEvents: &ce})
			ev := ceEvent(`{"id": 1}`)
			tt.edit(ev)
			r := b.Build(ev, time.Now())
			if r.EnvelopeErr == nil {
				t.Fatalf("no envelope error; value %s, headers %v", r.Msg.Value, headerMap(r.Msg.Headers))
			}
			if !strings.Contains(r.EnvelopeErr.Error(), tt.reason) {
				t.Errorf("error %q does not name %q", r.EnvelopeErr, tt.reason)
			}
		})
	}
}

func TestCloudEventsOptionsAreCheckedAtStart(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"an unknown mode", Options{CloudEvents: &CloudEvents{Mode: "batch"}}, "mode"},
		{"an unknown placeholder", Options{CloudEvents: &CloudEvents{Type: "{aggregate}"}}, "unknown placeholder"},
		{"an unclosed placeholder", Options{CloudEvents: &CloudEvents{Source: "/x/{event_type"}}, "unclosed"},
		{"a constant source that is no URI-reference", Options{CloudEvents: &CloudEvents{Source: "my source"}}, "URI-reference"},
		{"a data content type that is no media type", Options{CloudEvents: &CloudEvents{DataContentType: "json"}}, "media type"},
		{"a JSON encoding with a data content type that is not JSON", Options{ValueEncoding: JSONExpanded, CloudEvents: &CloudEvents{DataContentType: "application/avro"}}, "not JSON"},
		{"an extra header named like an attribute header", Options{ExtraHeaders: []string{"ce_source"}, CloudEvents: &CloudEvents{}}, "ce_source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewBuilder(tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewBuilder: %v, want an error naming %q", err, tt.want)
			}
		})
	}
	t.Run("a value encoding framed for a schema registry after the envelope", func(t *testing.T) {
		if err := CheckCloudEvents(CloudEvents{}, "avro"); err == nil || !strings.Contains(err.Error(), "not supported") {
			t.Errorf("CheckCloudEvents: %v, want avro refused", err)
		}
		if err := CheckCloudEvents(CloudEvents{}, JSONExpanded); err != nil {
			t.Errorf("CheckCloudEvents with json-expanded: %v", err)
		}
	})
}

func BenchmarkBuildStructuredCloudEvent(b *testing.B) {
	bl, err := NewBuilder(Options{CloudEvents: &CloudEvents{}})
	if err != nil {
		b.Fatal(err)
	}
	ev := ceEvent(goldenPayloads["created"])
	b.ReportAllocs()
	for b.Loop() {
		bl.Build(ev, time.Time{})
	}
}

// FuzzCloudEvents: whatever a row holds, an envelope is built or refused, never half: a structured
// event is a JSON object with the event's id and type, a binary one has UTF-8 ce_ headers, and a
// refused one carries no content-type (the sink never publishes it).
func FuzzCloudEvents(f *testing.F) {
	f.Add("order", "o-1", "Created", `{"id": 1}`, `{"tenant": "acme"}`, false)
	f.Add("big order", "", "", "not json", `{"ce_id": "x"}`, false)
	f.Add("", "\xff", "T\x00", `"s"`, "", true)
	f.Fuzz(func(t *testing.T, aggType, aggID, eventType, payload, headers string, tombstone bool) {
		ev := &decoder.Event{ID: []byte("e-1"), AggregateType: []byte(aggType), AggregateID: []byte(aggID),
			EventType: []byte(eventType), Payload: []byte(payload)}
		if headers != "" {
			ev.Headers = []byte(headers)
		}
		for _, enc := range []Encoding{Raw, JSONString, JSONExpanded, JSONWithSchema} {
			for _, mode := range []string{CloudEventsStructured, CloudEventsBinary} {
				b, err := NewBuilder(Options{ValueEncoding: enc, TombstoneOnEmptyPayload: tombstone,
					CloudEvents: &CloudEvents{Mode: mode, Type: "x.{event_type}", Source: "/s/{aggregate_type}", Subject: "{aggregate_id}"}})
				if err != nil {
					t.Fatal(err)
				}
				r := b.Build(ev, time.Unix(1, 0))
				h := headerMap(r.Msg.Headers)
				if r.EnvelopeErr != nil || r.HeadersErr != nil {
					if _, ok := h["content-type"]; ok && r.HeadersErr == nil {
						t.Fatalf("a refused envelope left a content-type: %v", h)
					}
					continue
				}
				if mode == CloudEventsStructured && r.Msg.Value != nil {
					var ce struct{ ID, Type, Source string }
					if err := json.Unmarshal(r.Msg.Value, &ce); err != nil || ce.ID != "e-1" || ce.Type != "x."+eventType {
						t.Fatalf("structured %s value %q: %+v, %v", enc, r.Msg.Value, ce, err)
					}
					continue
				}
				for k, v := range h {
					if strings.HasPrefix(k, "ce_") && !utf8.ValidString(v) {
						t.Fatalf("header %s = %q is not UTF-8", k, v)
					}
				}
				if h["ce_id"] != "e-1" || h["ce_type"] != "x."+eventType {
					t.Fatalf("binary headers %v", h)
				}
			}
		}
	})
}

func TestTemplateExpansionsAreCachedPerTypeAndStayRight(t *testing.T) {
	b := newBuilder(t, Options{CloudEvents: &CloudEvents{Mode: CloudEventsBinary, Type: "com.example.{event_type}"}})
	for i := range templateCacheSize + 3 { // past the bound: the cache starts over
		for _, typ := range []string{"order", "invoice", fmt.Sprintf("t%d", i)} {
			ev := ceEvent(`{}`)
			ev.AggregateType, ev.EventType = []byte(typ), []byte(typ+"Created")
			h := headerMap(b.Build(ev, time.Now()).Msg.Headers)
			if h["ce_source"] != "/outbox-relay/"+typ || h["ce_type"] != "com.example."+typ+"Created" {
				t.Fatalf("aggregate type %s: source %q, type %q", typ, h["ce_source"], h["ce_type"])
			}
		}
	}
	if n := len(b.ce.source.cache); n > templateCacheSize {
		t.Errorf("the source cache holds %d entries, more than its bound %d", n, templateCacheSize)
	}
}

func TestAStructuredCloudEventIsValidJSONWhateverBytesItsTraceHeadersHold(t *testing.T) {
	tests := []struct {
		name  string
		extra string // the traceparent column's bytes, as an extra_headers column holds them
	}{
		{"a traceparent that is not UTF-8", "00-\xff\xfe-01"},
		{"a traceparent with a quote and a control character", "00-\"\x01-01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBuilder(t, Options{ValueEncoding: Raw, ExtraHeaders: []string{"traceparent"}, CloudEvents: &CloudEvents{}})
			ev := ceEvent(`{"id":1}`)
			ev.Extra = [][]byte{[]byte(tt.extra)}
			r := b.Build(ev, ceCommit)
			if r.EnvelopeErr == nil && (!json.Valid(r.Msg.Value) || !utf8.Valid(r.Msg.Value)) {
				t.Fatalf("the structured CloudEvent %q is not valid JSON, and no invalid_cloudevent says so", r.Msg.Value)
			}
		})
	}
}
