package protobuf

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
)

// ErrMismatch is wrapped by every error that says a payload does not fit a schema (or cannot be
// given one): the sink sends such an event to the failure policy as schema_mismatch. The error's
// text names the member.
var ErrMismatch = errors.New("payload does not fit the protobuf schema")

// maxCachedSchemas bounds the parsed-schema cache; a subject has few schemas, so reaching it means
// payload shapes that keep changing, and starting over costs one parse per schema.
const maxCachedSchemas = 256

// schemaFile is the name the schema text is compiled under; it appears in compile errors.
const schemaFile = "schema.proto"

// Format is the Protobuf format. The zero value is ready to use; it is safe for concurrent use.
type Format struct {
	// Message is the full name (package.Message) of the message a strict schema's payloads are;
	// empty means the file's first top-level message, the one Infer writes.
	Message string

	mu    sync.Mutex
	files map[string]protoreflect.FileDescriptor // by schema text
}

// New returns a Protobuf format whose strict schemas' payloads are their first message.
func New() *Format { return &Format{} }

// Type is sr.TypeProtobuf.
func (*Format) Type() sr.SchemaType { return sr.TypeProtobuf }

// Encode converts payload (JSON) to a message of s: index is the message's Confluent
// message-index list (the caller frames it after the schema id, with sr.ConfluentHeader), data
// the serialized message. A payload that does not fit returns an error wrapping ErrMismatch.
func (f *Format) Encode(s sr.Schema, payload []byte) (index []int, data []byte, err error) {
	md, err := f.message(s)
	if err != nil {
		return nil, nil, err
	}
	doc, err := parseJSON(payload)
	if err != nil {
		return nil, nil, &FieldError{Problem: "the payload is not JSON: " + err.Error()}
	}
	msg := dynamicpb.NewMessage(md)
	if err := setMessage(msg, doc, ""); err != nil {
		return nil, nil, err
	}
	data, err = proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, nil, fmt.Errorf("serialize protobuf message %s: %w", md.FullName(), err)
	}
	return messageIndex(md), data, nil
}

// Decode reads data as the message of s that index (the message-index list read from the
// framing) names, and gives it as JSON (see the package doc).
func (f *Format) Decode(s sr.Schema, index []int, data []byte) ([]byte, error) {
	fd, err := f.file(s)
	if err != nil {
		return nil, err
	}
	md, err := messageAt(fd, index)
	if err != nil {
		return nil, err
	}
	msg := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(data, msg); err != nil {
		return nil, fmt.Errorf("parse protobuf message %s: %w", md.FullName(), err)
	}
	return appendMessage(nil, msg)
}

// message returns the message a payload of s is encoded as.
func (f *Format) message(s sr.Schema) (protoreflect.MessageDescriptor, error) {
	fd, err := f.file(s)
	if err != nil {
		return nil, err
	}
	if f.Message == "" {
		if fd.Messages().Len() == 0 {
			return nil, errors.New("protobuf schema declares no message")
		}
		return fd.Messages().Get(0), nil
	}
	d := findMessage(fd.Messages(), protoreflect.FullName(f.Message))
	if d == nil {
		return nil, fmt.Errorf("protobuf schema declares no message %s: set the message name to one the subject's schema declares", f.Message)
	}
	return d, nil
}

func findMessage(ms protoreflect.MessageDescriptors, name protoreflect.FullName) protoreflect.MessageDescriptor {
	for i := 0; i < ms.Len(); i++ {
		m := ms.Get(i)
		if m.FullName() == name {
			return m
		}
		if d := findMessage(m.Messages(), name); d != nil {
			return d
		}
	}
	return nil
}

// messageIndex is the Confluent message-index list of md: its index among the file's top-level
// messages, then among its parent's nested messages, and so on.
func messageIndex(md protoreflect.MessageDescriptor) []int {
	var idx []int
	for d := protoreflect.Descriptor(md); ; d = d.Parent() {
		m, ok := d.(protoreflect.MessageDescriptor)
		if !ok {
			break
		}
		idx = append([]int{m.Index()}, idx...)
	}
	return idx
}

func messageAt(fd protoreflect.FileDescriptor, index []int) (protoreflect.MessageDescriptor, error) {
	ms := fd.Messages()
	var md protoreflect.MessageDescriptor
	for _, i := range index {
		if i < 0 || i >= ms.Len() {
			return nil, fmt.Errorf("protobuf message-index list %v names no message of the schema", index)
		}
		md = ms.Get(i)
		ms = md.Messages()
	}
	if md == nil {
		return nil, errors.New("protobuf message-index list is empty")
	}
	return md, nil
}

// file returns s parsed, from the cache when it was parsed before.
func (f *Format) file(s sr.Schema) (protoreflect.FileDescriptor, error) {
	if s.Type != sr.TypeProtobuf {
		return nil, fmt.Errorf("schema is of type %s, not PROTOBUF", s.Type)
	}
	f.mu.Lock()
	fd, ok := f.files[s.Schema]
	f.mu.Unlock()
	if ok {
		return fd, nil
	}
	for _, r := range s.References {
		if _, err := protoregistry.GlobalFiles.FindFileByPath(r.Name); err != nil {
			return nil, fmt.Errorf("protobuf schema references %s (subject %s), and only the well-known google/protobuf imports are resolved: inline the referenced types", r.Name, r.Subject)
		}
	}
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{schemaFile: s.Schema}),
		}),
	}
	// Compiling is CPU only (the resolver reads nothing but memory): no wait to bound.
	files, err := c.Compile(context.Background(), schemaFile)
	if err != nil {
		return nil, fmt.Errorf("protobuf schema does not compile: %w", err)
	}
	fd = files[0]
	f.mu.Lock()
	if f.files == nil || len(f.files) >= maxCachedSchemas {
		f.files = map[string]protoreflect.FileDescriptor{}
	}
	f.files[s.Schema] = fd
	f.mu.Unlock()
	return fd, nil
}
