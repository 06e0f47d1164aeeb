package avro

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// Conversion: how a JSON payload is written in a given Avro schema (the inferred one, or the
// registry's in strict mode). The JSON is plain JSON, not Avro's JSON encoding (no {"type": value}
// wrappers around union values):
//
//   - record: an object; each field from the member of its name (or the member whose name becomes
//     it, see Infer). A missing member takes the field's default; without a default it is null
//     where the field is nullable, and fails otherwise. A null member of a field that is not
//     nullable takes its default, and fails without one. A member the record has no field for
//     fails too (strict mode never drops data silently), unless it holds nothing (null, an empty
//     array), as inference leaves such members out.
//   - union: the first branch the value fits (null fits null; a number an int, long, float or double
//     branch it fits without loss; a string a string, enum symbol, bytes or fixed branch; ...).
//   - int and long: an integer that fits; float and double: any number.
//   - string: a string. enum: one of its symbols. bytes and fixed: a string in standard base64
//     (fixed: of exactly its size).
//   - logical types: date from "2006-01-02" or days since the epoch; timestamp-millis and
//     timestamp-micros (and the local- ones) from RFC 3339 text or a number in the unit;
//     time-millis and time-micros from "15:04:05.999999" or a number; decimal (bytes or fixed) from a
//     number or a numeric string with at most the schema's scale of fractional digits; uuid from a
//     string.
//   - map: an object; array: an array.
//
// A value that does not fit fails with a FieldError naming the field's path in the payload.

// FieldError says which field of the payload does not fit the schema and why.
type FieldError struct {
	Path    string // e.g. "order.items[2].price"; "" for the payload itself
	Problem string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("field %s: %s", orPayload(e.Path), e.Problem)
}

func mismatch(path, format string, args ...any) error {
	return &FieldError{Path: path, Problem: fmt.Sprintf(format, args...)}
}

// encode appends n written in s.
func encode(b []byte, s avro.Schema, n *node, path string) ([]byte, error) {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	if n == nil {
		n = &node{kind: 'z'}
	}
	switch s := s.(type) {
	case *avro.NullSchema:
		if n.kind != 'z' {
			return nil, mismatch(path, "want null, got %s", kindName(n))
		}
		return b, nil
	case *avro.UnionSchema:
		return encodeUnion(b, s, n, path)
	case *avro.RecordSchema:
		if n.kind != 'o' {
			return nil, mismatch(path, "want an object (record %s), got %s", s.FullName(), kindName(n))
		}
		return encodeRecord(b, s, n, path)
	case *avro.ArraySchema:
		if n.kind != 'a' {
			return nil, mismatch(path, "want an array, got %s", kindName(n))
		}
		var err error
		if len(n.vals) > 0 {
			b = binary.AppendVarint(b, int64(len(n.vals)))
			for i, e := range n.vals {
				if b, err = encode(b, s.Items(), e, path+"["+strconv.Itoa(i)+"]"); err != nil {
					return nil, err
				}
			}
		}
		return append(b, 0), nil
	case *avro.MapSchema:
		if n.kind != 'o' {
			return nil, mismatch(path, "want an object (map), got %s", kindName(n))
		}
		var err error
		if len(n.keys) > 0 {
			b = binary.AppendVarint(b, int64(len(n.keys)))
			for i, k := range n.keys {
				b = appendString(b, k)
				if b, err = encode(b, s.Values(), n.vals[i], join(path, k)); err != nil {
					return nil, err
				}
			}
		}
		return append(b, 0), nil
	case *avro.EnumSchema:
		if n.kind == 's' {
			for i, sym := range s.Symbols() {
				if sym == n.str {
					return binary.AppendVarint(b, int64(i)), nil
				}
			}
		}
		return nil, mismatch(path, "want one of the symbols %s of enum %s, got %s", strings.Join(s.Symbols(), ", "), s.FullName(), kindName(n))
	case *avro.FixedSchema:
		if l := s.Logical(); l != nil && l.Type() == avro.Decimal {
			return encodeDecimal(b, l.(*avro.DecimalLogicalSchema), s.Size(), n, path)
		}
		raw, err := base64Bytes(n, path)
		if err != nil {
			return nil, err
		}
		if len(raw) != s.Size() {
			return nil, mismatch(path, "want %d bytes (fixed %s), got %d", s.Size(), s.FullName(), len(raw))
		}
		return append(b, raw...), nil
	case *avro.PrimitiveSchema:
		return encodePrimitive(b, s, n, path)
	}
	return nil, mismatch(path, "the schema's type %s is not supported", s.Type())
}

