package protobuf

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// appendMessage writes m as a JSON object (see the package doc's Decode).
func appendMessage(b []byte, m protoreflect.Message) ([]byte, error) {
	if strings.HasPrefix(string(m.Descriptor().FullName()), "google.protobuf.") {
		// A well-known type has a JSON form of its own (a Timestamp is a string, a Struct any
		// object): protojson writes it.
		out, err := protojson.Marshal(m.Interface())
		if err != nil {
			return nil, fmt.Errorf("write %s as JSON: %w", m.Descriptor().FullName(), err)
		}
		return append(b, out...), nil
	}
	fields := m.Descriptor().Fields()
	var set []protoreflect.FieldDescriptor
	for i := 0; i < fields.Len(); i++ {
		if fd := fields.Get(i); m.Has(fd) {
			set = append(set, fd)
		}
	}
	sort.Slice(set, func(i, j int) bool { return set[i].Number() < set[j].Number() })
	b = append(b, '{')
	for i, fd := range set {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, fd.JSONName())
		b = append(b, ':')
		var err error
		if b, err = appendField(b, fd, m.Get(fd)); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func appendField(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) ([]byte, error) {
	var err error
	switch {
	case fd.IsList():
		l := v.List()
		b = append(b, '[')
		for i := 0; i < l.Len(); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendSingular(b, fd, l.Get(i)); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case fd.IsMap():
		mp := v.Map()
		type entry struct {
			k string
			v protoreflect.Value
		}
		entries := make([]entry, 0, mp.Len())
		mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			entries = append(entries, entry{k.String(), v})
			return true
		})
		sort.Slice(entries, func(i, j int) bool { return entries[i].k < entries[j].k })
		b = append(b, '{')
		for i, e := range entries {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, e.k)
			b = append(b, ':')
			if b, err = appendSingular(b, fd.MapValue(), e.v); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return appendSingular(b, fd, v)
}

func appendSingular(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) ([]byte, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return strconv.AppendBool(b, v.Bool()), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return strconv.AppendInt(b, v.Int(), 10), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return strconv.AppendUint(b, v.Uint(), 10), nil
	case protoreflect.FloatKind:
		return appendFloat(b, v.Float(), 32), nil
	case protoreflect.DoubleKind:
		return appendFloat(b, v.Float(), 64), nil
	case protoreflect.StringKind:
		return appendString(b, v.String()), nil
	case protoreflect.BytesKind:
		return appendString(b, base64.StdEncoding.EncodeToString(v.Bytes())), nil
	case protoreflect.EnumKind:
		if fd.Enum().FullName() == "google.protobuf.NullValue" {
			return append(b, "null"...), nil
		}
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return appendString(b, string(ev.Name())), nil
		}
		return strconv.AppendInt(b, int64(v.Enum()), 10), nil
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return appendMessage(b, v.Message())
	}
	return nil, fmt.Errorf("protobuf field %s has kind %s, which has no JSON form here", fd.FullName(), fd.Kind())
}

// appendFloat writes a float as encoding/json does; NaN and the infinities, which JSON has no
// number for, as the strings protojson writes.
func appendFloat(b []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(b, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(b, `"-Infinity"`...)
	}
	out, _ := json.Marshal(f) // a finite float always marshals
	if bits == 32 {
		out, _ = json.Marshal(float32(f))
	}
	return append(b, out...)
}

func appendString(b []byte, s string) []byte {
	out, _ := json.Marshal(s) // a string always marshals (invalid UTF-8 becomes U+FFFD)
	return append(b, out...)
}
