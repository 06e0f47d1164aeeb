package decoder_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
)

func TestByteaDecodesBothTextFormats(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []byte
		err  string // empty: decodes
	}{
		{"hex", `\x7b2261223a317d`, []byte(`{"a":1}`), ""},
		{"hex in upper case", `\x7B7D`, []byte(`{}`), ""},
		{"empty in hex", `\x`, []byte{}, ""},
		{"empty in escape format", ``, []byte{}, ""},
		{"printable bytes in escape format are themselves", `{"a":1}`, []byte(`{"a":1}`), ""},
		{"a doubled backslash is one", `a\\b`, []byte(`a\b`), ""},
		{"an escaped backslash before x is not hex", `\\x41`, []byte(`\x41`), ""},
		{"octal escapes", `\000\377\012`, []byte{0, 0xff, '\n'}, ""},
		{"invalid hex", `\x7g`, nil, "invalid byte"},
		{"odd hex", `\x7b2`, nil, "odd length"},
		{"a lone backslash", `a\b`, nil, "backslash"},
		{"a backslash at the end", `a\`, nil, "backslash"},
		{"a short octal escape", `\12`, nil, "backslash"},
		{"an octal escape above 377", `\400`, nil, "backslash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decoder.Bytea([]byte(tt.in))
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("Bytea(%q): %v", tt.in, err)
			case tt.err == "" && (got == nil || !bytes.Equal(got, tt.want)):
				t.Fatalf("Bytea(%q) = %q, want %q", tt.in, got, tt.want)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("Bytea(%q) = %q, %v; want an error saying %q", tt.in, got, err, tt.err)
			}
		})
	}
}