func encodeUnion(b []byte, s *avro.UnionSchema, n *node, path string) ([]byte, error) {
	var first error
	for i, t := range s.Types() {
		// Cheap kind checks first, so a record is not written in part for a branch that fails.
		if !mayFit(t, n) {
			continue
		}
		out, err := encode(binary.AppendVarint(b, int64(i)), t, n, path)
		if err == nil {
			return out, nil
		}
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	names := make([]string, len(s.Types()))
	for i, t := range s.Types() {
		names[i] = typeName(t)
	}
	return nil, mismatch(path, "want one of %s, got %s", strings.Join(names, ", "), kindName(n))
}

// mayFit says whether n's kind can fit t at all.
func mayFit(t avro.Schema, n *node) bool {
	if ref, ok := t.(*avro.RefSchema); ok {
		t = ref.Schema()
	}
	switch t.Type() {
	case avro.Null:
		return n.kind == 'z'
	case avro.Record, avro.Map:
		return n.kind == 'o'
	case avro.Array:
		return n.kind == 'a'
	case avro.Boolean:
		return n.kind == 'b'
	case avro.Enum, avro.String:
		return n.kind == 's'
	case avro.Int, avro.Long, avro.Float, avro.Double:
		if n.kind == 's' { // a date or a timestamp as text
			if p, ok := t.(*avro.PrimitiveSchema); ok && p.Logical() != nil {
				return true
			}
		}
		return n.kind == 'n'
	case avro.Bytes, avro.Fixed:
		return n.kind == 's' || n.kind == 'n'
	}
	return false
}

func typeName(t avro.Schema) string {
	if named, ok := t.(avro.NamedSchema); ok {
		return named.FullName()
	}
	if ref, ok := t.(*avro.RefSchema); ok {
		return ref.Schema().FullName()
	}
	return string(t.Type())
}

func encodeRecord(b []byte, s *avro.RecordSchema, n *node, path string) ([]byte, error) {
	var room [32]bool // most records' members: no allocation
	var used []bool
	if len(n.keys) <= len(room) {
		used = room[:len(n.keys)]
	} else {
		used = make([]bool, len(n.keys))
	}
	var err error
	for _, f := range s.Fields() {
		v, at := fieldValue(n, f.Name())
		if at >= 0 {
			used[at] = true
		}
		fpath := join(path, f.Name())
		switch {
		case v == nil && acceptsNull(f.Type()) && !f.HasDefault():
			v = &node{kind: 'z'} // a member left out is null, as inference leaves null members out
		case v == nil && !f.HasDefault():
			return nil, mismatch(fpath, "missing, and the field has no default")
		case v == nil, v.kind == 'z' && !acceptsNull(f.Type()) && f.HasDefault():
			if b, err = appendDefault(b, f, fpath); err != nil {
				return nil, err
			}
			continue
		}
		if b, err = encode(b, f.Type(), v, fpath); err != nil {
			return nil, err
		}
	}
	for i, ok := range used {
		if !ok && !repeatedUsed(n, i, used) && !empty(n.vals[i]) {
			return nil, mismatch(join(path, n.keys[i]), "the record %s has no such field (add it to the schema, or leave it out of the payload)", s.FullName())
		}
	}
	return b, nil
}

// empty says whether n holds nothing (null, an empty array, an array of nulls): a member the
// record lacks may hold it, as inference leaves such members out, and nothing is lost.
func empty(n *node) bool {
	if n.kind == 'z' {
		return true
	}
	if n.kind != 'a' {
		return false
	}
	for _, e := range n.vals {
		if e.kind != 'z' {
			return false
		}
	}
	return true
}

// repeatedUsed: an earlier copy of a repeated member counts as used when its last copy is.
func repeatedUsed(n *node, i int, used []bool) bool {
	for j := i + 1; j < len(n.keys); j++ {
		if n.keys[j] == n.keys[i] && used[j] {
			return true
		}
	}
	return false
}

// fieldValue finds the member for the field name: of that name, else one whose name becomes it
// (avroName). at is its index, -1 when there is none.
func fieldValue(n *node, name string) (*node, int) {
	for j := len(n.keys) - 1; j >= 0; j-- {
		if n.keys[j] == name {
			return n.vals[j], j
		}
	}
	for j := len(n.keys) - 1; j >= 0; j-- {
		if avroName(n.keys[j]) == name {
			return n.vals[j], j
		}
	}
	return nil, -1
}

func acceptsNull(t avro.Schema) bool {
	switch t := t.(type) {
	case *avro.NullSchema:
		return true
	case *avro.UnionSchema:
		return t.Nullable() || t.Contains(avro.Null)
	}
	return false
}

func appendDefault(b []byte, f *avro.Field, path string) ([]byte, error) {
	d, err := avro.Marshal(f.Type(), f.Default())
	if err != nil {
		return nil, mismatch(path, "missing, and its default cannot be written: %v", err)
	}
	return append(b, d...), nil
}

func encodePrimitive(b []byte, s *avro.PrimitiveSchema, n *node, path string) ([]byte, error) {
	if l := s.Logical(); l != nil {
		if out, ok, err := encodeLogical(b, s, l, n, path); ok || err != nil {
			return out, err
		}
	}
	switch s.Type() {
	case avro.Boolean:
		if n.kind != 'b' {
			return nil, mismatch(path, "want a boolean, got %s", kindName(n))
		}
		if n.boolean {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case avro.Int, avro.Long:
		v, err := integer(n, path, s.Type())
		if err != nil {
			return nil, err
		}
		return binary.AppendVarint(b, v), nil
	case avro.Float, avro.Double:
		if n.kind != 'n' {
			return nil, mismatch(path, "want a number (%s), got %s", s.Type(), kindName(n))
		}
		f, err := strconv.ParseFloat(string(n.num), 64)
		if err != nil {
			return nil, mismatch(path, "the number %s is out of range for a %s", n.num, s.Type())
		}
		if s.Type() == avro.Float {
			if math.Abs(f) > math.MaxFloat32 {
				return nil, mismatch(path, "the number %s is out of range for a float", n.num)
			}
			return binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(f))), nil
		}
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(f)), nil
	case avro.String:
		if n.kind != 's' {
			return nil, mismatch(path, "want a string, got %s", kindName(n))
		}
		return appendString(b, n.str), nil
	case avro.Bytes:
		raw, err := base64Bytes(n, path)
		if err != nil {
			return nil, err
		}
		b = binary.AppendVarint(b, int64(len(raw)))
		return append(b, raw...), nil
	}
	return nil, mismatch(path, "the schema's type %s is not supported", s.Type())
}

