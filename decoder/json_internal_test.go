package decoder

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
)

var jsonSeeds = []string{
	``, ` `, `{}`, ` { } `, `[]`, `[1,2]`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `{"a":1}x`, `{"a":1}}`,
	`"x"`, `"\u00e9\n\"\\\/\b\f\r\t"`, `"\u00zz"`, `"\x"`, `"a` + "\x01" + `b"`, "\"\xff\xfe\"", `"unterminated`, `"\`,
	`0`, `-0`, `01`, `-`, `1.`, `1.5`, `.5`, `1e5`, `1E+5`, `1e`, `1e+`, `-1.5e-7`, `+1`, `0x1`, `1 2`,
	`true`, `false`, `null`, `tru`, `nul`, `nulll`, `True`,
	`{"id":"1","payload":{"items":[{"sku":"a","qty":2}],"total":45.47},"headers":{"t":"x"}}`,
	`{"id":"1","payload":{"items":[{"sku":"a","qty":2}],"total":45.47,},"headers":{}}`,
	`[[[[]]]]`, `[[[[]]]`, `{"a":[1,{"b":null}]}`, `{"a":[1,{"b":nul}]}`, "{\"a\":\t\n1\r}",
	strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth),
	strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1),
	`{"a":` + strings.Repeat("[", maxJSONDepth-1) + strings.Repeat("]", maxJSONDepth-1) + `}`,
	`{"a":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `}`,
	// Strings whose special byte falls in a word, at its edge, or in the bytes after the last
	// whole word (scanJSONString goes eight at a time, then byte by byte).
	`"` + strings.Repeat("a", 7) + `"`, `"` + strings.Repeat("a", 8) + `"`, `"` + strings.Repeat("a", 9) + `"`,
	`"` + strings.Repeat("a", 23) + `\n` + strings.Repeat("b", 13) + `"`, `"` + strings.Repeat("a", 16) + `\u00e9"`,
	`"` + strings.Repeat("a", 16) + "\x1f" + `"`, `"` + strings.Repeat("a", 16) + `\"`, `"` + strings.Repeat("a", 31),
	`"` + strings.Repeat("\xc3\xa9", 12) + `"`,
}

// FuzzValidJSONMatchesEncodingJSON holds the decoder's own JSON check to json.Valid, the check it
// replaced on the table-free outbox's hot path: the same verdict for any bytes, and for an object,
// the same verdict from the member scan that reads a message's content.
func FuzzValidJSONMatchesEncodingJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := json.Valid(b)
		if got := validJSON(b); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", b, got, want)
		}
		start := skipSpace(b, 0)
		if start == len(b) || b[start] != '{' {
			return
		}
		end := eachMember(b, start, func([]byte, bool, []byte) {})
		if got := end >= 0 && skipSpace(b, end) == len(b); got != want {
			t.Fatalf("eachMember of %q says valid %v, json.Valid says %v", b, got, want)
		}
	})
}

// TestNeedsLookFindsEveryByteThatNeedsOne: the eight-bytes-at-a-time scan may skip a word only
// when none of its bytes is a quote, a backslash or a control character, whatever the others are
// (bytes of 0x80 and above, as UTF-8 has, included).
func TestNeedsLookFindsEveryByteThatNeedsOne(t *testing.T) {
	for _, fill := range []byte{'a', ' ', 0x7f, 0x80, 0xc3, 0xff, '!', '#', '[', ']'} {
		for pos := range 8 {
			for c := range 256 {
				var w [8]byte
				for i := range w {
					w[i] = fill
				}
				w[pos] = byte(c)
				want := c == '"' || c == '\\' || c < 0x20
				if got := needsLook(binary.LittleEndian.Uint64(w[:])); got != want {
					t.Fatalf("needsLook(%q) = %v, want %v", w, got, want)
				}
			}
		}
	}
}
