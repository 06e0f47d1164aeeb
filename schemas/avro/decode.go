package avro

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"

	"github.com/hamba/avro/v2"
)

// Decoding writes Avro data back as plain JSON, the inverse of the conversion: records as objects
// (fields in schema order), union values as they are (no {"type": value} wrapper), enums as their
// symbol, bytes and fixed as standard base64, decimals as exact JSON numbers, and the other
// logical types as their underlying number (days, milliseconds, microseconds). A payload the
// relay inferred and encoded decodes to the same document, less its null members and empty arrays.

var errShort = errors.New("the data ends early")

type reader struct {
	b []byte
	i int
}

func (r *reader) varint() (int64, error) {
	v, n := binary.Varint(r.b[r.i:])
	if n <= 0 {
		return 0, errShort
	}
	r.i += n
	return v, nil
}

func (r *reader) bytes(n int64) ([]byte, error) {
	if n < 0 || int64(len(r.b)-r.i) < n {
		return nil, errShort
	}
	out := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	return out, nil
}

// decode appends the JSON of the value of schema s read from r.
func decode(b []byte, s avro.Schema, r *reader) ([]byte, error) {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	switch s := s.(type) {
	case *avro.NullSchema:
		return append(b, "null"...), nil
	case *avro.UnionSchema:
		i, err := r.varint()
		if err != nil {
			return nil, err
		}
		if i < 0 || int(i) >= len(s.Types()) {
			return nil, fmt.Errorf("union branch %d of %d", i, len(s.Types()))
		}
		return decode(b, s.Types()[i], r)
	case *avro.RecordSchema:
		b = append(b, '{')
		var err error
		for i, f := range s.Fields() {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, f.Name())
			b = append(b, ':')
			if b, err = decode(b, f.Type(), r); err != nil {
				return nil, fmt.Errorf("%s: %w", f.Name(), err)
			}
		}
		return append(b, '}'), nil
	case *avro.ArraySchema:
		return decodeBlocks(b, r, '[', ']', func(b []byte) ([]byte, error) { return decode(b, s.Items(), r) })
	case *avro.MapSchema:
		return decodeBlocks(b, r, '{', '}', func(b []byte) ([]byte, error) {
			n, err := r.varint()
			if err != nil {
				return nil, err
			}
			k, err := r.bytes(n)
			if err != nil {
				return nil, err
			}
			b = appendJSONString(b, string(k))
			return decode(append(b, ':'), s.Values(), r)
		})
	case *avro.EnumSchema:
		i, err := r.varint()
		if err != nil {
			return nil, err
		}
		sym, ok := s.Symbol(int(i))
		if !ok {
			return nil, fmt.Errorf("enum symbol %d of %d", i, len(s.Symbols()))
		}
		return appendJSONString(b, sym), nil
	case *avro.FixedSchema:
		raw, err := r.bytes(int64(s.Size()))
		if err != nil {
			return nil, err
		}
		if l, ok := s.Logical().(*avro.DecimalLogicalSchema); ok {
			return appendDecimal(b, raw, l.Scale()), nil
		}
		return appendJSONString(b, base64.StdEncoding.EncodeToString(raw)), nil
	case *avro.PrimitiveSchema:
		return decodePrimitive(b, s, r)
	}
	return nil, fmt.Errorf("the schema's type %s is not supported", s.Type())
}

func decodeBlocks(b []byte, r *reader, open, end byte, item func([]byte) ([]byte, error)) ([]byte, error) {
	b = append(b, open)
	first := true
	for {
		n, err := r.varint()
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return append(b, end), nil
		}
		if n < 0 { // a block with its size in bytes
			n = -n
			if _, err := r.varint(); err != nil {
				return nil, err
			}
		}
		for ; n > 0; n-- {
			if !first {
				b = append(b, ',')
			}
			first = false
			if b, err = item(b); err != nil {
				return nil, err
			}
		}
	}
}

func decodePrimitive(b []byte, s *avro.PrimitiveSchema, r *reader) ([]byte, error) {
	switch s.Type() {
	case avro.Boolean:
		v, err := r.bytes(1)
		if err != nil {
			return nil, err
		}
		return strconv.AppendBool(b, v[0] != 0), nil
	case avro.Int, avro.Long:
		v, err := r.varint()
		if err != nil {
			return nil, err
		}
		return strconv.AppendInt(b, v, 10), nil
	case avro.Float:
		v, err := r.bytes(4)
		if err != nil {
			return nil, err
		}
		return appendFloat(b, float64(math.Float32frombits(binary.LittleEndian.Uint32(v))), 32), nil
	case avro.Double:
		v, err := r.bytes(8)
		if err != nil {
			return nil, err
		}
		return appendFloat(b, math.Float64frombits(binary.LittleEndian.Uint64(v)), 64), nil
	case avro.String, avro.Bytes:
		n, err := r.varint()
		if err != nil {
			return nil, err
		}
		raw, err := r.bytes(n)
		if err != nil {
			return nil, err
		}
		if s.Type() == avro.String {
			return appendJSONString(b, string(raw)), nil
		}
		if l, ok := s.Logical().(*avro.DecimalLogicalSchema); ok {
			return appendDecimal(b, raw, l.Scale()), nil
		}
		return appendJSONString(b, base64.StdEncoding.EncodeToString(raw)), nil
	}
	return nil, fmt.Errorf("the schema's type %s is not supported", s.Type())
}

func appendFloat(b []byte, f float64, bits int) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return appendJSONString(b, strconv.FormatFloat(f, 'g', -1, bits)) // JSON has no such number
	}
	return strconv.AppendFloat(b, f, 'g', -1, bits)
}

// appendDecimal writes an unscaled two's-complement big-endian integer with scale as a number.
func appendDecimal(b []byte, raw []byte, scale int) []byte {
	v := new(big.Int).SetBytes(raw)
	if len(raw) > 0 && raw[0]&0x80 != 0 {
		v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(raw))))
	}
	r := new(big.Rat).SetFrac(v, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil))
	return append(b, r.FloatString(scale)...)
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // never fails for a string
	return append(b, q...)
}