func integer(n *node, path string, t avro.Type) (int64, error) {
	if n.kind != 'n' {
		return 0, mismatch(path, "want an integer (%s), got %s", t, kindName(n))
	}
	v, err := strconv.ParseInt(string(n.num), 10, 64)
	if err != nil {
		// 1.0 or 1e3 is an integer written as a fraction; take it when it is one exactly.
		f, ferr := strconv.ParseFloat(string(n.num), 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) >= 1<<63 {
			return 0, mismatch(path, "want an integer (%s), got %s", t, kindName(n))
		}
		v = int64(f)
	}
	if t == avro.Int && (v < math.MinInt32 || v > math.MaxInt32) {
		return 0, mismatch(path, "the number %s does not fit an int (32 bits); the schema needs a long", n.num)
	}
	return v, nil
}

// encodeLogical writes the logical types that take text; ok false leaves n to the base type.
func encodeLogical(b []byte, s *avro.PrimitiveSchema, l avro.LogicalSchema, n *node, path string) ([]byte, bool, error) {
	if l.Type() == avro.Decimal && s.Type() == avro.Bytes {
		out, err := encodeDecimal(b, l.(*avro.DecimalLogicalSchema), -1, n, path)
		return out, true, err
	}
	if n.kind != 's' {
		return b, false, nil
	}
	var v int64
	switch l.Type() {
	case avro.Date:
		t, err := time.Parse(time.DateOnly, n.str)
		if err != nil {
			return nil, true, mismatch(path, "want a date (2006-01-02) or days since 1970-01-01, got %q", n.str)
		}
		v = t.Unix() / 86400
	case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
		t, err := time.Parse(time.RFC3339Nano, n.str)
		if err != nil && (l.Type() == avro.LocalTimestampMillis || l.Type() == avro.LocalTimestampMicros) {
			t, err = time.Parse("2006-01-02T15:04:05.999999999", n.str)
		}
		if err != nil {
			return nil, true, mismatch(path, "want an RFC 3339 timestamp or a number (%s), got %q", l.Type(), n.str)
		}
		if l.Type() == avro.TimestampMillis || l.Type() == avro.LocalTimestampMillis {
			v = t.UnixMilli()
		} else {
			v = t.UnixMicro()
		}
	case avro.TimeMillis, avro.TimeMicros:
		t, err := time.Parse("15:04:05.999999999", n.str)
		if err != nil {
			return nil, true, mismatch(path, "want a time of day (15:04:05.999) or a number (%s), got %q", l.Type(), n.str)
		}
		d := time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute +
			time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond())
		if l.Type() == avro.TimeMillis {
			v = d.Milliseconds()
		} else {
			v = d.Microseconds()
		}
	default:
		return b, false, nil
	}
	return binary.AppendVarint(b, v), true, nil
}

