package avro

import (
	"fmt"
	"strconv"
	"strings"
)

// Inference: how a JSON payload becomes an Avro record schema. It follows what Debezium's outbox
// router infers with table.expand.json.payload (Kafka Connect's schema of the document), as
// Connect's Avro converter writes that schema, so a Debezium user's consumers see the same shapes:
//
//   - The payload must be a JSON object; it becomes a record named name in namespace namespace.
//     Anything else (an array, a string, a number, null) cannot be inferred: Infer fails and the
//     event goes to the failure policy.
//   - Each member becomes a field, in document order, of type ["null", T] with default null: every
//     field is nullable, so a later event that lacks the member, or holds null in it, still fits,
//     and a schema that gains a field stays BACKWARD and FORWARD compatible.
//   - A member that is null, or an empty array (or one holding only nulls), says nothing of its
//     type and is left out (Debezium leaves it out too); an event holding a value there later
//     registers a schema with the field added, which is compatible.
//   - Strings are string, booleans boolean. Numbers: an integer within 32 bits is int, within 64
//     bits long, anything else (a fraction, an exponent, a larger integer) double (Connect's
//     INT32, INT64, FLOAT64). So {"qty": 1} then {"qty": 5000000000} are two versions, int then
//     long, which Avro's promotion rules make BACKWARD compatible; the reverse order is not.
//   - An object member becomes a nested record named after the member, in the namespace of the
//     record holding it (the top record's full name for its members): a member "address" of a
//     payload record named "payload" is the record "payload.address", as Connect names it.
//   - An array becomes {"type":"array","items":["null", T]}: its non-null elements must be of one
//     kind; numbers widen (int, long, double: an array of 1 and 2.5 is of double, where Debezium
//     would give up); objects merge into one record (the first element's fields in order, then
//     the new fields of the others). An array mixing kinds (a string and a number) cannot be
//     inferred.
//   - Names: a member name that is not an Avro name has each invalid character replaced by '_'
//     (and '_' put before a leading digit); two members that then share a name cannot be inferred.
//     The encoder matches a field to its member by the exact name first, then by this rule.
//   - Every record carries a "connect.name" property, its full name, after its fields, as
//     Connect's AvroData writes it: the schema text is then the one Debezium registers for the
//     same shape, and shares its id.

// Infer returns the Avro schema inferred from payload, as schema JSON.
func Infer(name, namespace string, payload []byte) (string, error) {
	doc, err := parse(payload)
	if err != nil {
		return "", err
	}
	return inferDoc(name, namespace, doc)
}

// inferDoc is Infer of a parsed payload.
func inferDoc(name, namespace string, doc *node) (string, error) {
	if err := validName(name); err != nil {
		return "", fmt.Errorf("record name: %w", err)
	}
	for _, part := range strings.Split(namespace, ".") {
		if namespace == "" {
			break
		}
		if err := validName(part); err != nil {
			return "", fmt.Errorf("record namespace %q: %w", namespace, err)
		}
	}
	if doc.kind != 'o' {
		return "", fmt.Errorf("the payload is %s, not a JSON object: an Avro record can be inferred only from an object", kindName(doc))
	}
	full := name
	if namespace != "" {
		full = namespace + "." + name
	}
	s, err := inferRecord(full, "", doc)
	if err != nil {
		return "", err
	}
	b := []byte(`{"type":"record","name":`)
	b = strconv.AppendQuote(b, name)
	if namespace != "" {
		b = append(b, `,"namespace":`...)
		b = strconv.AppendQuote(b, namespace)
	}
	b = s.appendFields(b, full)
	return string(appendConnectName(b, full)), nil
}

// appendConnectName closes a record with Kafka Connect's connect.name property, its full name,
// where Connect's AvroData writes it (after the fields): the text is then byte for byte the one
// Debezium's Avro converter registers for the same shape, so that after a cut-over from Debezium
// the relay's schema is the subject's existing version and reuses its id, rather than a new
// version of the same fields.
func appendConnectName(b []byte, full string) []byte {
	b = append(b, `,"connect.name":`...)
	b = strconv.AppendQuote(b, full)
	return append(b, '}')
}

// ischema is an inferred type: "record", "array", "string", "boolean", "int", "long", "double".
type ischema struct {
	typ    string
	fields []ifield // record
	items  *ischema // array
}

type ifield struct {
	name string
	s    *ischema
}

// inferRecord infers an object's record; path names it in errors.
func inferRecord(full, path string, n *node) (*ischema, error) {
	s := &ischema{typ: "record"}
	seen := map[string]string{} // field name -> the member it came from
	for i, k := range n.keys {
		fname := avroName(k)
		p := join(path, k)
		fs, err := infer(full+"."+fname, p, n.vals[i])
		if err != nil {
			return nil, err
		}
		if from, dup := seen[fname]; dup {
			if from == k { // a repeated member: the last one wins, as when encoding
				for j := range s.fields {
					if s.fields[j].name == fname && fs != nil {
						s.fields[j].s = fs
					}
				}
				continue
			}
			return nil, fmt.Errorf("members %q and %q of %s both become the Avro field %q: rename one", from, k, orPayload(path), fname)
		}
		seen[fname] = k
		if fs != nil {
			s.fields = append(s.fields, ifield{fname, fs})
		}
	}
	return s, nil
}

