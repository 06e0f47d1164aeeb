package workload_test

import (
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
)

// TestContentHash: the hash is the same for what a writer inserts and what the relay publishes
// from a jsonb column (PostgreSQL's rendering: members by length, then bytes, a space after each
// colon and comma, non-ASCII as it is) with its headers in another order, and differs when a
// byte of the payload's values or of a header changes, or a header is missing or added.
func TestContentHash(t *testing.T) {
	written := []byte(`{"aggregate":"kunde-müller-w0-1","seq":7,"txn":"w0-3-ab12","note":"grüße, 世界 ✓"}`)
	headers := []kafka.Header{
		{Key: "id", Value: []byte("e1")}, {Key: "event_type", Value: []byte("Happened")}, {Key: "aggregate_type", Value: []byte("a")},
		{Key: "chaos_txn", Value: []byte("w0-3-ab12")}, {Key: "chaos_note", Value: []byte("grüße ✓")},
	}
	want := workload.ContentHash(written, headers)

	jsonb := []byte(`{"seq": 7, "txn": "w0-3-ab12", "note": "gr\u00fc\u00dfe, 世界 ✓", "aggregate": "kunde-müller-w0-1"}`)
	reordered := []kafka.Header{headers[4], headers[2], headers[0], headers[3], headers[1]}
	if got := workload.ContentHash(jsonb, reordered); got != want {
		t.Errorf("the jsonb rendering with headers in another order hashes to %s, the written event to %s", got, want)
	}

	for _, tc := range []struct {
		name    string
		value   []byte
		headers []kafka.Header
	}{
		{"a value in the payload changed", []byte(`{"aggregate":"kunde-müller-w0-1","seq":8,"txn":"w0-3-ab12","note":"grüße, 世界 ✓"}`), headers},
		{"a payload member missing", []byte(`{"aggregate":"kunde-müller-w0-1","seq":7,"txn":"w0-3-ab12"}`), headers},
		{"the payload re-encoded as another text", []byte(`{"aggregate":"kunde-m\\u00fcller-w0-1","seq":7,"txn":"w0-3-ab12","note":"gr??e, ?? ?"}`), headers},
		{"no payload", nil, headers},
		{"a header's value changed", written, append(headers[:4:4], kafka.Header{Key: "chaos_note", Value: []byte("grusse")})},
		{"a header missing", written, headers[:4]},
		{"a header added", written, append(headers[:5:5], kafka.Header{Key: "traceparent", Value: []byte("00-1")})},
		{"a header renamed", written, append(headers[:4:4], kafka.Header{Key: "chaos-note", Value: []byte("grüße ✓")})},
	} {
		if got := workload.ContentHash(tc.value, tc.headers); got == want {
			t.Errorf("%s: same hash %s", tc.name, got)
		}
	}
	if got := workload.ContentHash([]byte("not json"), headers); got != workload.ContentHash([]byte("not json"), reordered) || got == workload.ContentHash([]byte("not json "), headers) {
		t.Error("a value that is not JSON is not hashed as its bytes")
	}
}
