package protobuf

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// FieldError says which member of the payload does not fit the message and why. It wraps
// ErrMismatch.
type FieldError struct {
	Path    string // e.g. "lines[2].qty"; "" for the payload itself
	Problem string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return "payload: " + e.Problem
	}
	return fmt.Sprintf("field %s: %s", e.Path, e.Problem)
}

// FieldPath returns the path of the member that does not fit.
func (e *FieldError) FieldPath() string { return e.Path }

func (e *FieldError) Unwrap() error { return ErrMismatch }

func fieldErr(path, format string, args ...any) error {
	return &FieldError{Path: path, Problem: fmt.Sprintf(format, args...)}
}

// setMessage fills m from a JSON object with the proto3 JSON mapping (see the package doc's
// Encode); path names obj in errors.
func setMessage(m protoreflect.Message, v any, path string) error {
	md := m.Descriptor()
	if isWellKnown(md) {
		return setWellKnown(m, v, path)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return fieldErr(path, "want an object (message %s), got %s", md.FullName(), kindName(v))
	}
	fields := md.Fields()
	for k, val := range obj {
		fp := memberPath(path, k)
		fd := fields.ByJSONName(k)
		if fd == nil {
			fd = fields.ByTextName(k)
		}
		if fd == nil {
			if isUntyped(val) {
				continue // a null or [] member an inferred schema leaves out
			}
			return fieldErr(fp, "message %s has no field for it: add the field to the schema, or leave the member out", md.FullName())
		}
		if val == nil && !isNullValue(fd) {
			continue // null is the field unset, as in the proto3 JSON mapping
		}
		if err := setField(m, fd, val, fp); err != nil {
			return err
		}
	}
	return nil
}

func setField(m protoreflect.Message, fd protoreflect.FieldDescriptor, v any, path string) error {
	switch {
	case fd.IsList():
		arr, ok := v.([]any)
		if !ok {
			return fieldErr(path, "want an array (repeated %s), got %s", fd.Kind(), kindName(v))
		}
		l := m.Mutable(fd).List()
		for i, el := range arr {
			ep := path + "[" + strconv.Itoa(i) + "]"
			if el == nil {
				return fieldErr(ep, "null in a repeated field, which cannot hold one")
			}
			if fd.Message() != nil {
				el2 := l.NewElement()
				if err := setMessage(el2.Message(), el, ep); err != nil {
					return err
				}
				l.Append(el2)
				continue
			}
			pv, err := scalar(fd, el, ep)
			if err != nil {
				return err
			}
			l.Append(pv)
		}
		return nil
	case fd.IsMap():
		obj, ok := v.(map[string]any)
		if !ok {
			return fieldErr(path, "want an object (a map), got %s", kindName(v))
		}
		mp := m.Mutable(fd).Map()
		for k, el := range obj {
			ep := memberPath(path, k)
			key, err := mapKey(fd.MapKey(), k, ep)
			if err != nil {
				return err
			}
			if vd := fd.MapValue(); vd.Message() != nil {
				el2 := mp.NewValue()
				if err := setMessage(el2.Message(), el, ep); err != nil {
					return err
				}
				mp.Set(key, el2)
				continue
			}
			pv, err := scalar(fd.MapValue(), el, ep)
			if err != nil {
				return err
			}
			mp.Set(key, pv)
		}
		return nil
	case fd.Message() != nil:
		return setMessage(m.Mutable(fd).Message(), v, path)
	}
	pv, err := scalar(fd, v, path)
	if err != nil {
		return err
	}
	m.Set(fd, pv)
	return nil
}

// scalar converts a JSON value to a non-message field's value.
func scalar(fd protoreflect.FieldDescriptor, v any, path string) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		if b, ok := v.(bool); ok {
			return protoreflect.ValueOfBool(b), nil
		}
	case protoreflect.StringKind:
		if s, ok := v.(string); ok {
			return protoreflect.ValueOfString(s), nil
		}
	case protoreflect.BytesKind:
		if s, ok := v.(string); ok {
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
				if b, err := enc.DecodeString(s); err == nil {
					return protoreflect.ValueOfBytes(b), nil
				}
			}
			return protoreflect.Value{}, fieldErr(path, "want base64 (bytes), got a string that is not")
		}
	case protoreflect.EnumKind:
		if isNullValue(fd) {
			return protoreflect.ValueOfEnum(0), nil
		}
		switch x := v.(type) {
		case string:
			if ev := fd.Enum().Values().ByName(protoreflect.Name(x)); ev != nil {
				return protoreflect.ValueOfEnum(ev.Number()), nil
			}
			return protoreflect.Value{}, fieldErr(path, "%q is not a value of enum %s", x, fd.Enum().FullName())
		case json.Number:
			n, err := integer(x, 32, true)
			if err != nil {
				return protoreflect.Value{}, fieldErr(path, "want a value of enum %s, got %s", fd.Enum().FullName(), x)
			}
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n)), nil
		}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return number(v, path, fd.Kind(), func(s json.Number) (protoreflect.Value, error) {
			n, err := integer(s, 32, true)
			return protoreflect.ValueOfInt32(int32(n)), err
		})
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return number(v, path, fd.Kind(), func(s json.Number) (protoreflect.Value, error) {
			n, err := integer(s, 64, true)
			return protoreflect.ValueOfInt64(n), err
		})
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return number(v, path, fd.Kind(), func(s json.Number) (protoreflect.Value, error) {
			n, err := integer(s, 32, false)
			return protoreflect.ValueOfUint32(uint32(n)), err
		})
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return number(v, path, fd.Kind(), func(s json.Number) (protoreflect.Value, error) {
			n, err := unsigned(s)
			return protoreflect.ValueOfUint64(n), err
		})
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return number(v, path, fd.Kind(), func(s json.Number) (protoreflect.Value, error) {
			f, err := float(string(s), fd.Kind() == protoreflect.FloatKind)
			if fd.Kind() == protoreflect.FloatKind {
				return protoreflect.ValueOfFloat32(float32(f)), err
			}
			return protoreflect.ValueOfFloat64(f), err
		})
	}
	return protoreflect.Value{}, fieldErr(path, "want %s, got %s", kindWord(fd.Kind()), kindName(v))
}

