package jsonschema

import (
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

func TestWideningKeepsASubjectsSchemaGrowing(t *testing.T) {
	infer := func(payload string) sr.Schema {
		t.Helper()
		s, err := New().Infer("Order", "shop", []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tc := range []struct {
		name                string
		latest, event, want string // payloads; want is one whose inferred schema the merge is
	}{
		{"a member added joins the members known", `{"a":"x"}`, `{"b":1}`, `{"a":"x","b":1}`},
		{"a member left out keeps its place", `{"a":"x","b":1}`, `{"a":"y"}`, `{"a":"x","b":1}`},
		{"a member null keeps its type", `{"a":"x","b":1}`, `{"a":"y","b":null}`, `{"a":"x","b":1}`},
		{"array elements' members merge", `{"l":[{"q":1}]}`, `{"l":[{"r":"s"}]}`, `{"l":[{"q":1,"r":"s"}]}`},
		{"an empty array takes the items known", `{"l":[1]}`, `{"l":[]}`, `{"l":[1]}`},
		{"nested objects merge", `{"o":{"a":1}}`, `{"o":{"b":true}}`, `{"o":{"a":1,"b":true}}`},
		{"a member whose type changes takes the event's, for the registry to judge", `{"a":1,"b":"x"}`, `{"a":"one"}`, `{"a":"one","b":"x"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := New().Widen(infer(tc.latest), infer(tc.event))
			if !ok {
				t.Fatal("Widen refused two inferred schemas")
			}
			if want := infer(tc.want); got.Schema != want.Schema {
				t.Errorf("merged:\n%s\nwant:\n%s", got.Schema, want.Schema)
			}
			// The event's payload fits what is registered for it.
			if _, _, err := New().Encode(got, []byte(tc.event)); err != nil {
				t.Errorf("the event does not fit the merged schema: %v", err)
			}
		})
	}
}

func TestWideningLeavesSchemasWrittenByHandAlone(t *testing.T) {
	event, err := New().Infer("Order", "", []byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, latest := range []string{
		`{"type":"object","required":["a"],"properties":{"a":{"type":"integer"}},"additionalProperties":false}`,
		`{"type":"object","properties":{"a":{"type":"number"}}}`,
		`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{},"additionalProperties":false}`,
		`not json`,
	} {
		if _, ok := New().Widen(sr.Schema{Type: sr.TypeJSON, Schema: latest}, event); ok {
			t.Errorf("Widen merged into %s", latest)
		}
	}
	if _, ok := New().Widen(sr.Schema{Type: sr.TypeAvro, Schema: `"string"`}, event); ok {
		t.Error("Widen merged into an Avro schema")
	}
}
