package protobuf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"
)

// Infer returns the proto3 schema of payload (a JSON object), as the package doc says: one
// top-level message named name in package namespace.
func (f *Format) Infer(name, namespace string, payload []byte) (sr.Schema, error) {
	msgName := pascal(identifier(name))
	if msgName == "" {
		return sr.Schema{}, fmt.Errorf("protobuf record name %q has no letter or digit to make a message name of: set a record name", name)
	}
	pkg, err := packageName(namespace)
	if err != nil {
		return sr.Schema{}, err
	}
	doc, err := parseJSON(payload)
	if err != nil {
		return sr.Schema{}, &FieldError{Problem: "the payload is not JSON: " + err.Error()}
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return sr.Schema{}, fieldErr("", "a JSON %s, and a Protobuf message needs a JSON object: write an object, or use value_encoding json-string or raw", kindName(doc))
	}
	m, err := inferMessage(msgName, obj, "")
	if err != nil {
		return sr.Schema{}, err
	}
	var b strings.Builder
	b.WriteString("syntax = \"proto3\";\n")
	if pkg != "" {
		fmt.Fprintf(&b, "package %s;\n", pkg)
	}
	b.WriteString("\n")
	m.write(&b, "")
	return sr.Schema{Schema: b.String(), Type: sr.TypeProtobuf}, nil
}

// message is an inferred message type.
type message struct {
	name   string
	fields []*protoField // in name order
	nested []*message    // in name order
}

type protoField struct {
	key      string // the JSON member name (json_name)
	name     string // the Protobuf field name
	number   int
	typ      string // scalar type, or the nested message's name
	msg      *message
	repeated bool
}

// inferMessage builds the message for one JSON object; path names the object in errors.
func inferMessage(name string, obj map[string]any, path string) (*message, error) {
	m := &message{name: name}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Fields and nested types share the message's scope, and a nested type may not be named like
	// its parent: names are given fields first, then types.
	used := map[string]bool{name: true}
	for _, k := range keys {
		fd, err := inferField(k, obj[k], memberPath(path, k))
		if err != nil {
			return nil, err
		}
		if fd == nil {
			continue // null or []: no type to say
		}
		fd.name = unique(fieldName(k), used)
		m.fields = append(m.fields, fd)
	}
	for _, fd := range m.fields {
		if fd.msg != nil {
			fd.msg.name = unique(pascal(fd.name), used)
			fd.typ = fd.msg.name
			m.nested = append(m.nested, fd.msg)
		}
	}
	numberFields(m.fields)
	return m, nil
}

// inferField returns the field for member key with value v, or nil where v has no type.
func inferField(key string, v any, path string) (*protoField, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case []any:
		if len(x) == 0 {
			return nil, nil
		}
		el, err := mergeElements(x, path)
		if err != nil {
			return nil, err
		}
		el.key, el.repeated = key, true
		return el, nil
	default:
		fd, err := inferValue(v, path)
		if err != nil {
			return nil, err
		}
		fd.key = key
		return fd, nil
	}
}

// inferValue types one non-null, non-array value.
func inferValue(v any, path string) (*protoField, error) {
	switch x := v.(type) {
	case string:
		return &protoField{typ: "string"}, nil
	case bool:
		return &protoField{typ: "bool"}, nil
	case json.Number:
		return &protoField{typ: numberType(x)}, nil
	case map[string]any:
		m, err := inferMessage("", x, path)
		if err != nil {
			return nil, err
		}
		return &protoField{msg: m}, nil
	}
	return nil, fieldErr(path, "a JSON %s, which has no Protobuf type here", kindName(v))
}

// mergeElements types an array's elements as one repeated field's element.
func mergeElements(arr []any, path string) (*protoField, error) {
	var objs []map[string]any
	kind, typ := "", ""
	for i, v := range arr {
		k := kindName(v)
		switch {
		case v == nil:
			return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "null in an array; a Protobuf repeated field cannot hold one: leave the null out")
		case k == "array":
			return nil, fieldErr(path, "an array of arrays, which Protobuf cannot say without a wrapper message: nest the inner arrays in objects")
		case kind != "" && k != kind:
			return nil, fieldErr(path, "an array mixing a JSON %s and a JSON %s; a Protobuf repeated field has one type", kind, k)
		}
		kind = k
		switch x := v.(type) {
		case map[string]any:
			objs = append(objs, x)
		case json.Number:
			if t := numberType(x); typ == "" || t == "double" {
				typ = t
			}
		}
	}
	if kind != "object" {
		fd, err := inferValue(arr[0], path)
		if err != nil {
			return nil, err
		}
		if typ != "" {
			fd.typ = typ
		}
		return fd, nil
	}
	merged, err := mergeObjects(objs, path+"[]")
	if err != nil {
		return nil, err
	}
	m, err := inferMessage("", merged, path+"[]")
	if err != nil {
		return nil, err
	}
	return &protoField{msg: m}, nil
}

