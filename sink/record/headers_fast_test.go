package record

import (
	"reflect"
	"testing"
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
