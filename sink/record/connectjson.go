package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
)

// JSONWithSchema writes what Debezium's outbox router writes with table.expand.json.payload
// and Kafka Connect's JsonConverter with schemas.enable=true: an envelope {"schema": ..., "payload":
// ...} whose schema is the Connect schema Debezium infers from the payload document
// (io.debezium.transforms.outbox.JsonSchemaData) and whose payload is the document as Connect data.
// A payload that is not a JSON object, or that Debezium cannot expand (an array mixing types),
// stays a string, with the schema of Debezium's jsonb column
// (io.debezium.data.Json). For a key (key_encoding), the string schema of a NOT NULL text column.
const JSONWithSchema Encoding = "json-with-schema"

// jsonSchemaOfJSONColumn is the Connect schema Debezium gives a nullable json or jsonb column, as
// JsonConverter writes it.
const jsonSchemaOfJSONColumn = `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`

// JSONExpanded writes what Debezium's outbox router writes with table.expand.json.payload and
// JsonConverter with schemas.enable=false: a JSON object payload as the Connect data Debezium makes
// of it (members in document order, null members and empty arrays left out, numbers as Connect's
// int32, int64 or double), compactly; any other payload (or one Debezium cannot expand) as a JSON
// string of its text.
const JSONExpanded Encoding = "json-expanded"

// expand is Debezium's JSON expansion of a payload: the inferred schema and the document as
// Connect data, or ok false where Debezium keeps the payload a string. name is the payload column's
// name (Debezium names the document's struct after it).
func expand(payload []byte, name string) (s *schema, data []byte, ok bool) {
	// Debezium expands objects only: it infers an array's schema, then fails to make a struct of
	// the array, keeps the string, and the record (array schema, string value) fails the task.
	// The relay keeps the string.
	t := bytes.TrimLeft(payload, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return nil, nil, false
	}
	doc, err := parseOrdered(payload)
	if err != nil {
		return nil, nil, false
	}
	s, err = inferSchema(name, doc)
	if err != nil || s == nil {
		return nil, nil, false // Debezium logs "JSON expansion failed" and keeps the string
	}
	data, err = appendConnectData(nil, doc, s)
	if err != nil {
		return nil, nil, false
	}
	return s, data, true
}

// expandedValue encodes a payload as JSONExpanded; NULL stays NULL.
func expandedValue(payload []byte, name string) []byte {
	if payload == nil {
		return nil
	}
	if _, data, ok := expand(payload, name); ok {
		return data
	}
	return appendJSONString(make([]byte, 0, len(payload)+16), validUTF8(payload))
}

// connectJSONValue encodes a payload as JSONWithSchema. A NULL payload is a null payload in
// the envelope, as JsonConverter writes a null value with a schema.
func connectJSONValue(payload []byte, name string) []byte {
	b := make([]byte, 0, 2*len(payload)+128)
	b = append(b, `{"schema":`...)
	if payload == nil {
		return append(append(b, jsonSchemaOfJSONColumn...), `,"payload":null}`...)
	}
	if s, data, ok := expand(payload, name); ok {
		b = s.appendJSON(b)
		b = append(b, `,"payload":`...)
		b = append(b, data...)
		return append(b, '}')
	}
	b = append(b, jsonSchemaOfJSONColumn...)
	b = append(b, `,"payload":`...)
	b = appendJSONString(b, validUTF8(payload))
	return append(b, '}')
}

// connectJSONKey encodes a key as JsonConverter with schemas.enable=true writes a text column's
// value: a NOT NULL one's, or, for a NULL aggregate id, a nullable one's (a required schema with a
// null payload is a record JsonConverter refuses to read).
func connectJSONKey(key []byte) []byte {
	if key == nil {
		return []byte(`{"schema":{"type":"string","optional":true},"payload":null}`)
	}
	b := append(make([]byte, 0, len(key)+64), `{"schema":{"type":"string","optional":false},"payload":`...)
	b = appendJSONString(b, validUTF8(key))
	return append(b, '}')
}

// node is a parsed JSON value that keeps what Jackson's tree keeps: member order, and a number's
// text (to tell an int from a long from a double, as Jackson's IntNode, LongNode, DoubleNode do).
type node struct {
	kind    byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' boolean, 'z' null
	str     string
	num     json.Number
	boolean bool
	keys    []string
	vals    []*node // object members (in keys' order) or array elements
}

func parseOrdered(b []byte) (*node, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	n, err := parseNode(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("content after the JSON value")
	}
	return n, nil
}

