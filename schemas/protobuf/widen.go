package protobuf

import (
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Widen merges the schema inferred from an event into the subject's latest inferred schema, so
// that a subject's schema only grows (the schemas.Widener the Serializer uses with
// auto_register): the fields of both, nested messages merged the same way. Field numbers come
// from the members' names, so a field keeps its number in every merge. A field whose type
// conflicts (int64 in one, string in the other) takes the inferred schema's, so the registry's
// compatibility rule judges the change. ok is false when latest is not a schema Infer writes (a
// schema written by hand), or when the merge would give two fields one number or one name: the
// caller registers inferred as it is.
func (f *Format) Widen(latest, inferred sr.Schema) (sr.Schema, bool) {
	if latest.Type != sr.TypeProtobuf || inferred.Type != sr.TypeProtobuf {
		return sr.Schema{}, false
	}
	lf, err := f.file(latest)
	if err != nil || lf.Messages().Len() != 1 {
		return sr.Schema{}, false
	}
	inf, err := f.file(inferred)
	if err != nil || inf.Messages().Len() != 1 || lf.Package() != inf.Package() {
		return sr.Schema{}, false
	}
	l, err := modelOf(lf.Messages().Get(0))
	if err != nil {
		return sr.Schema{}, false
	}
	in, err := modelOf(inf.Messages().Get(0))
	if err != nil {
		return sr.Schema{}, false
	}
	merged, err := mergeModels(l, in)
	if err != nil {
		return sr.Schema{}, false
	}
	var b strings.Builder
	b.WriteString("syntax = \"proto3\";\n")
	if pkg := inf.Package(); pkg != "" {
		fmt.Fprintf(&b, "package %s;\n", pkg)
	}
	b.WriteString("\n")
	merged.write(&b, "")
	return sr.Schema{Schema: b.String(), Type: sr.TypeProtobuf}, true
}

// modelOf reads a message Infer wrote back to its model; an error for anything Infer does not
// write (enums, maps, oneofs, fields without json_name, other scalar types, messages from
// elsewhere).
func modelOf(md protoreflect.MessageDescriptor) (*message, error) {
	m := &message{name: string(md.Name())}
	if md.Enums().Len() > 0 || md.Oneofs().Len() != md.Fields().Len()-countNonOptional(md) {
		return nil, fmt.Errorf("message %s is not an inferred one", md.FullName())
	}
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		if !fd.HasJSONName() || fd.IsMap() {
			return nil, fmt.Errorf("field %s is not an inferred one", fd.FullName())
		}
		pf := &protoField{key: fd.JSONName(), name: string(fd.Name()), number: int(fd.Number()), repeated: fd.IsList()}
		switch fd.Kind() {
		case protoreflect.StringKind, protoreflect.BoolKind, protoreflect.Int64Kind, protoreflect.DoubleKind:
			if !fd.IsList() && !fd.HasOptionalKeyword() {
				return nil, fmt.Errorf("field %s is not an inferred one", fd.FullName())
			}
			pf.typ = fd.Kind().String()
		case protoreflect.MessageKind:
			if fd.Message().Parent() != md {
				return nil, fmt.Errorf("field %s is of a message from elsewhere", fd.FullName())
			}
			nested, err := modelOf(fd.Message())
			if err != nil {
				return nil, err
			}
			pf.msg, pf.typ = nested, nested.name
		default:
			return nil, fmt.Errorf("field %s is of kind %s", fd.FullName(), fd.Kind())
		}
		m.fields = append(m.fields, pf)
	}
	if md.Messages().Len() != countMessageFields(m) {
		return nil, fmt.Errorf("message %s declares messages no field uses", md.FullName())
	}
	return m, nil
}

// countNonOptional counts the fields that are not proto3 optional (each optional one has a
// synthetic oneof of its own).
func countNonOptional(md protoreflect.MessageDescriptor) int {
	n := 0
	for i := 0; i < md.Fields().Len(); i++ {
		if !md.Fields().Get(i).HasOptionalKeyword() {
			n++
		}
	}
	return n
}

func countMessageFields(m *message) int {
	n := 0
	for _, fd := range m.fields {
		if fd.msg != nil {
			n++
		}
	}
	return n
}

// mergeModels returns the union of a (the subject's) and b (the event's), as Widen says.
func mergeModels(a, b *message) (*message, error) {
	byKey := map[string]*protoField{}
	for _, fd := range a.fields {
		byKey[fd.key] = fd
	}
	for _, fd := range b.fields {
		prev, ok := byKey[fd.key]
		switch {
		case !ok:
			byKey[fd.key] = fd
		case prev.repeated != fd.repeated || (prev.msg == nil) != (fd.msg == nil) || prev.msg == nil && prev.typ != fd.typ:
			byKey[fd.key] = fd // a conflict: the event's, for the registry to judge
		case prev.msg != nil:
			nested, err := mergeModels(prev.msg, fd.msg)
			if err != nil {
				return nil, err
			}
			byKey[fd.key] = &protoField{key: prev.key, name: prev.name, number: prev.number, repeated: prev.repeated, msg: nested, typ: nested.name}
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := &message{name: a.name}
	names, numbers := map[string]bool{out.name: true}, map[int]bool{}
	for _, k := range keys {
		fd := byKey[k]
		if names[fd.name] || numbers[fd.number] {
			return nil, fmt.Errorf("two fields named %s or numbered %d", fd.name, fd.number)
		}
		names[fd.name], numbers[fd.number] = true, true
		out.fields = append(out.fields, fd)
	}
	for _, fd := range out.fields {
		if fd.msg == nil {
			continue
		}
		if names[fd.msg.name] {
			return nil, fmt.Errorf("a message and a field named %s", fd.msg.name)
		}
		names[fd.msg.name] = true
		out.nested = append(out.nested, fd.msg)
	}
	return out, nil
}
