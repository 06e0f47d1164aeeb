package decoder

import (
	"encoding/hex"
	"errors"
	"fmt"
)

// Bytea decodes bytea's text output in either of PostgreSQL's formats: hex ("\x0a0b", the
// default) or escape (bytea_output = 'escape': printable ASCII as itself, a backslash doubled,
// other bytes as a backslash and three octal digits). The two cannot be confused: escape output
// never starts with "\x", since it doubles every backslash.
func Bytea(b []byte) ([]byte, error) {
	if len(b) >= 2 && b[0] == '\\' && b[1] == 'x' {
		out := make([]byte, hex.DecodedLen(len(b)-2))
		if _, err := hex.Decode(out, b[2:]); err != nil {
			return nil, fmt.Errorf("bytea value: %w", err)
		}
		return out, nil
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		switch {
		case i+1 < len(b) && b[i+1] == '\\':
			out = append(out, '\\')
			i++
		case i+3 < len(b) && isOctal(b[i+1], '3') && isOctal(b[i+2], '7') && isOctal(b[i+3], '7'):
			out = append(out, (b[i+1]-'0')<<6|(b[i+2]-'0')<<3|(b[i+3]-'0'))
			i += 3
		default:
			return nil, errors.New("bytea value: a backslash in escape format must be doubled or start three octal digits")
		}
	}
	return out, nil
}

func isOctal(c, maxDigit byte) bool { return c >= '0' && c <= maxDigit }
