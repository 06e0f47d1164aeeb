// Package avro is the Avro format of package schemas: it infers a record schema from a JSON
// payload (infer.go says precisely how: records, nullability, numbers, names), converts a JSON
// payload to Avro's binary encoding in a given schema, naming the field that does not fit
// (encode.go), and decodes Avro data back to plain JSON (decode.go). It does no I/O; schemas come
// as text, and parsed schemas are cached by their text.
//
// The Avro library is github.com/hamba/avro/v2, for its schema parser (names, references, defaults,
// logical types) only: the conversion walks its parsed schema over the JSON document itself, so
// that a value that does not fit names its field's path, members keep their order, and numbers
// keep their exact text (a long beyond 2^53 is not rounded through a float64).
package avro

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// KeySchema is the schema of a record key made of the aggregate id: an Avro string, as Kafka
// Connect's Avro converter writes a string key.
const KeySchema = `"string"`

// AppendString appends s in Avro's binary encoding of a string (KeySchema).
func AppendString(b, s []byte) []byte {
	b = binary.AppendVarint(b, int64(len(s)))
	return append(b, s...)
}

// maxParsed bounds the cache of parsed schemas; past it the cache starts again.
const maxParsed = 1024

// Format is the Avro format. Its methods may be called concurrently.
type Format struct {
	mu     sync.Mutex
	parsed map[string]avro.Schema
	// The document Infer parsed last: Encode of the same payload, which follows at once on the
	// serializer's path, does not parse it again.
	lastPayload []byte
	lastDoc     *node
	// Parsers for Parse, each with its memory and the member names it has seen.
	parsers sync.Pool
}

// New returns an Avro format.
func New() *Format { return &Format{parsed: make(map[string]avro.Schema)} }

// Type is sr.TypeAvro.
func (*Format) Type() sr.SchemaType { return sr.TypeAvro }

// Infer returns the record schema named name in namespace inferred from the JSON payload.
func (f *Format) Infer(name, namespace string, payload []byte) (sr.Schema, error) {
	doc, err := parse(payload)
	if err != nil {
		return sr.Schema{}, err
	}
	text, err := inferDoc(name, namespace, doc)
	if err != nil {
		return sr.Schema{}, err
	}
	f.mu.Lock()
	// A copy: the caller may reuse its buffer, and a document kept for bytes that changed in
	// place would encode the old event.
	f.lastPayload, f.lastDoc = append(f.lastPayload[:0], payload...), doc
	f.mu.Unlock()
	return sr.Schema{Schema: text, Type: sr.TypeAvro}, nil
}

// doc parses payload, or takes the document Infer parsed from the same bytes.
func (f *Format) doc(payload []byte) (*node, error) {
	f.mu.Lock()
	last, doc := f.lastPayload, f.lastDoc
	f.mu.Unlock()
	if doc != nil && bytes.Equal(last, payload) {
		return doc, nil
	}
	return parse(payload)
}

// Encode writes the JSON payload in schema s. A payload that does not fit returns a *FieldError.
// Avro has no message index: index is nil.
func (f *Format) Encode(s sr.Schema, payload []byte) (index []int, data []byte, err error) {
	parsed, err := f.parse(s)
	if err != nil {
		return nil, nil, err
	}
	doc, err := f.doc(payload)
	if err != nil {
		return nil, nil, &FieldError{Problem: err.Error()}
	}
	data, err = encode(make([]byte, 0, len(payload)), parsed, doc, "")
	return nil, data, err
}

// Decode writes Avro data of schema s as JSON.
func (f *Format) Decode(s sr.Schema, _ []int, data []byte) ([]byte, error) {
	parsed, err := f.parse(s)
	if err != nil {
		return nil, err
	}
	r := &reader{b: data}
	out, err := decode(make([]byte, 0, 2*len(data)), parsed, r)
	if err != nil {
		return nil, fmt.Errorf("avro data does not match its schema: %w", err)
	}
	if r.i != len(data) {
		return nil, fmt.Errorf("avro data does not match its schema: %d bytes left over", len(data)-r.i)
	}
	return out, nil
}

func (f *Format) parse(s sr.Schema) (avro.Schema, error) {
	if len(s.References) > 0 {
		return nil, fmt.Errorf("avro schemas with references are not supported")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.parsed[s.Schema]; ok {
		return p, nil
	}
	// A cache of its own per schema: hamba's default cache is global and keeps every named type
	// it ever saw, so two versions of one record would meet there.
	p, err := avro.ParseWithCache(s.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("the schema is not valid Avro: %w", err)
	}
	if len(f.parsed) >= maxParsed {
		clear(f.parsed)
	}
	f.parsed[s.Schema] = p
	return p, nil
}
