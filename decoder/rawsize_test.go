package decoder_test

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// TestRawSizeIsTheMemoryAnEventHolds: an event aliases its whole message (unmapped columns too),
// and a bytea payload adds the decoded copy; whoever holds the event must count both.
func TestRawSizeIsTheMemoryAnEventHolds(t *testing.T) {
	withNote := append(append([]col{}, defaultCols...), col{"note", textOID})
	bytea := []col{{"id", uuidOID}, {"aggregate_type", textOID}, {"aggregate_id", textOID}, {"event_type", textOID}, {"payload", byteaOID}, {"headers", jsonbOID}}
	for _, tc := range []struct {
		name  string
		cols  []col
		vals  map[string]val
		extra int64 // beyond the message's length
	}{
		{"a row is its whole message", defaultCols, sampleRow, 0},
		{"an unmapped column counts", withNote, with(sampleRow, "note", text(strings.Repeat("n", 10000))), 0},
		{"a bytea payload adds its decoded copy", bytea, with(sampleRow, "payload", text(`\x`+strings.Repeat("ab", 5000))), 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decoder.New(defaultConfig())
			mustDecode(t, d, relationMsg(outboxOID, "public", "outbox", tc.cols), txBegin())
			msg := insertMsg(outboxOID, row(tc.cols, tc.vals))
			ch, err := d.Decode(insertAt, msg)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(len(msg)) + tc.extra; ch.Event.RawSize != want {
				t.Fatalf("RawSize = %d, want %d", ch.Event.RawSize, want)
			}
		})
	}
}
