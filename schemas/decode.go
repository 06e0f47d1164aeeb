package schemas

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"
)

// Deserializer reads framed bytes back as JSON, knowing only the registry: the id in the frame
// names the schema, the schema's type the format. Consumers (inbox/) and tests use it. It is safe
// for concurrent use.
type Deserializer struct {
	reg     Registry
	formats map[sr.SchemaType]Format

	mu   sync.Mutex
	byID map[int]sr.Schema // schemas never change under an id
}

// ErrNotFramed says the bytes do not start with the Confluent wire format's magic byte 0 and an id.
var ErrNotFramed = errors.New("not in the Confluent wire format (magic byte 0, 4-byte schema id)")

// NewDeserializer returns a Deserializer that reads the given formats.
func NewDeserializer(reg Registry, formats ...Format) *Deserializer {
	d := &Deserializer{reg: reg, formats: make(map[sr.SchemaType]Format), byID: make(map[int]sr.Schema)}
	for _, f := range formats {
		d.formats[f.Type()] = f
	}
	return d
}

// Decode returns framed data as JSON and the id of its schema.
func (d *Deserializer) Decode(ctx context.Context, framed []byte) (doc []byte, id int, err error) {
	var h sr.ConfluentHeader
	id, rest, err := h.DecodeID(framed)
	if err != nil {
		return nil, 0, ErrNotFramed
	}
	d.mu.Lock()
	s, ok := d.byID[id]
	d.mu.Unlock()
	if !ok {
		if s, err = d.reg.SchemaByID(ctx, id); err != nil {
			return nil, id, fmt.Errorf("schema id %d: %w", id, err)
		}
		if s.Schema == "" {
			// Not kept: a registry (or a proxy) that answered 200 without the text answers
			// properly later, and an id's schema never changes.
			return nil, id, fmt.Errorf("schema id %d: the registry answered without the schema's text", id)
		}
		d.mu.Lock()
		d.byID[id] = s
		d.mu.Unlock()
	}
	f, ok := d.formats[s.Type]
	if !ok {
		return nil, id, fmt.Errorf("schema id %d is a %s schema, which this reader does not decode", id, s.Type)
	}
	var index []int
	if s.Type == sr.TypeProtobuf {
		if index, rest, err = h.DecodeIndex(rest, 0); err != nil {
			return nil, id, fmt.Errorf("schema id %d: the message index: %w", id, err)
		}
	}
	doc, err = f.Decode(s, index, rest)
	if err != nil {
		return nil, id, fmt.Errorf("schema id %d: %w", id, err)
	}
	return doc, id, nil
}

// ClientRegistry is a Registry over a franz-go sr.Client, with no cache of its own (the
// Serializer and Deserializer cache what the hot path needs).
type ClientRegistry struct{ *sr.Client }

// Register registers s under subject and returns its id.
func (c ClientRegistry) Register(ctx context.Context, subject string, s sr.Schema) (int, error) {
	ss, err := c.CreateSchema(ctx, subject, s)
	return ss.ID, err
}

// Latest returns the subject's latest version.
func (c ClientRegistry) Latest(ctx context.Context, subject string) (sr.SubjectSchema, error) {
	return c.SchemaByVersion(ctx, subject, -1)
}

// Version returns a version of the subject.
func (c ClientRegistry) Version(ctx context.Context, subject string, version int) (sr.SubjectSchema, error) {
	return c.SchemaByVersion(ctx, subject, version)
}