// infer is a value's type, nil for one that says nothing of it (null, an empty array).
func infer(full, path string, n *node) (*ischema, error) {
	switch n.kind {
	case 's':
		return &ischema{typ: "string"}, nil
	case 'b':
		return &ischema{typ: "boolean"}, nil
	case 'n':
		return &ischema{typ: numberType(n.num)}, nil
	case 'o':
		return inferRecord(full, path, n)
	case 'a':
		var items *ischema
		for i, e := range n.vals {
			es, err := infer(full, path+"["+strconv.Itoa(i)+"]", e)
			if err != nil {
				return nil, err
			}
			if items, err = merge(items, es, path); err != nil {
				return nil, err
			}
		}
		if items == nil {
			return nil, nil
		}
		return &ischema{typ: "array", items: items}, nil
	}
	return nil, nil
}

// merge is the type that holds values of both a and b (array elements), or an error naming path.
func merge(a, b *ischema, path string) (*ischema, error) {
	switch {
	case a == nil:
		return b, nil
	case b == nil:
		return a, nil
	case a.typ == b.typ && a.typ == "record":
		m := &ischema{typ: "record", fields: append([]ifield(nil), a.fields...)}
		for _, f := range b.fields {
			i := m.field(f.name)
			if i < 0 {
				m.fields = append(m.fields, f)
				continue
			}
			merged, err := merge(m.fields[i].s, f.s, path+"[]."+f.name)
			if err != nil {
				return nil, err
			}
			m.fields[i].s = merged
		}
		return m, nil
	case a.typ == b.typ && a.typ == "array":
		items, err := merge(a.items, b.items, path+"[]")
		if err != nil {
			return nil, err
		}
		return &ischema{typ: "array", items: items}, nil
	case a.typ == b.typ:
		return a, nil
	case isNumber(a.typ) && isNumber(b.typ):
		if a.typ == "double" || b.typ == "double" {
			return &ischema{typ: "double"}, nil
		}
		return &ischema{typ: "long"}, nil
	}
	return nil, fmt.Errorf("array %s mixes %s and %s elements: an Avro array holds one type", orPayload(path), a.typ, b.typ)
}

func isNumber(t string) bool { return t == "int" || t == "long" || t == "double" }

func (s *ischema) field(name string) int {
	for i := range s.fields {
		if s.fields[i].name == name {
			return i
		}
	}
	return -1
}

// appendFields writes a record's fields member; full is the record's full name, the namespace
// of its nested records.
func (s *ischema) appendFields(b []byte, full string) []byte {
	b = append(b, `,"fields":[`...)
	for i, f := range s.fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = strconv.AppendQuote(b, f.name)
		b = append(b, `,"type":`...)
		b = f.s.appendNullable(b, f.name, full)
		b = append(b, `,"default":null}`...)
	}
	return append(b, ']')
}

// appendNullable writes ["null", T]; name is the field's, which names a record T.
func (s *ischema) appendNullable(b []byte, name, namespace string) []byte {
	b = append(b, `["null",`...)
	b = s.appendType(b, name, namespace)
	return append(b, ']')
}

func (s *ischema) appendType(b []byte, name, namespace string) []byte {
	switch s.typ {
	case "record":
		b = append(b, `{"type":"record","name":`...)
		b = strconv.AppendQuote(b, name)
		b = append(b, `,"namespace":`...)
		b = strconv.AppendQuote(b, namespace)
		b = s.appendFields(b, namespace+"."+name)
		return appendConnectName(b, namespace+"."+name)
	case "array":
		b = append(b, `{"type":"array","items":`...)
		b = s.items.appendNullable(b, name, namespace)
		return append(b, '}')
	}
	return strconv.AppendQuote(b, s.typ)
}

// avroName makes s an Avro name: [A-Za-z_][A-Za-z0-9_]*.
func avroName(s string) string {
	if validName(s) == nil {
		return s
	}
	var b strings.Builder
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		b.WriteByte('_')
	}
	for _, r := range s {
		if r == '_' || r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

func validName(s string) error {
	if s == "" {
		return fmt.Errorf("an Avro name cannot be empty")
	}
	for i, r := range s {
		ok := r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9'
		if !ok {
			return fmt.Errorf("%q is not an Avro name (letters, digits and '_', not starting with a digit)", s)
		}
	}
	return nil
}

func join(path, member string) string {
	if path == "" {
		return member
	}
	return path + "." + member
}

func orPayload(path string) string {
	if path == "" {
		return "the payload"
	}
	return path
}
