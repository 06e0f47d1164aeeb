package record

import (
	"encoding/json"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// FuzzBuild: whatever a row holds, Build returns a record or says what is wrong with it, never
// panics; a JSON encoding gives JSON (or a tombstone); a topic it does not refuse is one Kafka
// takes; the key is the aggregate id in the key encoding (bytes as stored, so an id that is not
// UTF-8, possible only in a SQL_ASCII database, stays as it is).
func FuzzBuild(f *testing.F) {
	for _, seed := range []struct {
		aggType, aggID, payload, headers, extra string
		nullPayload                             bool
	}{
		{"order", "o-1", `{"id": 1, "total": 42.00}`, `{"tenant": "acme"}`, "eu", false},
		{"", "", "", "", "", true},
		{"Bad Type!", "x", `[1, "a"]`, `{"id": "spoof"}`, "3", false},
		{"order", "o-\"q\"", "\x00\xff not json", `not json`, "-1", false},
		{"a.b-c_d", "ü", `"just a string"`, `{"n": null, "b": true}`, "2147483648", false},
	} {
		f.Add(seed.aggType, seed.aggID, seed.payload, seed.headers, seed.extra, seed.nullPayload)
	}
	encodings := []Encoding{Raw, JSONString, JSONExpanded, JSONWithSchema}
	f.Fuzz(func(t *testing.T, aggType, aggID, payload, headers, extra string, nullPayload bool) {
		ev := &decoder.Event{ID: []byte("e-1"), AggregateType: []byte(aggType), AggregateID: []byte(aggID),
			EventType: []byte("Created"), Payload: []byte(payload), Extra: [][]byte{[]byte(extra), []byte(extra)},
			ExtraKinds: []decoder.ValueKind{decoder.KindString, decoder.KindNumber}}
		if nullPayload {
			ev.Payload = nil
		}
		if headers != "" {
			ev.Headers = []byte(headers)
		}
		for _, value := range encodings {
			for _, placement := range [][]Placement{nil, {PlaceEnvelope, PlacePartition}, {PlaceHeaderOrNull, PlaceEnvelope}} {
				if value == JSONWithSchema && placement != nil {
					continue // refused by NewBuilder
				}
				b, err := NewBuilder(Options{ValueEncoding: value, KeyEncoding: JSONString, ExtraHeaders: []string{"region", "part"},
					ExtraPlacement: placement, TopicTemplate: "outbox.{aggregate_type}.{event_type}"})
				if err != nil {
					t.Fatal(err)
				}
				r := b.Build(ev, time.Unix(1, 0))
				if r.TopicErr == nil {
					if err := ValidTopic(r.Msg.Topic); err != nil {
						t.Fatalf("topic %q accepted: %v", r.Msg.Topic, err)
					}
				}
				if value != Raw && r.Msg.Value != nil && !json.Valid(r.Msg.Value) {
					t.Fatalf("%s value is not JSON: %q", value, r.Msg.Value)
				}
				if placement != nil && !json.Valid(r.Msg.Value) {
					t.Fatalf("an envelope is not JSON: %q", r.Msg.Value)
				}
				var key string
				if err := json.Unmarshal(r.Msg.Key, &key); err != nil || utf8.ValidString(aggID) && key != aggID {
					t.Fatalf("json-string key %q of aggregate id %q: %q, %v", r.Msg.Key, aggID, key, err)
				}
				if r.PartitionErr == nil && r.Partition < -1 {
					t.Fatalf("partition %d", r.Partition)
				}
			}
		}
	})
}