func parseNode(dec *json.Decoder) (*node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		n := &node{kind: 'a'}
		if v == '{' {
			n.kind = 'o'
		}
		for dec.More() {
			if n.kind == 'o' {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				n.keys = append(n.keys, k.(string))
			}
			child, err := parseNode(dec)
			if err != nil {
				return nil, err
			}
			n.vals = append(n.vals, child)
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	case string:
		return &node{kind: 's', str: v}, nil
	case json.Number:
		return &node{kind: 'n', num: v}, nil
	case bool:
		return &node{kind: 'b', boolean: v}, nil
	case nil:
		return &node{kind: 'z'}, nil
	}
	return nil, errors.New("unexpected JSON token")
}

// numberType is the Connect type Jackson's number node maps to: an integer that fits an int is
// INT32 (IntNode), one that fits a long INT64 (LongNode), anything else FLOAT64 (DoubleNode, or a
// BigIntegerNode, which Debezium declares FLOAT64 too).
func numberType(n json.Number) string {
	s := string(n)
	if strings.ContainsAny(s, ".eE") {
		return "double"
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		if v >= math.MinInt32 && v <= math.MaxInt32 {
			return "int32"
		}
		return "int64"
	}
	return "double"
}

// schema is a Connect schema (org.apache.kafka.connect.data.Schema) as JsonSchemaData builds it:
// optional (but for merged array elements), a struct named after the key of its place in the
// document.
type schema struct {
	typ      string // "struct", "array", "string", "boolean", "int32", "int64", "double" (Connect's FLOAT64)
	name     string
	named    bool
	optional bool
	fields   []field
	items    *schema
}

type field struct {
	name string
	s    *schema
}

var errExpansion = errors.New("the document cannot be expanded")

// inferSchema is JsonSchemaData.toConnectSchema: nil for null and empty arrays (such members are
// left out of their struct), and errExpansion where Debezium throws.
func inferSchema(key string, n *node) (*schema, error) {
	switch n.kind {
	case 's':
		return &schema{typ: "string", optional: true}, nil
	case 'b':
		return &schema{typ: "boolean", optional: true}, nil
	case 'n':
		return &schema{typ: numberType(n.num), optional: true}, nil
	case 'a':
		if len(n.vals) == 0 {
			return nil, nil
		}
		item, err := arrayItemSchema(key, n)
		if err != nil {
			return nil, err
		}
		return &schema{typ: "array", items: item, optional: true}, nil
	case 'o':
		s := &schema{typ: "struct", name: key, named: key != "", optional: true} // a null key: no name
		for i, k := range n.keys {
			fieldKey := k
			if strings.TrimSpace(key) != "" {
				fieldKey = key + "." + k
			}
			fs, err := inferSchema(fieldKey, n.vals[i])
			if err != nil {
				return nil, err
			}
			if fs == nil || s.field(k) != nil {
				continue
			}
			s.fields = append(s.fields, field{k, fs})
		}
		return s, nil
	}
	return nil, nil
}

func (s *schema) field(name string) *field {
	for i := range s.fields {
		if s.fields[i].name == name {
			return &s.fields[i]
		}
	}
	return nil
}

// arrayItemSchema is toConnectSchemaWithCycles: the first non-null element decides, every other
// element must be of its kind (and, for numbers, of its Connect type); objects' schemas are merged,
// fields of the first in order, then new fields of the others.
func arrayItemSchema(key string, a *node) (*schema, error) {
	var ref *node
	refType := ""
	for _, e := range a.vals {
		if e.kind == 'z' {
			continue
		}
		if ref == nil {
			ref = e
		}
		if e.kind != ref.kind {
			return nil, errExpansion // "Field is not a homogenous array"
		}
		if e.kind == 'n' {
			if refType == "" {
				refType = numberType(ref.num)
			}
			if numberType(e.num) != refType {
				return nil, errExpansion
			}
		}
	}
	if ref == nil {
		return nil, errExpansion // "Array ... has unrecognized member schema"
	}
	if ref.kind != 'o' {
		s, err := inferSchema("", ref)
		if err != nil {
			return nil, err
		}
		if s == nil {
			return nil, errExpansion
		}
		return s, nil
	}
	// Debezium merges the distinct element schemas (a HashSet of them): one distinct schema (the
	// usual case: elements with the same members) is used as it is; several are merged into a
	// copy that keeps the name but not the optional flag (Kafka's SchemaUtil.copySchemaBasics),
	// fields of the first, then new fields of the others. The HashSet's order depends on the JVM's
	// identity hash codes, so the relay merges in document order; only the order of fields that
	// some elements lack can differ from a given Debezium run.
	var distinct []*schema
	for _, e := range a.vals {
		if e.kind != 'o' {
			continue
		}
		s, err := inferSchema(key, e)
		if err != nil {
			return nil, err
		}
		seen := false
		for _, d := range distinct {
			seen = seen || d.equal(s)
		}
		if !seen {
			distinct = append(distinct, s)
		}
	}
	if len(distinct) == 1 {
		return distinct[0], nil
	}
	merged := &schema{typ: "struct", name: distinct[0].name, named: distinct[0].named}
	for _, s := range distinct {
		for _, f := range s.fields {
			if merged.field(f.name) == nil {
				merged.fields = append(merged.fields, f)
			}
		}
	}
	return merged, nil
}