// mergeObjects makes one object with the members of all of objs, so that inferMessage types the
// union; a member's values from every element are merged the same way (numbers widen, objects
// union, nulls and empty arrays give way to a typed value).
func mergeObjects(objs []map[string]any, path string) (map[string]any, error) {
	out := map[string]any{}
	for _, o := range objs {
		for k, v := range o {
			prev, seen := out[k]
			if !seen || isUntyped(prev) {
				out[k] = v
				continue
			}
			if isUntyped(v) {
				continue
			}
			mv, err := mergeValues(prev, v, memberPath(path, k))
			if err != nil {
				return nil, err
			}
			out[k] = mv
		}
	}
	return out, nil
}

func mergeValues(a, b any, path string) (any, error) {
	ka, kb := kindName(a), kindName(b)
	if ka != kb {
		return nil, fieldErr(path, "a JSON %s in one array element and a JSON %s in another; a Protobuf field has one type", ka, kb)
	}
	switch x := a.(type) {
	case json.Number:
		if numberType(x) == "double" {
			return x, nil
		}
		return b, nil // b is double or int64: either is wide enough
	case map[string]any:
		return mergeObjects([]map[string]any{x, b.(map[string]any)}, path)
	case []any:
		return append(append([]any{}, x...), b.([]any)...), nil // merged element-wise by mergeElements
	}
	return a, nil
}

func isUntyped(v any) bool {
	if v == nil {
		return true
	}
	a, ok := v.([]any)
	return ok && len(a) == 0
}

// fieldNumberSpace: numbers 1 .. 2^25-1 keep every tag within a 4-byte varint.
const fieldNumberSpace = 1<<25 - 1

// numberFields gives each field its number from its JSON name (see the package doc); fields are
// in name order, so a collision resolves the same way in every schema holding both names.
func numberFields(fields []*protoField) {
	taken := map[int]bool{}
	for _, fd := range fields {
		n := fieldNumber(fd.key)
		for taken[n] {
			n = nextNumber(n)
		}
		taken[n] = true
		fd.number = n
	}
}

func fieldNumber(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	n := 1 + int(h.Sum32()%(fieldNumberSpace))
	if n >= 19000 && n <= 19999 { // reserved for the Protobuf implementation
		n += 1000
	}
	return n
}

func nextNumber(n int) int {
	n++
	if n > fieldNumberSpace {
		n = 1
	}
	if n >= 19000 && n <= 19999 {
		n = 20000
	}
	return n
}

func (m *message) write(b *strings.Builder, indent string) {
	fmt.Fprintf(b, "%smessage %s {\n", indent, m.name)
	for _, n := range m.nested {
		n.write(b, indent+"  ")
	}
	for _, fd := range m.fields {
		label := "optional "
		if fd.repeated {
			label = "repeated "
		} else if fd.msg != nil {
			label = "" // message fields have presence already
		}
		fmt.Fprintf(b, "%s  %s%s %s = %d [json_name = %s];\n", indent, label, fd.typ, fd.name, fd.number, protoQuote(fd.key))
	}
	fmt.Fprintf(b, "%s}\n", indent)
}

// protoQuote writes s as a Protobuf string literal: UTF-8 as it is, '"' and '\\' escaped, other
// bytes below 0x20 and 0x7f as octal escapes (which every Protobuf parser reads, where \u is not
// universal).
func protoQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// numberType is the Protobuf type of a JSON number: int64 for an integer that fits, else double.
func numberType(n json.Number) string {
	if strings.ContainsAny(string(n), ".eE") {
		return "double"
	}
	if _, err := strconv.ParseInt(string(n), 10, 64); err != nil {
		return "double"
	}
	return "int64"
}

// identifier makes s a Protobuf identifier's characters: [A-Za-z0-9_], others replaced by '_'.
func identifier(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 128 && (r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// fieldName makes a JSON member name a Protobuf field name.
func fieldName(key string) string {
	s := identifier(key)
	if s == "" || s[0] == '_' || s[0] >= '0' && s[0] <= '9' {
		s = "f_" + s
	}
	return s
}

// pascal makes order_line or orderLine OrderLine, for a message name.
func pascal(s string) string {
	var b strings.Builder
	up := true
	for _, r := range s {
		if r == '_' {
			up = true
			continue
		}
		if up && r >= 'a' && r <= 'z' {
			r -= 'a' - 'A'
		}
		up = false
		b.WriteRune(r)
	}
	out := b.String()
	if out != "" && out[0] >= '0' && out[0] <= '9' {
		out = "M" + out
	}
	return out
}

// packageName checks a namespace as a Protobuf package (dot-separated identifiers).
func packageName(ns string) (string, error) {
	if ns == "" {
		return "", nil
	}
	for _, part := range strings.Split(ns, ".") {
		if part == "" || identifier(part) != part || part[0] >= '0' && part[0] <= '9' {
			return "", fmt.Errorf("protobuf namespace %q is not a Protobuf package name (dot-separated identifiers of letters, digits and '_'): set a namespace like com.example.orders", ns)
		}
	}
	return ns, nil
}

// unique returns s, or s with the first free suffix _2, _3, ... when used holds it; it records
// the result in used.
func unique(s string, used map[string]bool) string {
	out := s
	for i := 2; used[out]; i++ {
		out = s + "_" + strconv.Itoa(i)
	}
	used[out] = true
	return out
}

func kindName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
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
