package avro

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// node is a parsed JSON value that keeps member order (inferred records list their fields in
// document order) and a number's text (to tell an int from a long from a double, as Jackson's
// number nodes, and so Debezium, do).
type node struct {
	kind    byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' boolean, 'z' null
	str     string
	num     json.Number
	boolean bool
	keys    []string
	vals    []*node // object members (in keys' order) or array elements
}

// parse parses one JSON document. It is a small scanner of its own: encoding/json's token API
// costs most of a serialized event's time (BenchmarkSerializeAnInferredPayload), and what the
// relay needs of a document (member order, a number's text) is what that API gives least cheaply.
// TestParseAgreesWithEncodingJSON holds it to encoding/json's verdicts and values.
func parse(b []byte) (*node, error) {
	return (&parser{}).parse(b)
}

// parse parses b with p's memory: a parser used again overwrites the nodes it made before.
func (p *parser) parse(b []byte) (*node, error) {
	p.b, p.i = b, 0
	p.nodes, p.keys, p.vals = p.nodes[:0], p.keys[:0], p.vals[:0]
	p.space()
	n, err := p.value(0)
	if err != nil {
		return nil, fmt.Errorf("the payload is not JSON: %w", err)
	}
	p.space()
	if p.i != len(p.b) {
		return nil, errors.New("the payload is not JSON: content after the JSON value")
	}
	return n, nil
}

// maxDepth bounds nesting, as encoding/json does (10000), so a hostile payload cannot exhaust
// the stack.
const maxDepth = 10000

type parser struct {
	b []byte
	i int
	// Nodes and member lists are carved from chunks, a few allocations per document rather than
	// one per value and a few per object: parsing is most of an event's cost.
	nodes []node
	keys  []string
	vals  []*node
	// The members of the objects and arrays being scanned, innermost last.
	stackK []string
	stackV []*node
	// views makes strings and numbers without escapes views of b, not copies (str).
	views bool
	// names, when set, keeps member names without escapes, so that a parser used again makes
	// no new string for a name it has seen (payloads repeat their names).
	names map[string]string
	doc   Doc // Format.Parse's result
}

// text is b as a string: a view of it with view, else a copy.
func (p *parser) text(b []byte, view bool) string {
	if view && len(b) > 0 {
		return unsafe.String(&b[0], len(b))
	}
	return string(b)
}

// maxNames bounds a parser's names; past it they start again.
const maxNames = 4096

// node returns a new zero node.
func (p *parser) node() *node {
	if len(p.nodes) == cap(p.nodes) {
		p.nodes = make([]node, 0, max(16, 2*cap(p.nodes)))
	}
	p.nodes = p.nodes[:len(p.nodes)+1]
	n := &p.nodes[len(p.nodes)-1]
	*n = node{} // a parser used again
	return n
}

// carve copies from into chunk's free room (a new chunk when it has too little) and returns the
// copy, with no room to grow into its neighbours; nil when from is empty.
func carve[T any](chunk *[]T, from []T) []T {
	if len(from) == 0 {
		return nil
	}
	if cap(*chunk)-len(*chunk) < len(from) {
		*chunk = make([]T, 0, max(32, 2*cap(*chunk), len(from)))
	}
	start := len(*chunk)
	*chunk = append(*chunk, from...)
	return (*chunk)[start:len(*chunk):len(*chunk)]
}

func (p *parser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("offset %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *parser) value(depth int) (*node, error) {
	if depth > maxDepth {
		return nil, p.errorf("nested too deeply")
	}
	if p.i >= len(p.b) {
		return nil, p.errorf("unexpected end")
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.str(p.views)
		if err != nil {
			return nil, err
		}
		n := p.node()
		n.kind, n.str = 's', s
		return n, nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case bytes.HasPrefix(p.b[p.i:], []byte("true")):
		p.i += 4
		n := p.node()
		n.kind, n.boolean = 'b', true
		return n, nil
	case bytes.HasPrefix(p.b[p.i:], []byte("false")):
		p.i += 5
		n := p.node()
		n.kind = 'b'
		return n, nil
	case bytes.HasPrefix(p.b[p.i:], []byte("null")):
		p.i += 4
		n := p.node()
		n.kind = 'z'
		return n, nil
	}
	return nil, p.errorf("unexpected %q", p.b[p.i])
}

// object scans an object, p.i at its '{', keeping its members in their order.
func (p *parser) object(depth int) (*node, error) {
	p.i++
	n := p.node()
	n.kind = 'o'
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return n, nil
	}
	mark := len(p.stackV)
	defer func() { p.stackK, p.stackV = p.stackK[:mark], p.stackV[:mark] }()
	for {
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, p.errorf("want a member name")
		}
		k, err := p.name()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, p.errorf("want ':'")
		}
		p.i++
		p.space()
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		p.stackK, p.stackV = append(p.stackK, k), append(p.stackV, v)
		p.space()
		if p.i < len(p.b) && p.b[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.b) && p.b[p.i] == '}' {
			p.i++
			n.keys, n.vals = carve(&p.keys, p.stackK[mark:]), carve(&p.vals, p.stackV[mark:])
			return n, nil
		}
		return nil, p.errorf("want ',' or '}'")
	}
}

