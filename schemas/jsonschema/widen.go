package jsonschema

import (
	"encoding/json"
	"strconv"

	"github.com/twmb/franz-go/pkg/sr"
)

// Widen merges the schema inferred from an event into the subject's latest inferred schema, so
// that a subject's schema only grows (the schemas.Widener the Serializer uses with
// auto_register): the properties of both, a property's schemas merged the same way, "null" and
// an array's items joining a property's type. A property whose types conflict (a number in one, a
// string in the other) takes the inferred schema's, so the registry's compatibility rule judges
// the change. ok is false when latest is not a schema Infer writes (a schema written by hand):
// the caller registers inferred as it is.
func (*Format) Widen(latest, inferred sr.Schema) (sr.Schema, bool) {
	if latest.Type != sr.TypeJSON || inferred.Type != sr.TypeJSON {
		return sr.Schema{}, false
	}
	lt, l, ok := parseInferred(latest.Schema)
	if !ok {
		return sr.Schema{}, false
	}
	it, in, ok := parseInferred(inferred.Schema)
	if !ok {
		return sr.Schema{}, false
	}
	merged := widen(l, in)
	if it == "" {
		it = lt
	}
	b := []byte(`{"$schema":` + strconv.Quote(draft07))
	if it != "" {
		b = append(b, `,"title":`...)
		b = appendString(b, it)
	}
	b = append(b, ',')
	b = merged.appendBody(b)
	return sr.Schema{Schema: string(b), Type: sr.TypeJSON}, true
}

// widen returns the union of a (the subject's) and b (the event's), as Widen says.
func widen(a, b *shape) *shape {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	if !kindsMeet(a, b) {
		return b
	}
	out := &shape{types: map[string]bool{}}
	for t := range a.types {
		out.types[t] = true
	}
	for t := range b.types {
		out.types[t] = true
	}
	if a.props != nil || b.props != nil {
		out.props = map[string]*shape{}
		for k, p := range a.props {
			out.props[k] = p
		}
		for k, p := range b.props {
			out.props[k] = widen(out.props[k], p)
		}
	}
	out.items = widen(a.items, b.items)
	return out
}

// kindsMeet says whether two shapes' types (null aside) are one within the other: a member that
// was a number and is still a number, or was null; not one that was a number and is a string.
func kindsMeet(a, b *shape) bool {
	within := func(x, y *shape) bool {
		for t := range x.types {
			if t != "null" && !y.types[t] {
				return false
			}
		}
		return true
	}
	return within(a, b) || within(b, a)
}

// parseInferred reads a schema Infer writes back to its title and shape; ok is false for any
// other schema (a keyword Infer does not write, additional properties allowed).
func parseInferred(text string) (title string, s *shape, ok bool) {
	var doc map[string]any
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		return "", nil, false
	}
	if v, has := doc["$schema"]; has && v != draft07 {
		return "", nil, false
	}
	if v, has := doc["title"]; has {
		if title, ok = v.(string); !ok {
			return "", nil, false
		}
	}
	delete(doc, "$schema")
	delete(doc, "title")
	s, ok = parseShape(doc)
	return title, s, ok
}

func parseShape(doc map[string]any) (*shape, bool) {
	s := &shape{types: map[string]bool{}}
	switch t := doc["type"].(type) {
	case string:
		s.types[t] = true
	case []any:
		for _, x := range t {
			name, ok := x.(string)
			if !ok {
				return nil, false
			}
			s.types[name] = true
		}
	default:
		return nil, false
	}
	for t := range s.types {
		switch t {
		case "null", "boolean", "number", "string", "array", "object":
		default:
			return nil, false // "integer" and the like: not Infer's
		}
	}
	for k, v := range doc {
		switch k {
		case "type":
		case "additionalProperties":
			if v != false || !s.types["object"] {
				return nil, false
			}
		case "items":
			m, ok := v.(map[string]any)
			if !ok || !s.types["array"] {
				return nil, false
			}
			if s.items, ok = parseShape(m); !ok {
				return nil, false
			}
		case "properties":
			m, ok := v.(map[string]any)
			if !ok || !s.types["object"] {
				return nil, false
			}
			s.props = map[string]*shape{}
			for name, p := range m {
				pm, ok := p.(map[string]any)
				if !ok {
					return nil, false
				}
				if s.props[name], ok = parseShape(pm); !ok {
					return nil, false
				}
			}
		default:
			return nil, false
		}
	}
	if s.types["object"] && doc["additionalProperties"] != false {
		return nil, false // an open model is not Infer's: merging would close it
	}
	return s, true
}
