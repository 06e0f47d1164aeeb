package decoder

import "encoding/binary"

// A message's content is checked to be JSON by the decoder itself, in one pass, rather than with
// json.Valid: encoding/json's scanner calls a state function per byte, which made validation the
// larger part of decoding a table-free outbox message (1.2 of 2.0 µs for a 300-byte payload). The
// grammar is RFC 8259's, with json.Valid's limits: any byte of 0x20 and above inside a string
// (invalid UTF-8 included), and at most maxJSONDepth nested objects and arrays.
// FuzzValidJSONMatchesEncodingJSON holds it to json.Valid.

// maxJSONDepth is encoding/json's nesting limit (maxNestingDepth).
const maxJSONDepth = 10000

// validJSON reports whether b is one JSON value, with white space around it at most.
func validJSON(b []byte) bool {
	end := scanJSON(b, skipSpace(b, 0), 0)
	return end >= 0 && skipSpace(b, end) == len(b)
}

// scanJSON returns the index just past the JSON value that starts at b[i], or -1 when none does.
// depth is how many objects and arrays enclose it.
func scanJSON(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; c {
	case '"':
		return scanJSONString(b, i)
	case '{', '[':
		if depth >= maxJSONDepth {
			return -1
		}
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == closing {
			return i + 1
		}
		for {
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return -1
				}
				if i = scanJSONString(b, i); i < 0 {
					return -1
				}
				if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
					return -1
				}
				i = skipSpace(b, i+1)
			}
			if i = scanJSON(b, i, depth+1); i < 0 {
				return -1
			}
			if i = skipSpace(b, i); i >= len(b) {
				return -1
			}
			switch b[i] {
			case closing:
				return i + 1
			case ',':
				i = skipSpace(b, i+1)
			default:
				return -1
			}
		}
	case 't':
		return scanJSONLiteral(b, i, "true")
	case 'f':
		return scanJSONLiteral(b, i, "false")
	case 'n':
		return scanJSONLiteral(b, i, "null")
	}
	return scanJSONNumber(b, i)
}

// scanJSONString returns the index just past the string that starts at b[i] (a quote), or -1.
func scanJSONString(b []byte, i int) int {
	j := i + 1
	for {
		// Eight bytes at a time up to the word holding the next byte that needs a look, then
		// byte by byte (a table lookup each) to that byte, at most eight on: a long text (a
		// description, a blob) goes at several bytes a cycle, and a short name or id costs one
		// word's test and a lookup a byte.
		for j+8 <= len(b) && !needsLook(binary.LittleEndian.Uint64(b[j:])) {
			j += 8
		}
		for j < len(b) && plainInString[b[j]] {
			j++
		}
		if j >= len(b) {
			return -1
		}
		switch b[j] {
		case '"':
			return j + 1
		case '\\':
			if j+1 >= len(b) {
				return -1
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(b) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) || !isHex(b[j+5]) {
					return -1
				}
				j += 6
			default:
				return -1
			}
		default: // a control character
			return -1
		}
	}
}

// plainInString tells the bytes a JSON string may hold as they are: all but the quote, the
// backslash and the control characters. A table, read-only once built, because one load is what
// the byte-wise part of scanJSONString can afford per byte.
var plainInString = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// needsLook reports whether any of the eight bytes in w is a quote, a backslash or a control
// character (below 0x20). The tests are the classic "has a zero byte" and "has a byte less than"
// ones: never a false negative; a false positive (possible only past a true one) costs a byte-wise
// look.
func needsLook(w uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	quote, backslash := w^(ones*'"'), w^(ones*'\\')
	return ((quote-ones)&^quote|(backslash-ones)&^backslash|(w-ones*0x20)&^w)&highs != 0
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func scanJSONLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// scanJSONNumber returns the index just past the number that starts at b[i], or -1:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanJSONNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		if i+1 >= len(b) || !isDigit(b[i+1]) {
			return -1
		}
		i = digits(b, i+1)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		i = digits(b, i)
	}
	return i
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func digits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}