// array scans an array, p.i at its '['.
func (p *parser) array(depth int) (*node, error) {
	p.i++
	n := p.node()
	n.kind = 'a'
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return n, nil
	}
	mark := len(p.stackV)
	defer func() { p.stackK, p.stackV = p.stackK[:mark], p.stackV[:mark] }()
	for {
		p.space()
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		p.stackK, p.stackV = append(p.stackK, ""), append(p.stackV, v)
		p.space()
		if p.i < len(p.b) && p.b[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			n.vals = carve(&p.vals, p.stackV[mark:])
			return n, nil
		}
		return nil, p.errorf("want ',' or ']'")
	}
}

// number scans JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) number() (*node, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case digits() == 0:
		return nil, p.errorf("a number without digits")
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return nil, p.errorf("a fraction without digits")
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return nil, p.errorf("an exponent without digits")
		}
	}
	n := p.node()
	n.kind, n.num = 'n', json.Number(p.text(p.b[start:p.i], p.views))
	return n, nil
}

// name scans a member name at p.i (its opening quote): str, kept in names.
func (p *parser) name() (string, error) {
	if p.names == nil {
		return p.str(false)
	}
	for j := p.i + 1; j < len(p.b); j++ {
		c := p.b[j]
		if c == '"' {
			raw := p.b[p.i+1 : j]
			if k, ok := p.names[string(raw)]; ok {
				p.i = j + 1
				return k, nil
			}
			k, err := p.str(false)
			if err == nil && k == string(raw) {
				if len(p.names) >= maxNames {
					clear(p.names)
				}
				p.names[k] = k
			}
			return k, err
		}
		if c == '\\' || c < 0x20 {
			break
		}
	}
	return p.str(false)
}

// str scans a string at p.i (its opening quote) and returns its value. Invalid UTF-8 and lone
// surrogates become U+FFFD, as encoding/json makes them.
//
// With view, a string without escapes is the payload's own bytes, not a copy: for a document
// whose memory ends with the call that parsed it, read and never kept (Format.Parse).
func (p *parser) str(view bool) (string, error) {
	p.i++ // the opening quote
	start := p.i
	// The common case: no escapes, ASCII or valid UTF-8.
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c == '"' {
			s := p.b[start:p.i]
			p.i++
			if view && utf8.Valid(s) {
				return p.text(s, true), nil
			}
			return validUTF8(s), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
		p.i++
	}
	out := append([]byte(nil), p.b[start:p.i]...)
	for {
		if p.i >= len(p.b) {
			return "", p.errorf("unterminated string")
		}
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return validUTF8(out), nil
		case c < 0x20:
			return "", p.errorf("a control character in a string")
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		p.i++
		if p.i >= len(p.b) {
			return "", p.errorf("unterminated escape")
		}
		e := p.b[p.i]
		p.i++
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.errorf("a bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// A pair makes one rune; a lone half is U+FFFD, as encoding/json reads it.
				save := p.i
				if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					p.i += 2
					if r2, ok := p.hex4(); ok {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							continue
						}
					}
				}
				p.i = save
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", p.errorf("a bad escape \\%c", e)
		}
	}
}

// validUTF8 is b as a string with each invalid byte replaced by U+FFFD, as encoding/json does.
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		out = utf8.AppendRune(out, r) // RuneError for an invalid byte
		b = b[size:]
	}
	return string(out)
}

func (p *parser) hex4() (rune, bool) {
	if p.i+4 > len(p.b) {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// member is the value of an object's member name, the last one where the document repeats it
// (as Jackson keeps it), or nil.
func (n *node) member(name string) *node {
	for j := len(n.keys) - 1; j >= 0; j-- {
		if n.keys[j] == name {
			return n.vals[j]
		}
	}
	return nil
}

// numberType is the Avro type a JSON number is inferred as: an integer that fits 32 bits is an
// int, one that fits 64 bits a long, anything else (a fraction, an exponent, a larger integer)
// a double. These are Kafka Connect's INT32, INT64 and FLOAT64 as Debezium infers them, and
// Connect's Avro converter maps them to int, long and double.
func numberType(n json.Number) string {
	s := string(n)
	if strings.ContainsAny(s, ".eE") {
		return "double"
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		if v >= math.MinInt32 && v <= math.MaxInt32 {
			return "int"
		}
		return "long"
	}
	return "double"
}

// kindName names a JSON value's kind for an error message.
func kindName(n *node) string {
	switch n.kind {
	case 'o':
		return "an object"
	case 'a':
		return "an array"
	case 's':
		return "a string"
	case 'n':
		return "the number " + string(n.num)
	case 'b':
		return "a boolean"
	}
	return "null"
}
