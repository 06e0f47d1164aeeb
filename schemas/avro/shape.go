package avro

import (
	"bytes"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// A payload's shape, for a caller that caches what it inferred from a payload (package schemas'
// Serializer): inferring a schema, printing it and looking it up cost most of a record's time,
// and a stream's payloads come in a few shapes. Parse once, key the cache by AppendShape, and on a
// hit write the document with the cached schema's Encoder.

// Doc is a parsed JSON payload, made by Format.Parse and given back with Format.Release.
type Doc struct {
	n *node
	p *parser
}

// Parse parses a JSON payload, with the error Infer gives for one that is not JSON. Its memory
// is the Format's to use again once the caller is done and calls Release, and its strings are
// views of payload: what the caller keeps of it (an error, a schema) holds none of that memory,
// and payload must not change until then.
func (f *Format) Parse(payload []byte) (*Doc, error) {
	p, _ := f.parsers.Get().(*parser)
	if p == nil {
		p = &parser{names: make(map[string]string), views: true}
	}
	n, err := p.parse(payload)
	if err != nil {
		p.b = nil // the caller's payload
		f.parsers.Put(p)
		return nil, err
	}
	p.doc = Doc{n: n, p: p}
	return &p.doc, nil
}

// Release gives d's memory back to f: d must not be used after.
func (f *Format) Release(d *Doc) {
	if d == nil || d.p == nil {
		return
	}
	p := d.p
	*d = Doc{}
	p.b = nil // the caller's payload
	f.parsers.Put(p)
}

// InferDoc is Infer of a parsed payload.
func (*Format) InferDoc(name, namespace string, d *Doc) (sr.Schema, error) {
	text, err := inferDoc(name, namespace, d.n)
	if err != nil {
		return sr.Schema{}, err
	}
	return sr.Schema{Schema: text, Type: sr.TypeAvro}, nil
}

// AppendShape appends d's shape to b: what inference reads of a document, and nothing else (the
// member names exactly, in order; each value's kind, a number's inferred type int, long or
// double, an array's elements), written so that no two shapes share their bytes. Two documents
// of one shape infer the same schema under one name and namespace, or fail alike; their values
// may differ, and so may whether they fit a schema (a double out of range), which Encoder.Append
// says per document.
//
// An array's run of elements of one shape is written once: inference merges an array's element
// types, and merging a type with itself gives it back, so [1,2,3] and [4] infer alike.
func (d *Doc) AppendShape(b []byte) []byte { return appendShape(b, d.n) }

// Shape bytes: '{' then ':' <name length> <name> <value> per member then '}'; '[' <element>...
// ']'; 'i', 'l', 'd' a number inferred int, long, double; 's', 'b', 'z' a string, a boolean,
// null. A member starts with ':' and an object ends with '}', an element starts with a kind byte
// and an array ends with ']': the bytes parse back one way.
func appendShape(b []byte, n *node) []byte {
	switch n.kind {
	case 'n':
		switch numberType(n.num) {
		case "int":
			return append(b, 'i')
		case "long":
			return append(b, 'l')
		}
		return append(b, 'd')
	case 'o':
		b = append(b, '{')
		for i, k := range n.keys {
			b = append(b, ':')
			b = appendUvarint(b, uint64(len(k)))
			b = append(b, k...)
			b = appendShape(b, n.vals[i])
		}
		return append(b, '}')
	case 'a':
		b = append(b, '[')
		prev := -1
		for _, e := range n.vals {
			start := len(b)
			b = appendShape(b, e)
			if prev >= 0 && bytes.Equal(b[prev:start], b[start:]) {
				b = b[:start]
				continue
			}
			prev = start
		}
		return append(b, ']')
	}
	return append(b, n.kind)
}

func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// Encoder writes documents in one schema.
type Encoder struct{ s avro.Schema }

// Encoder returns the Encoder of s, with the error Encode gives for a schema it cannot use.
func (f *Format) Encoder(s sr.Schema) (*Encoder, error) {
	p, err := f.parse(s)
	if err != nil {
		return nil, err
	}
	return &Encoder{p}, nil
}

// Append appends d written in e's schema to b: the bytes Encode returns for d's payload, or its
// error (a *FieldError for a document that does not fit).
func (e *Encoder) Append(b []byte, d *Doc) ([]byte, error) {
	return encode(b, e.s, d.n, "")
}