// equal compares two schemas as Connect does (ConnectSchema.equals).
func (s *schema) equal(o *schema) bool {
	if s == nil || o == nil {
		return s == o
	}
	if s.typ != o.typ || s.name != o.name || s.named != o.named || s.optional != o.optional || len(s.fields) != len(o.fields) || !s.items.equal(o.items) {
		return false
	}
	for i := range s.fields {
		if s.fields[i].name != o.fields[i].name || !s.fields[i].s.equal(o.fields[i].s) {
			return false
		}
	}
	return true
}

// appendJSON writes the schema as JsonConverter.asJsonSchema does: type, then fields or items,
// optional, name.
func (s *schema) appendJSON(b []byte) []byte {
	b = append(b, `{"type":"`...)
	b = append(b, s.typ...)
	b = append(b, '"')
	switch s.typ {
	case "struct":
		b = append(b, `,"fields":[`...)
		for i, f := range s.fields {
			if i > 0 {
				b = append(b, ',')
			}
			fb := f.s.appendJSON(nil)
			b = append(b, fb[:len(fb)-1]...) // the field's schema, with "field" added last
			b = append(b, `,"field":`...)
			b = appendJSONString(b, []byte(f.name))
			b = append(b, '}')
		}
		b = append(b, ']')
	case "array":
		b = append(b, `,"items":`...)
		b = s.items.appendJSON(b)
	}
	b = append(b, `,"optional":`...)
	b = strconv.AppendBool(b, s.optional)
	if s.named {
		b = append(b, `,"name":`...)
		b = appendJSONString(b, []byte(s.name))
	}
	return append(b, '}')
}

// appendConnectData writes n as Connect data of schema s, as JsonConverter writes it: a struct has
// exactly its schema's fields, in order (null where the document lacks one); a value that does not
// fit its schema is errExpansion (Debezium's Struct validation fails and it keeps the string).
func appendConnectData(b []byte, n *node, s *schema) ([]byte, error) {
	if n == nil || n.kind == 'z' {
		return append(b, "null"...), nil
	}
	var err error
	switch s.typ {
	case "struct":
		if n.kind != 'o' {
			return nil, errExpansion
		}
		b = append(b, '{')
		for i, f := range s.fields {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, []byte(f.name))
			b = append(b, ':')
			var v *node
			for j := len(n.keys) - 1; j >= 0; j-- { // Jackson keeps the last of duplicate members
				if n.keys[j] == f.name {
					v = n.vals[j]
					break
				}
			}
			if b, err = appendConnectData(b, v, f.s); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case "array":
		if n.kind != 'a' {
			return nil, errExpansion
		}
		b = append(b, '[')
		for i, e := range n.vals {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendConnectData(b, e, s.items); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case "string":
		if n.kind != 's' {
			return nil, errExpansion
		}
		return appendJSONString(b, []byte(n.str)), nil
	case "boolean":
		if n.kind != 'b' {
			return nil, errExpansion
		}
		return strconv.AppendBool(b, n.boolean), nil
	case "int32", "int64":
		if n.kind != 'n' || numberType(n.num) != s.typ {
			return nil, errExpansion
		}
		return append(b, n.num...), nil
	case "double":
		if n.kind != 'n' || numberType(n.num) != "double" {
			return nil, errExpansion
		}
		f, err := strconv.ParseFloat(string(n.num), 64)
		if err != nil && !strings.ContainsAny(string(n.num), ".eE") {
			// An integer beyond a long: Debezium's BigDecimal does not fit FLOAT64 either.
			return nil, errExpansion
		}
		return appendJavaDouble(b, f), nil
	}
	return nil, errExpansion
}

// appendJavaDouble writes f as Java's Double.toString (and so Jackson) does: the shortest digits
// that read back as f, in plain notation with at least one fractional digit for 1e-3 <= |f| < 1e7,
// else as d.dddE[-]n.
func appendJavaDouble(b []byte, f float64) []byte {
	if f == 0 {
		if math.Signbit(f) {
			return append(b, "-0.0"...)
		}
		return append(b, "0.0"...)
	}
	abs := math.Abs(f)
	if abs >= 1e-3 && abs < 1e7 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return append(b, s...)
	}
	// Scientific: FormatFloat's 'e' gives d.ddde±XX with the shortest digits.
	s := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(s, "e")
	if !strings.Contains(mant, ".") {
		mant += ".0"
	}
	e, _ := strconv.Atoi(exp)
	b = append(b, mant...)
	b = append(b, 'E')
	return strconv.AppendInt(b, int64(e), 10)
}
