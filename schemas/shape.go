package schemas

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/schemas/avro"
)

// The inferred Avro value, cached by the payload's shape. Inferring a schema, widening it,
// printing it and looking its id up by its text cost most of a record's time, and a stream's
// payloads come in a few shapes: a payload is parsed once, and one of a shape already seen with
// the subject's current schema is written with what that shape got, without inferring anything.
//
// It is exactly what inferring gives, because everything inferring decides is a function of
// what the cache is keyed by:
//   - the inferred schema is a function of the record's name and namespace and the payload's
//     shape (avro.Doc.AppendShape), both in the key;
//   - the registered schema is the inferred one widened from the subject's schema registered
//     last (the base): the set of a subject holds entries of one base, and serves only while
//     the subject's base is still that one; a hit leaves the subject's base as the miss did;
//   - the id is the ids cache's: an entry is made only while the ids cache holds its id, and
//     clearing the ids cache clears this one, so a shape asks the registry exactly when a miss
//     would have;
//   - the payload is written with the schema's Encoder over the same parsed document as a miss,
//     so its bytes, or its error, are the same.
//
// The first payload of a subject widens from the registry's latest schema (not the base this
// Serializer knows) and is not cached: the next payload of its shape is.

// shapeSet is what payloads of one subject got from one base.
type shapeSet struct {
	base string            // the base schema's text
	m    map[string]shaped // name, namespace and shape -> what payloads of it got
}

type shaped struct {
	schema sr.Schema // registered: inferred, widened from the base
	id     int
	enc    *avro.Encoder
}

// maxShapes bounds a subject's shapes (payloads whose members are data, not fields, have a shape
// each); past it the set starts again.
const maxShapes = 1024

// inferredAvro is value for an inferred Avro schema (Options.AutoRegister).
func (s *Serializer) inferredAvro(ctx context.Context, f *avro.Format, subject, name, namespace string, payload []byte) ([]byte, error) {
	doc, err := f.Parse(payload)
	if err != nil {
		return nil, &Error{Reason: ReasonMismatch, Subject: subject, Field: fieldOf(err), Err: fmt.Errorf("no schema can be inferred from the payload: %w", err)}
	}
	defer f.Release(doc)
	var buf [512]byte
	key := append(buf[:0], name...)
	key = append(key, 0)
	key = append(key, namespace...)
	key = append(key, 0)
	key = doc.AppendShape(key)

	s.mu.Lock()
	base, known := s.inferred[subject]
	var e shaped
	hit := false
	if set := s.shapes[subject]; known && set != nil && set.base == base.Schema {
		if e, hit = set.m[string(key)]; hit {
			s.inferred[subject] = e.schema
		}
	}
	s.mu.Unlock()
	if !hit {
		if e, err = s.inferAvro(ctx, f, subject, name, namespace, doc, base, known, key); err != nil {
			return nil, err
		}
	}
	out, _ := new(sr.ConfluentHeader).AppendEncode(make([]byte, 0, 16+len(payload)), e.id, nil) // never fails
	if out, err = e.enc.Append(out, doc); err != nil {
		return nil, &Error{Reason: ReasonMismatch, Subject: subject, Field: fieldOf(err), Err: fmt.Errorf("the payload does not fit the schema (id %d): %w", e.id, err)}
	}
	return out, nil
}

// inferAvro infers doc's schema, widens it from base (the subject's schema registered last, when
// known), registers it, and caches what the payload's shape (key) got.
func (s *Serializer) inferAvro(ctx context.Context, f *avro.Format, subject, name, namespace string, doc *avro.Doc, base sr.Schema, known bool, key []byte) (shaped, error) {
	schema, err := f.InferDoc(name, namespace, doc)
	if err != nil {
		return shaped{}, &Error{Reason: ReasonMismatch, Subject: subject, Field: fieldOf(err), Err: fmt.Errorf("no schema can be inferred from the payload: %w", err)}
	}
	if schema, err = s.widenFrom(ctx, subject, base, known, schema); err != nil {
		return shaped{}, err
	}
	id, err := s.register(ctx, subject, schema)
	if err != nil {
		return shaped{}, err
	}
	s.mu.Lock()
	s.inferred[subject] = schema
	s.mu.Unlock()
	enc, err := f.Encoder(schema)
	if err != nil {
		return shaped{}, &Error{Reason: ReasonMismatch, Subject: subject, Field: fieldOf(err), Err: fmt.Errorf("the payload does not fit the schema (id %d): %w", id, err)}
	}
	e := shaped{schema: schema, id: id, enc: enc}
	if !known {
		return e, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cached, ok := s.ids[idKey{subject, schema.Schema}]; !ok || cached != id {
		return e, nil // the ids cache started again since: the next payload asks as a miss would
	}
	set := s.shapes[subject]
	if set == nil || set.base != base.Schema || len(set.m) >= maxShapes {
		set = &shapeSet{base: base.Schema, m: make(map[string]shaped)}
		s.shapes[subject] = set
	}
	set.m[string(key)] = e
	return e, nil
}
