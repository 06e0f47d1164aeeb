package jsonschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"github.com/twmb/franz-go/pkg/sr"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// maxCachedSchemas bounds the compiled-schema cache; a subject has few schemas, so reaching it
// means payload shapes that keep changing, and starting over costs one compile per schema.
const maxCachedSchemas = 256

// schemaURL is the URL a schema text is compiled under; it appears in errors about the schema.
const schemaURL = "urn:outbox-relay:schema.json"

// Format is the JSON Schema format. Its methods may be called concurrently.
type Format struct {
	mu       sync.Mutex
	compiled map[string]*jsonschema.Schema // by schema text
	printer  *message.Printer
}

// New returns a JSON Schema format.
func New() *Format { return &Format{} }

// Type is sr.TypeJSON.
func (*Format) Type() sr.SchemaType { return sr.TypeJSON }

// Encode checks payload against s and returns it as the data to frame (see the package doc);
// JSON Schema has no message index. A payload that does not fit returns a *FieldError.
func (f *Format) Encode(s sr.Schema, payload []byte) (index []int, data []byte, err error) {
	sch, err := f.compile(s)
	if err != nil {
		return nil, nil, err
	}
	doc, err := parseJSON(payload)
	if err != nil {
		return nil, nil, &FieldError{Problem: "the payload is not JSON: " + err.Error()}
	}
	verr := sch.Validate(doc)
	if verr == nil {
		return nil, payload, nil
	}
	// Null and [] members have no property in an inferred schema (see the package doc): the
	// payload may fit without them. The common payload is checked once.
	if trimmed, ok := dropUntyped(doc); ok && sch.Validate(trimmed) == nil {
		out, err := json.Marshal(trimmed)
		if err != nil {
			return nil, nil, fmt.Errorf("write the payload without its null members: %w", err)
		}
		return nil, out, nil
	}
	return nil, nil, f.fieldError(doc, verr)
}

// Decode returns data, a JSON document, as it is.
func (*Format) Decode(_ sr.Schema, _ []int, data []byte) ([]byte, error) {
	if !json.Valid(data) {
		return nil, errors.New("json-schema data is not a JSON document")
	}
	return data, nil
}

// dropUntyped returns doc without its null and [] object members, at any depth, and whether it
// had any. doc is changed in place.
func dropUntyped(doc any) (any, bool) {
	dropped := false
	switch x := doc.(type) {
	case map[string]any:
		for k, v := range x {
			if untyped(v) {
				delete(x, k)
				dropped = true
				continue
			}
			_, d := dropUntyped(v)
			dropped = dropped || d
		}
	case []any:
		for _, v := range x {
			_, d := dropUntyped(v)
			dropped = dropped || d
		}
	}
	return doc, dropped
}

// fieldError makes a validation error one line naming the member: the deepest failure, the one
// closest to the value at fault.
func (f *Format) fieldError(doc any, err error) error {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &FieldError{Problem: err.Error()}
	}
	leaf := deepest(ve)
	loc := leaf.InstanceLocation
	switch k := leaf.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		if len(k.Properties) > 0 {
			loc = append(append([]string{}, loc...), k.Properties[0])
			return &FieldError{Path: path(doc, loc), Problem: "not a property of the schema, which allows no others"}
		}
	case *kind.Required:
		if len(k.Missing) > 0 {
			loc = append(append([]string{}, loc...), k.Missing[0])
			return &FieldError{Path: path(doc, loc), Problem: "missing, and the schema requires it"}
		}
	}
	return &FieldError{Path: path(doc, loc), Problem: leaf.ErrorKind.LocalizedString(f.print())}
}

func (f *Format) print() *message.Printer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.printer == nil {
		f.printer = message.NewPrinter(language.English)
	}
	return f.printer
}

// deepest returns the leaf failure with the longest instance location (the first of those).
func deepest(e *jsonschema.ValidationError) *jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return e
	}
	best := deepest(e.Causes[0])
	for _, c := range e.Causes[1:] {
		if d := deepest(c); len(d.InstanceLocation) > len(best.InstanceLocation) {
			best = d
		}
	}
	return best
}

// path writes a JSON pointer's tokens as lines[2].qty, telling array indexes from member names by
// walking doc.
func path(doc any, tokens []string) string {
	var b strings.Builder
	cur := doc
	for _, tok := range tokens {
		switch x := cur.(type) {
		case []any:
			b.WriteString("[" + tok + "]")
			if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(x) {
				cur = x[i]
			} else {
				cur = nil
			}
			continue
		case map[string]any:
			cur = x[tok]
		default:
			cur = nil
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

// compile returns s compiled, from the cache when it was compiled before.
func (f *Format) compile(s sr.Schema) (*jsonschema.Schema, error) {
	if s.Type != sr.TypeJSON {
		return nil, fmt.Errorf("schema is of type %s, not JSON", s.Type)
	}
	f.mu.Lock()
	sch, ok := f.compiled[s.Schema]
	f.mu.Unlock()
	if ok {
		return sch, nil
	}
	if len(s.References) > 0 {
		return nil, fmt.Errorf("json schema references %s (subject %s), which is not resolved: inline the referenced definitions", s.References[0].Name, s.References[0].Subject)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(s.Schema)))
	if err != nil {
		return nil, fmt.Errorf("json schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fmt.Errorf("json schema: %w", err)
	}
	sch, err = c.Compile(schemaURL)
	if err != nil {
		return nil, fmt.Errorf("json schema does not compile: %w", err)
	}
	f.mu.Lock()
	if f.compiled == nil || len(f.compiled) >= maxCachedSchemas {
		f.compiled = map[string]*jsonschema.Schema{}
	}
	f.compiled[s.Schema] = sch
	f.mu.Unlock()
	return sch, nil
}

// noLoader refuses every URL outside the schema: compiling does no I/O.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("json schema refers to %s, outside itself; only a schema's own definitions are resolved: inline it", url)
}
