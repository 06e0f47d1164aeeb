package jsonschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/twmb/franz-go/pkg/sr"
)

// draft07 is the "$schema" of inferred schemas: the draft every Confluent-compatible registry
// reads.
const draft07 = "http://json-schema.org/draft-07/schema#"

// Infer returns the JSON Schema of payload, as the package doc says.
func (*Format) Infer(name, namespace string, payload []byte) (sr.Schema, error) {
	doc, err := parseJSON(payload)
	if err != nil {
		return sr.Schema{}, &FieldError{Problem: "the payload is not JSON: " + err.Error()}
	}
	sh := &shape{}
	sh.add(doc)
	title := name
	if namespace != "" && name != "" {
		title = namespace + "." + name
	}
	b := []byte(`{"$schema":` + strconv.Quote(draft07))
	if title != "" {
		b = append(b, `,"title":`...)
		b = appendString(b, title)
	}
	b = append(b, ',')
	b = sh.appendBody(b)
	return sr.Schema{Schema: string(b), Type: sr.TypeJSON}, nil
}

// shape is the union of the JSON values seen at one place of the document.
type shape struct {
	types map[string]bool   // JSON Schema type names
	props map[string]*shape // members of the objects seen (typed members only)
	items *shape            // elements of the arrays seen; nil while none was
}

func (s *shape) add(v any) {
	if s.types == nil {
		s.types = map[string]bool{}
	}
	switch x := v.(type) {
	case nil:
		s.types["null"] = true
	case bool:
		s.types["boolean"] = true
	case string:
		s.types["string"] = true
	case json.Number:
		s.types["number"] = true
	case map[string]any:
		s.types["object"] = true
		if s.props == nil {
			s.props = map[string]*shape{}
		}
		for k, m := range x {
			// A null or [] is recorded too: alone it leaves the member out (appendBody), beside
			// a typed value of another array element it makes the member nullable.
			p := s.props[k]
			if p == nil {
				p = &shape{}
				s.props[k] = p
			}
			p.add(m)
		}
	case []any:
		s.types["array"] = true
		for _, el := range x {
			if s.items == nil {
				s.items = &shape{}
			}
			s.items.add(el)
		}
	}
}

// untyped says whether a member's value carries no type: null, or an empty array.
func untyped(v any) bool {
	if v == nil {
		return true
	}
	a, ok := v.([]any)
	return ok && len(a) == 0
}

// typed says whether the shape has a type to say: anything but nulls and empty arrays.
func (s *shape) typed() bool {
	for t := range s.types {
		if t != "null" && (t != "array" || s.items != nil) {
			return true
		}
	}
	return false
}

// typeOrder writes type lists in one order, so one shape has one text.
var typeOrder = []string{"null", "boolean", "number", "string", "array", "object"}

// appendBody appends the shape's keywords (without the braces' opening) and the closing brace.
func (s *shape) appendBody(b []byte) []byte {
	var types []string
	for _, t := range typeOrder {
		if s.types[t] {
			types = append(types, t)
		}
	}
	b = append(b, `"type":`...)
	if len(types) == 1 {
		b = appendString(b, types[0])
	} else {
		b = append(b, '[')
		for i, t := range types {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, t)
		}
		b = append(b, ']')
	}
	if s.types["array"] && s.items != nil {
		b = append(b, `,"items":{`...)
		b = s.items.appendBody(b)
	}
	if s.types["object"] {
		keys := make([]string, 0, len(s.props))
		for k, p := range s.props {
			if p.typed() { // no type to say: left out, as Debezium's expansion leaves it out
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		b = append(b, `,"properties":{`...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, `:{`...)
			b = s.props[k].appendBody(b)
		}
		b = append(b, `},"additionalProperties":false`...)
	}
	return append(b, '}')
}

func appendString(b []byte, s string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

// parseJSON parses one JSON value with numbers kept as their text.
func parseJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("content after the JSON value")
	}
	return v, nil
}

// FieldError says which member of the payload does not fit the schema and why. It wraps
// ErrMismatch.
type FieldError struct {
	Path    string // e.g. "lines[2].qty"; "" for the payload itself
	Problem string
}

// ErrMismatch is wrapped by every *FieldError: the payload does not fit the schema.
var ErrMismatch = errors.New("payload does not fit the JSON schema")

func (e *FieldError) Error() string {
	if e.Path == "" {
		return "payload: " + e.Problem
	}
	return fmt.Sprintf("field %s: %s", e.Path, e.Problem)
}

// FieldPath returns the path of the member that does not fit.
func (e *FieldError) FieldPath() string { return e.Path }

func (e *FieldError) Unwrap() error { return ErrMismatch }
