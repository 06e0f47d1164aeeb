package workload

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"

	"github.com/segmentio/kafka-go"
)

// ContentHash is what the relay promises to carry of an event, hashed: the record's value (the
// payload) and its headers (the event id, type and aggregate type the relay sets, and the members
// of the row's or message's headers object). Writers hash what they commit, consumers what they
// read, and the checker compares the two.
//
// The payload is hashed as canonical JSON (members sorted, no insignificant space), not as bytes:
// a jsonb column hands the relay PostgreSQL's own rendering of what was inserted (its member order
// and spacing), which is the same JSON. A value that is not JSON is hashed as its bytes. Headers
// are hashed sorted by name, then value: the relay orders its own before the row's, and jsonb
// orders the row's members its own way.
func ContentHash(value []byte, headers []kafka.Header) string {
	h := sha256.New()
	h.Write(canonicalJSON(value))
	hs := slices.Clone(headers)
	slices.SortStableFunc(hs, func(a, b kafka.Header) int {
		if c := cmp.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return bytes.Compare(a.Value, b.Value)
	})
	for _, hd := range hs {
		h.Write([]byte{0})
		h.Write([]byte(hd.Key))
		h.Write([]byte{0})
		h.Write(hd.Value)
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// canonicalJSON re-encodes JSON with sorted members and no insignificant space (numbers as
// written); anything else is returned as it is. A nil value stays distinct from an empty one.
func canonicalJSON(b []byte) []byte {
	if b == nil {
		return []byte{0xff}
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil || d.More() {
		return b
	}
	out, err := json.Marshal(v)
	if err != nil {
		return b
	}
	return out
}
