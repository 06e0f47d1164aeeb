package record

import "testing"

// TestConnectJSONKeysAreWhatJsonConverterReads: a key is a string schema with its payload; a NULL
// aggregate id must come with an optional schema, since JsonConverter refuses a null payload for
// a required one (the record would stop a Connect sink or any consumer that checks the schema).
func TestConnectJSONKeysAreWhatJsonConverterReads(t *testing.T) {
	for _, tc := range []struct {
		key  []byte
		want string
	}{
		{[]byte("order-1"), `{"schema":{"type":"string","optional":false},"payload":"order-1"}`},
		{[]byte(""), `{"schema":{"type":"string","optional":false},"payload":""}`},
		{[]byte(`a "quoted" id`), `{"schema":{"type":"string","optional":false},"payload":"a \"quoted\" id"}`},
		{nil, `{"schema":{"type":"string","optional":true},"payload":null}`},
	} {
		if got := string(connectJSONKey(tc.key)); got != tc.want {
			t.Errorf("connectJSONKey(%q) = %s, want %s", tc.key, got, tc.want)
		}
	}
}
