package record

import (
	"reflect"
	"testing"

	"github.com/segmentio/kafka-go"
)

// FuzzFlatHeadersAgreeWithEncodingJSON: whenever the fast path accepts a headers value, it must
// produce exactly what the encoding/json path produces.
func FuzzFlatHeadersAgreeWithEncodingJSON(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"tenant": "acme"}`, `{"a": 1, "b": -2.5e3, "c": true, "d": false, "e": null}`,
		`{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "schema_version": 3}`,
		` { "x" : "y" } `, `{"x": "a\"b"}`, `{"x": {"nested": 1}}`, `{"x": [1, 2]}`, `{"x": 01}`, `{"x": 1-}`,
		`{"x": "y",}`, `{"x": "y"} {}`, `null`, `[]`, `{"x": "y"`, `{"ü": "ß"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		fast, ok := appendFlatJSONHeaders(nil, obj)
		if !ok {
			return
		}
		slow, err := decodeJSONHeaders(nil, obj)
		if err != nil {
			t.Fatalf("fast path accepted %q, encoding/json refused it: %v", obj, err)
		}
		if len(fast) == 0 && len(slow) == 0 {
			return
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("headers of %q: fast %v, encoding/json %v", obj, fast, slow)
		}
	})
}

// TestFlatHeadersAllocateNothingBeyondTheirSlice: a headers object as jsonb prints it becomes
// headers whose names and values alias it, so an event with headers costs no allocation per
// member on the hot path.
func TestFlatHeadersAllocateNothingBeyondTheirSlice(t *testing.T) {
	obj := []byte(`{"tenant": "acme", "schema_version": 3, "replayed": false}`)
	hs := make([]kafka.Header, 0, 3)
	allocs := testing.AllocsPerRun(100, func() {
		var ok bool
		if hs, ok = appendFlatJSONHeaders(hs[:0], obj); !ok || len(hs) != 3 {
			t.Fatalf("fast path: %v, %d headers", ok, len(hs))
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per headers object, want 0", allocs)
	}
	if hs[0].Key != "tenant" || string(hs[0].Value) != "acme" || hs[1].Key != "schema_version" || string(hs[2].Value) != "false" {
		t.Fatalf("headers %v", hs)
	}
}
