package avro

import (
	"strconv"
	"strings"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// Widen merges the schema inferred from a payload into the subject's latest inferred schema, so
// that a subject's schema only grows: fields of the latest first, in its order, then the payload's
// new ones; a number field widened (int, long, double) to hold both; nested records and arrays
// merged alike. So an event that leaves out a member, or holds a smaller number, fits the schema
// already registered (no new version, nothing refused), and one with a new member adds one
// compatible version. ok is false where the two cannot merge (a field that is a string in one
// and a number in the other, a latest schema that is not of the inferred shape: registered by
// hand): the inferred schema is then registered as it is, and the subject's compatibility rule
// decides.
func (f *Format) Widen(latest, inferred sr.Schema) (sr.Schema, bool) {
	lp, err := f.parse(latest)
	if err != nil {
		return sr.Schema{}, false
	}
	ip, err := f.parse(inferred)
	if err != nil {
		return sr.Schema{}, false
	}
	lr, ok1 := lp.(*avro.RecordSchema)
	ir, ok2 := ip.(*avro.RecordSchema)
	if !ok1 || !ok2 || lr.FullName() != ir.FullName() {
		return sr.Schema{}, false
	}
	ls, ok1 := fromRecord(lr)
	is, ok2 := fromRecord(ir)
	if !ok1 || !ok2 {
		return sr.Schema{}, false
	}
	merged, err := merge(ls, is, "")
	if err != nil {
		return sr.Schema{}, false
	}
	b := []byte(`{"type":"record","name":`)
	b = strconv.AppendQuote(b, ir.Name())
	if ns := ir.Namespace(); ns != "" {
		b = append(b, `,"namespace":`...)
		b = strconv.AppendQuote(b, ns)
	}
	b = merged.appendFields(b, ir.FullName())
	return sr.Schema{Schema: string(appendConnectName(b, ir.FullName())), Type: sr.TypeAvro}, true
}

// fromRecord reads back a record of the inferred shape: every field ["null", T] with default null.
func fromRecord(r *avro.RecordSchema) (*ischema, bool) {
	s := &ischema{typ: "record"}
	for _, f := range r.Fields() {
		u, ok := f.Type().(*avro.UnionSchema)
		if !ok || len(u.Types()) != 2 || u.Types()[0].Type() != avro.Null || !f.HasDefault() || f.Default() != nil {
			return nil, false
		}
		t, ok := fromType(u.Types()[1])
		if !ok {
			return nil, false
		}
		s.fields = append(s.fields, ifield{f.Name(), t})
	}
	return s, true
}

func fromType(t avro.Schema) (*ischema, bool) {
	if ref, ok := t.(*avro.RefSchema); ok {
		t = ref.Schema()
	}
	switch t := t.(type) {
	case *avro.RecordSchema:
		return fromRecord(t)
	case *avro.ArraySchema:
		u, ok := t.Items().(*avro.UnionSchema)
		if !ok || len(u.Types()) != 2 || u.Types()[0].Type() != avro.Null {
			return nil, false
		}
		items, ok := fromType(u.Types()[1])
		if !ok {
			return nil, false
		}
		return &ischema{typ: "array", items: items}, true
	case *avro.PrimitiveSchema:
		if t.Logical() != nil {
			return nil, false
		}
		switch t.Type() {
		case avro.String, avro.Boolean, avro.Int, avro.Long, avro.Double:
			return &ischema{typ: strings.ToLower(string(t.Type()))}, true
		}
	}
	return nil, false
}
