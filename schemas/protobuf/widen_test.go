package protobuf

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
		{"a member left out keeps its field", `{"a":"x","b":1}`, `{"a":"y"}`, `{"a":"x","b":1}`},
		{"a member null keeps its field", `{"a":"x","b":1}`, `{"a":"y","b":null}`, `{"a":"x","b":1}`},
		{"array elements' members merge", `{"l":[{"q":1}]}`, `{"l":[{"r":"s"}]}`, `{"l":[{"q":1,"r":"s"}]}`},
		{"nested objects merge", `{"o":{"a":1}}`, `{"o":{"b":true}}`, `{"o":{"a":1,"b":true}}`},
		{"a member whose type changes takes the event's, for the registry to judge", `{"a":1,"b":"x"}`, `{"a":"one"}`, `{"a":"one","b":"x"}`},
		{"a member that turns into an array takes the event's", `{"a":1}`, `{"a":[1]}`, `{"a":[1]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New()
			got, ok := f.Widen(infer(tc.latest), infer(tc.event))
			if !ok {
				t.Fatal("Widen refused two inferred schemas")
			}
			if want := infer(tc.want); got.Schema != want.Schema {
				t.Errorf("merged:\n%s\nwant:\n%s", got.Schema, want.Schema)
			}
			if _, _, err := f.Encode(got, []byte(tc.event)); err != nil {
				t.Errorf("the event does not fit the merged schema: %v", err)
			}
		})
	}
}

func TestWideningLeavesSchemasWrittenByHandAlone(t *testing.T) {
	f := New()
	event, err := f.Infer("Order", "shop", []byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, latest := range []string{
		"syntax = \"proto3\";\npackage shop;\nmessage Order { int64 a = 1; }\n",                                    // no json_name, no optional
		"syntax = \"proto3\";\npackage shop;\nmessage Order { optional int32 a = 1 [json_name = \"a\"]; }\n",       // int32
		"syntax = \"proto3\";\npackage shop;\nmessage Order { map<string,string> m = 1 [json_name = \"m\"]; }\n",   // a map
		"syntax = \"proto3\";\npackage other;\nmessage Order { optional int64 a = 1 [json_name = \"a\"]; }\n",      // another package
		"syntax = \"proto3\";\npackage shop;\nmessage Order {}\nmessage Other {}\n",                                // two messages
		"syntax = \"proto3\";\npackage shop;\nmessage Order { optional string b = 797087 [json_name = \"b\"]; }\n", // a's number taken by b
	} {
		if _, ok := f.Widen(sr.Schema{Type: sr.TypeProtobuf, Schema: latest}, event); ok {
			t.Errorf("Widen merged into %s", latest)
		}
	}
}