// encodeDecimal writes a decimal as its unscaled two's-complement big-endian integer, in bytes
// (size < 0) or a fixed of size bytes.
func encodeDecimal(b []byte, d *avro.DecimalLogicalSchema, size int, n *node, path string) ([]byte, error) {
	var text string
	switch n.kind {
	case 'n':
		text = string(n.num)
	case 's':
		text = n.str
	default:
		return nil, mismatch(path, "want a decimal (a number or a numeric string), got %s", kindName(n))
	}
	r, ok := new(big.Rat).SetString(text)
	if !ok {
		return nil, mismatch(path, "want a decimal (a number or a numeric string), got %q", text)
	}
	scaled := new(big.Rat).Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale())), nil)))
	if !scaled.IsInt() {
		return nil, mismatch(path, "%s has more than the schema's %d fractional digits (decimal(%d,%d))", text, d.Scale(), d.Precision(), d.Scale())
	}
	unscaled := scaled.Num()
	if len(unscaled.Abs(unscaled).String()) > d.Precision() {
		return nil, mismatch(path, "%s has more than the schema's %d digits (decimal(%d,%d))", text, d.Precision(), d.Precision(), d.Scale())
	}
	unscaled = scaled.Num() // Abs above changed it in place
	raw := twosComplement(unscaled)
	if size >= 0 {
		if len(raw) > size {
			return nil, mismatch(path, "%s does not fit the %d bytes of its fixed", text, size)
		}
		pad := byte(0)
		if unscaled.Sign() < 0 {
			pad = 0xff
		}
		for i := len(raw); i < size; i++ {
			b = append(b, pad)
		}
		return append(b, raw...), nil
	}
	b = binary.AppendVarint(b, int64(len(raw)))
	return append(b, raw...), nil
}

func twosComplement(v *big.Int) []byte {
	if v.Sign() >= 0 {
		raw := v.Bytes()
		if len(raw) == 0 || raw[0]&0x80 != 0 {
			raw = append([]byte{0}, raw...)
		}
		return raw
	}
	// -v = ^(v-1): the bytes of |v|-1, inverted, with a leading 0xff where the sign bit is not set.
	m := new(big.Int).Sub(new(big.Int).Neg(v), big.NewInt(1)).Bytes()
	for i := range m {
		m[i] = ^m[i]
	}
	if len(m) == 0 || m[0]&0x80 == 0 {
		m = append([]byte{0xff}, m...)
	}
	return m
}

func base64Bytes(n *node, path string) ([]byte, error) {
	if n.kind != 's' {
		return nil, mismatch(path, "want bytes as a base64 string, got %s", kindName(n))
	}
	raw, err := base64.StdEncoding.DecodeString(n.str)
	if err != nil {
		return nil, mismatch(path, "want bytes as a standard base64 string: %v", err)
	}
	return raw, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendVarint(b, int64(len(s)))
	return append(b, s...)
}