// number reads a JSON number, or a string holding one (the proto3 JSON mapping allows both).
func number(v any, path string, k protoreflect.Kind, conv func(json.Number) (protoreflect.Value, error)) (protoreflect.Value, error) {
	var s json.Number
	switch x := v.(type) {
	case json.Number:
		s = x
	case string:
		s = json.Number(strings.TrimSpace(x))
	default:
		return protoreflect.Value{}, fieldErr(path, "want %s, got %s", kindWord(k), kindName(v))
	}
	pv, err := conv(s)
	if err != nil {
		return protoreflect.Value{}, fieldErr(path, "want %s, got %q (%v)", kindWord(k), string(s), err)
	}
	return pv, nil
}

// integer parses an integer in JSON's forms: 12, or an exponent or fraction that leaves one (1e3,
// 2.0).
func integer(s json.Number, bits int, signed bool) (int64, error) {
	if n, err := strconv.ParseInt(string(s), 10, bits); err == nil {
		if !signed && n < 0 {
			return 0, fmt.Errorf("negative")
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(string(s), 64)
	if err != nil || f != math.Trunc(f) {
		return 0, fmt.Errorf("not an integer")
	}
	lim := math.Ldexp(1, bits-1)
	if signed && (f < -lim || f >= lim) || !signed && (f < 0 || f >= 2*lim) {
		return 0, fmt.Errorf("out of range")
	}
	return int64(f), nil
}

func unsigned(s json.Number) (uint64, error) {
	if n, err := strconv.ParseUint(string(s), 10, 64); err == nil {
		return n, nil
	}
	f, err := strconv.ParseFloat(string(s), 64)
	if err != nil || f != math.Trunc(f) || f < 0 || f >= math.Ldexp(1, 64) {
		return 0, fmt.Errorf("not an unsigned 64-bit integer")
	}
	return uint64(f), nil
}

func float(s string, single bool) (float64, error) {
	switch s {
	case "NaN":
		return math.NaN(), nil
	case "Infinity":
		return math.Inf(1), nil
	case "-Infinity":
		return math.Inf(-1), nil
	}
	bits := 64
	if single {
		bits = 32
	}
	f, err := strconv.ParseFloat(s, bits)
	if err != nil {
		return 0, fmt.Errorf("not a number in range")
	}
	return f, nil
}

func mapKey(fd protoreflect.FieldDescriptor, k, path string) (protoreflect.MapKey, error) {
	if fd.Kind() == protoreflect.StringKind {
		return protoreflect.ValueOfString(k).MapKey(), nil
	}
	if fd.Kind() == protoreflect.BoolKind {
		switch k {
		case "true":
			return protoreflect.ValueOfBool(true).MapKey(), nil
		case "false":
			return protoreflect.ValueOfBool(false).MapKey(), nil
		}
		return protoreflect.MapKey{}, fieldErr(path, "map key %q is not true or false", k)
	}
	pv, err := scalar(fd, k, path)
	if err != nil {
		return protoreflect.MapKey{}, err
	}
	return pv.MapKey(), nil
}

func isWellKnown(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

func isNullValue(fd protoreflect.FieldDescriptor) bool {
	return fd.Enum() != nil && fd.Enum().FullName() == "google.protobuf.NullValue"
}

// setWellKnown fills a well-known type (Timestamp, Duration, Struct, wrappers, ...) from its JSON
// form, which protojson knows.
func setWellKnown(m protoreflect.Message, v any, path string) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fieldErr(path, "%v", err)
	}
	if err := protojson.Unmarshal(b, m.Interface()); err != nil {
		msg := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(err.Error(), "proto:"), "\u00a0"), " ")
		return fieldErr(path, "not a %s: %s", m.Descriptor().FullName(), msg)
	}
	return nil
}

func memberPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func kindWord(k protoreflect.Kind) string {
	switch k {
	case protoreflect.BoolKind:
		return "a boolean"
	case protoreflect.StringKind:
		return "a string"
	case protoreflect.BytesKind:
		return "a base64 string (bytes)"
	case protoreflect.EnumKind:
		return "an enum name or number"
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return "a number (" + k.String() + ")"
	}
	return "an integer (" + k.String() + ")"
}
