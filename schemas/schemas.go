// Package schemas turns an outbox event's payload and key into registry-framed bytes, and back:
// the Confluent wire format (magic byte 0, the schema id as 4 big-endian bytes, for Protobuf the
// message-index list, then the encoded data) with the schema from a schema registry.
//
// A Serializer picks the subject (the naming strategy: topic, record or topic-record), gets the
// schema and its id, encodes and frames. Schemas come in one of three ways:
//
//   - infer and register (Options.AutoRegister): the schema is inferred from each JSON payload by
//     the value format (schemas/avro says precisely how a payload maps to an Avro record), merged
//     into the subject's latest where the format can (Widener: the subject's schema only grows, so
//     an event that leaves a member out or holds a smaller number reuses it), and registered under
//     the subject. Two events of one subject whose schemas cannot merge are two versions of it:
//     the registry accepts the second if the subject's compatibility rule allows it, and refuses
//     it otherwise (409), which fails the event with ReasonIncompatible.
//   - strict (AutoRegister false): the subject's latest version (refreshed every LatestRefresh, and
//     read again from the registry, past every cache, for a payload that does not fit it: the
//     payload may be of a version registered since) or a pinned Version; the payload is converted
//     to it, and a payload that does not fit fails with ReasonMismatch naming the field.
//   - frame only (FrameOnly): the payload already holds data serialized by the application in the
//     subject's schema (a bytea payload, or base64 text); it is framed with the id of the subject's
//     latest or pinned version, without being decoded or re-encoded.
//
// The hot path makes no registry round trip: ids are cached per subject and schema text, and a
// strict subject's schema for LatestRefresh (a failed refresh keeps the cached version: an outage
// does not hold a stream that has what it needs). An inferred Avro value is cached by its
// payload's shape (shape.go): a payload of a shape its subject has seen is parsed once and
// written, with nothing inferred, printed or looked up, into the bytes inferring would give.
//
// Errors: a *Error (Permanent) is the event's fault and goes to the sink's failure policy with
// its Reason; any other error (the registry down, answering 5xx, refusing the credentials, a
// subject not registered yet) is the registry's and is retried while the stream holds. Nothing is
// ever sent unframed.
//
// A nil value (a tombstone) stays nil; a nil key (no aggregate id) stays nil.
package schemas

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/schemas/avro"
)

// Registry is what the Serializer needs of a schema registry; *schemaregistry.Client satisfies
// it, and so does ClientRegistry over a bare sr.Client.
type Registry interface {
	// Register registers s under subject (or finds it there) and returns its id.
	Register(ctx context.Context, subject string, s sr.Schema) (id int, err error)
	// Latest returns the subject's latest version.
	Latest(ctx context.Context, subject string) (sr.SubjectSchema, error)
	// Version returns the subject's version.
	Version(ctx context.Context, subject string, version int) (sr.SubjectSchema, error)
	// SchemaByID returns the schema of an id.
	SchemaByID(ctx context.Context, id int) (sr.Schema, error)
}

// Format is one encoding: Avro (schemas/avro), Protobuf, JSON Schema. Its methods may be called
// concurrently and do no I/O.
type Format interface {
	Type() sr.SchemaType
	// Infer returns the schema of a JSON payload; name and namespace name its record (message).
	Infer(name, namespace string, payload []byte) (sr.Schema, error)
	// Encode writes the JSON payload in s; index is the Protobuf message index (nil otherwise).
	// A payload that does not fit s returns an error naming the field.
	Encode(s sr.Schema, payload []byte) (index []int, data []byte, err error)
	// Decode writes data of s (the message at index) as JSON.
	Decode(s sr.Schema, index []int, data []byte) ([]byte, error)
}

// Widener is a Format whose inferred schemas merge (avro.Format.Widen): with it, a subject's
// inferred schema only grows, so an event that leaves a member out, or holds a smaller number,
// reuses the registered schema instead of registering a narrower one.
type Widener interface {
	Widen(latest, inferred sr.Schema) (sr.Schema, bool)
}

// Strategy names subjects (Confluent's subject name strategies).
type Strategy string

const (
	// StrategyTopic: "<topic>-value" and "<topic>-key" (TopicNameStrategy, the default).
	StrategyTopic Strategy = "topic"
	// StrategyRecord: the record's full name (RecordNameStrategy); the key's is "string".
	StrategyRecord Strategy = "record"
	// StrategyTopicRecord: "<topic>-<record full name>" (TopicRecordNameStrategy).
	StrategyTopicRecord Strategy = "topic-record"
)

// FrameOnly says how a payload already serialized by the application is read.
type FrameOnly string

const (
	// FrameBytes: the payload's bytes are the data (a bytea payload column).
	FrameBytes FrameOnly = "bytes"
	// FrameBase64: the payload is the data in standard base64 (text, or a JSON string of it).
	FrameBase64 FrameOnly = "base64"
)

// DefaultRecordName names the value's record under the topic strategy, as Debezium's outbox
// router names the expanded payload's schema after the payload column.
const DefaultRecordName = "payload"

// Options configures a Serializer. Zero values get the defaults noted.
type Options struct {
	Value    Format // nil leaves the value as it is
	AvroKey  bool   // the aggregate id as an Avro string (KeySchema), as Connect's Avro converter writes a string key
	Strategy Strategy

	// RecordName names the value's record (the Avro record, the Protobuf message); default the
	// event type (made a valid name) under the record and topic-record strategies, so each
	// event type is its own subject, and DefaultRecordName under the topic strategy.
	RecordName      string
	RecordNamespace string

	// AutoRegister infers each payload's schema and registers it; without it the subject's
	// schema is the registry's (strict): Version, or the latest when Version <= 0.
	AutoRegister bool
	Version      int
	// LatestRefresh is how long a strict subject's latest version is used before it is looked
	// up again; default 1 minute.
	LatestRefresh time.Duration

	// FrameOnly frames the payload as it is (bytes) or base64-decoded with the id of the
	// subject's latest (or Version) schema; FrameSubject, when set, is that subject, else the
	// strategy's (with the record strategy, RecordName must be set). FrameIndex is the Protobuf
	// message index written in the frame (default the first message).
	FrameOnly    FrameOnly
	FrameSubject string
	FrameIndex   []int
}

// Reasons a payload cannot be serialized; the sink's failure reasons.
const (
	// ReasonIncompatible: the schema inferred from the payload is not compatible with the
	// subject's versions under its compatibility rule (the registry answered 409).
	ReasonIncompatible = "schema_incompatible"
	// ReasonMismatch: the payload does not fit the subject's schema (strict), or no schema can be
	// inferred from it, or (frame only) it is not the base64 it should be.
	ReasonMismatch = "schema_mismatch"
	// ReasonRejected: the registry refused the inferred schema as invalid (422).
	ReasonRejected = "schema_rejected"
)

// Error is a payload that cannot be serialized, whatever the registry does: the sink sends its
// event to the failure policy with Reason.
type Error struct {
	Reason  string
	Subject string
	Field   string // the field that does not fit, when one does not
	Err     error
}

func (e *Error) Error() string {
	return fmt.Sprintf("subject %s: %v", e.Subject, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Permanent returns err's reason when it is the event's fault (a *Error), so it goes to the
// failure policy; any other error is the registry's, and is retried.
func Permanent(err error) (reason string, ok bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason, true
	}
	return "", false
}

// Serializer serializes events' keys and values. It is safe for concurrent use.
type Serializer struct {
	reg Registry
	o   Options

	mu       sync.Mutex
	ids      map[idKey]int          // registered (subject, schema text) -> id
	subjects map[string]*strict     // strict and frame-only subjects
	inferred map[string]sr.Schema   // the last schema registered per inferred subject (Widener)
	widened  map[widenKey]sr.Schema // (subject's schema, inferred schema) -> merged: the steady state merges nothing
	shapes   map[string]*shapeSet   // inferred Avro subjects: what payloads of each shape got (shape.go)
	keyIDs   map[string]int         // topic -> its key schema's id, an index into ids by topic
	now      func() time.Time
}

type idKey struct{ subject, schema string }

type widenKey struct{ base, inferred string }

type strict struct {
	schema sr.Schema
	id     int
	at     time.Time
}

// maxIDs bounds the id cache (payloads whose members are data, not fields, infer a schema each);
// past it the cache starts again.
const maxIDs = 4096

// New returns a Serializer for o over reg.
func New(reg Registry, o Options) (*Serializer, error) {
	if o.Strategy == "" {
		o.Strategy = StrategyTopic
	}
	switch o.Strategy {
	case StrategyTopic, StrategyRecord, StrategyTopicRecord:
	default:
		return nil, fmt.Errorf("unknown subject name strategy %q (want %q, %q or %q)", o.Strategy, StrategyTopic, StrategyRecord, StrategyTopicRecord)
	}
	switch o.FrameOnly {
	case "", FrameBytes, FrameBase64:
	default:
		return nil, fmt.Errorf("unknown frame-only mode %q (want %q or %q)", o.FrameOnly, FrameBytes, FrameBase64)
	}
	if o.FrameOnly != "" && o.AutoRegister {
		return nil, errors.New("frame-only mode frames data with the registry's schema: it cannot infer and register (set auto_register to false)")
	}
	if o.FrameOnly != "" && o.Value != nil {
		return nil, errors.New("frame-only mode leaves the payload as the application serialized it: it takes no value format")
	}
	if o.FrameOnly == "" && o.Value == nil && !o.AvroKey {
		return nil, errors.New("nothing to serialize: no value format, no Avro key")
	}
	if o.FrameOnly != "" && o.FrameSubject == "" && o.Strategy == StrategyRecord && o.RecordName == "" {
		return nil, errors.New("frame-only mode with the record strategy needs the record name (or the subject) of the application's schema")
	}
	if o.LatestRefresh <= 0 {
		o.LatestRefresh = time.Minute
	}
	if o.FrameOnly != "" && o.FrameIndex == nil {
		o.FrameIndex = []int{0}
	}
	return &Serializer{reg: reg, o: o, ids: make(map[idKey]int), subjects: make(map[string]*strict),
		inferred: make(map[string]sr.Schema), widened: make(map[widenKey]sr.Schema), shapes: make(map[string]*shapeSet), keyIDs: make(map[string]int), now: time.Now}, nil
}

// Serialize returns the framed key and value of an event routed to topic: key is the aggregate
// id, value the payload (both as the outbox holds them), eventType names the record under the
// record strategies.
func (s *Serializer) Serialize(ctx context.Context, topic, eventType string, key, value []byte) (k, v []byte, err error) {
	k, v = key, value
	if s.o.AvroKey && key != nil {
		if k, err = s.key(ctx, topic); err != nil {
			return nil, nil, err
		}
		k = avro.AppendString(k, key)
	}
	if value == nil {
		return k, nil, nil
	}
	switch {
	case s.o.FrameOnly != "":
		v, err = s.frame(ctx, topic, eventType, value)
	case s.o.Value != nil:
		v, err = s.value(ctx, topic, eventType, value)
	}
	if err != nil {
		return nil, nil, err
	}
	return k, v, nil
}

// key returns the frame of the key's schema.
func (s *Serializer) key(ctx context.Context, topic string) ([]byte, error) {
	s.mu.Lock()
	id, ok := s.keyIDs[topic]
	s.mu.Unlock()
	if ok {
		return header(id, nil), nil
	}
	subject := topic + "-key"
	switch s.o.Strategy {
	case StrategyRecord:
		subject = "string"
	case StrategyTopicRecord:
		subject = topic + "-string"
	}
	id, err := s.register(ctx, subject, sr.Schema{Schema: avro.KeySchema, Type: sr.TypeAvro})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if cached, ok := s.ids[idKey{subject, avro.KeySchema}]; ok && cached == id {
		s.keyIDs[topic] = id // while the ids cache holds it: a topic asks again when a subject would
	}
	s.mu.Unlock()
	return header(id, nil), nil
}

func (s *Serializer) value(ctx context.Context, topic, eventType string, payload []byte) ([]byte, error) {
	name, namespace := s.recordName(eventType)
	subject := s.subject(topic, name, namespace)
	var schema sr.Schema
	var id int
	var err error
	if f, ok := s.o.Value.(*avro.Format); ok && s.o.AutoRegister {
		return s.inferredAvro(ctx, f, subject, name, namespace, payload)
	}
	if s.o.AutoRegister {
		if schema, err = s.o.Value.Infer(name, namespace, payload); err != nil {
			return nil, &Error{Reason: ReasonMismatch, Subject: subject, Field: fieldOf(err), Err: fmt.Errorf("no schema can be inferred from the payload: %w", err)}
		}
		if schema, err = s.widen(ctx, subject, schema); err != nil {
			return nil, err
		}
		if id, err = s.register(ctx, subject, schema); err != nil {
			return nil, err
		}
		if _, ok := s.o.Value.(Widener); ok {
			s.mu.Lock()
			s.inferred[subject] = schema
			s.mu.Unlock()
		}
	} else {
		st, err := s.strict(ctx, subject)
		if err != nil {
			return nil, err
		}
		if st.schema.Type != s.o.Value.Type() && !(st.schema.Type == 0 && s.o.Value.Type() == sr.TypeAvro) {
			return nil, fmt.Errorf("subject %s holds a %s schema, not %s: register the subject's schema in the format of value_encoding, or change value_encoding",
				subject, st.schema.Type, s.o.Value.Type())
		}
		schema, id = st.schema, st.id
	}
	index, data, err := s.o.Value.Encode(schema, payload)
	if err != nil && !s.o.AutoRegister && s.o.Version <= 0 {
		// The cached latest may be older than the version the payload was written for: ask the
		// registry before the event is called a mismatch.
		if st, ok := s.newerLatest(ctx, subject, id); ok {
			schema, id = st.schema, st.id
			index, data, err = s.o.Value.Encode(schema, payload)
		}
	}
	if err != nil {
		return nil, &Error{Reason: ReasonMismatch, Subject: subject, Field: fieldOf(err), Err: fmt.Errorf("the payload does not fit the schema (id %d): %w", id, err)}
	}
	return append(header(id, index), data...), nil
}

func (s *Serializer) frame(ctx context.Context, topic, eventType string, payload []byte) ([]byte, error) {
	subject := s.o.FrameSubject
	if subject == "" {
		name, namespace := s.recordName(eventType)
		subject = s.subject(topic, name, namespace)
	}
	data := payload
	if s.o.FrameOnly == FrameBase64 {
		text := strings.TrimSpace(string(payload))
		if len(text) >= 2 && text[0] == '"' && text[len(text)-1] == '"' {
			text = text[1 : len(text)-1] // a JSON string (a jsonb payload)
		}
		var err error
		if data, err = base64.StdEncoding.DecodeString(text); err != nil {
			return nil, &Error{Reason: ReasonMismatch, Subject: subject, Err: fmt.Errorf("the payload is not standard base64 (schema_registry.frame_only base64): %w", err)}
		}
	}
	st, err := s.strict(ctx, subject)
	if err != nil {
		return nil, err
	}
	var index []int
	if st.schema.Type == sr.TypeProtobuf {
		index = s.o.FrameIndex
	}
	return append(header(st.id, index), data...), nil
}

// widen merges inferred into the subject's schema (Widener): the one this Serializer registered
// last, or, the first time, the registry's latest (so a restart does not register a narrower
// schema). A subject without a schema, or one that cannot merge, takes inferred as it is.
func (s *Serializer) widen(ctx context.Context, subject string, inferred sr.Schema) (sr.Schema, error) {
	if _, ok := s.o.Value.(Widener); !ok {
		return inferred, nil
	}
	s.mu.Lock()
	base, known := s.inferred[subject]
	s.mu.Unlock()
	return s.widenFrom(ctx, subject, base, known, inferred)
}

// widenFrom is widen from base, the subject's schema this Serializer registered last (known), or
// else the registry's latest.
func (s *Serializer) widenFrom(ctx context.Context, subject string, base sr.Schema, known bool, inferred sr.Schema) (sr.Schema, error) {
	w := s.o.Value.(Widener)
	if !known {
		latest, err := s.reg.Latest(ctx, subject)
		var re *sr.ResponseError
		switch {
		case errors.As(err, &re) && re.StatusCode == http.StatusNotFound:
			return inferred, nil // a new subject
		case err != nil:
			return sr.Schema{}, heldError(subject, "looking up the subject's latest schema", err)
		}
		base = latest.Schema
	}
	if base.Schema == inferred.Schema {
		return inferred, nil
	}
	k := widenKey{base.Schema, inferred.Schema}
	s.mu.Lock()
	merged, ok := s.widened[k]
	s.mu.Unlock()
	if ok {
		return merged, nil
	}
	if merged, ok = w.Widen(base, inferred); !ok {
		merged = inferred
	}
	s.mu.Lock()
	if len(s.widened) >= maxIDs {
		clear(s.widened)
	}
	s.widened[k] = merged
	s.mu.Unlock()
	return merged, nil
}

// recordName is the value's record name and namespace for an event of eventType.
func (s *Serializer) recordName(eventType string) (name, namespace string) {
	name = s.o.RecordName
	if name == "" {
		name = DefaultRecordName
		if s.o.Strategy != StrategyTopic && eventType != "" {
			name = avroName(eventType)
		}
	}
	return name, s.o.RecordNamespace
}

func (s *Serializer) subject(topic, name, namespace string) string {
	full := name
	if namespace != "" {
		full = namespace + "." + name
	}
	switch s.o.Strategy {
	case StrategyRecord:
		return full
	case StrategyTopicRecord:
		return topic + "-" + full
	}
	return topic + "-value"
}

// register returns the id of schema under subject, from the cache or the registry.
func (s *Serializer) register(ctx context.Context, subject string, schema sr.Schema) (int, error) {
	k := idKey{subject, schema.Schema}
	s.mu.Lock()
	id, ok := s.ids[k]
	s.mu.Unlock()
	if ok {
		return id, nil
	}
	id, err := s.reg.Register(ctx, subject, schema)
	if err != nil {
		return 0, registerError(subject, err)
	}
	s.mu.Lock()
	if len(s.ids) >= maxIDs {
		clear(s.ids)
		clear(s.shapes) // their ids are the cleared ones: learn them again as a miss would
		clear(s.keyIDs)
	}
	s.ids[k] = id
	s.mu.Unlock()
	return id, nil
}

// strict returns the subject's pinned or latest schema, from the cache while it is fresh, or
// while the registry cannot be reached.
func (s *Serializer) strict(ctx context.Context, subject string) (*strict, error) {
	s.mu.Lock()
	st := s.subjects[subject]
	s.mu.Unlock()
	if st != nil && (s.o.Version > 0 || s.now().Sub(st.at) < s.o.LatestRefresh) {
		return st, nil
	}
	var got sr.SubjectSchema
	var err error
	if s.o.Version > 0 {
		got, err = s.reg.Version(ctx, subject, s.o.Version)
	} else {
		got, err = s.reg.Latest(ctx, subject)
	}
	if err != nil {
		if st != nil && ctx.Err() == nil {
			return st, nil // keep the cached version; the next event asks again
		}
		return nil, lookupError(subject, s.o.Version, err)
	}
	st = &strict{schema: got.Schema, id: got.ID, at: s.now()}
	s.mu.Lock()
	s.subjects[subject] = st
	s.mu.Unlock()
	return st, nil
}

// FreshLatest is a Registry whose Latest answers from a cache (*schemaregistry.Client): it reads
// the subject's latest version from the registry itself.
type FreshLatest interface {
	FreshLatest(ctx context.Context, subject string) (sr.SubjectSchema, error)
}

// newerLatest reads a strict subject's latest version from the registry, past every cache, and
// returns it when it is not the version of id (cached) and is in value_encoding's format. A
// payload that does not fit the cached latest costs this one request: the version it was written
// for may have been registered since the cache was filled (TestAvroThroughARealRegistry, "a
// strict subject's new version serves the first event that needs it"). A registry that cannot
// answer leaves the verdict to the cached version.
func (s *Serializer) newerLatest(ctx context.Context, subject string, id int) (*strict, bool) {
	var got sr.SubjectSchema
	var err error
	if f, ok := s.reg.(FreshLatest); ok {
		got, err = f.FreshLatest(ctx, subject)
	} else {
		got, err = s.reg.Latest(ctx, subject)
	}
	if err != nil || got.ID == id || got.Schema.Type != s.o.Value.Type() && !(got.Schema.Type == 0 && s.o.Value.Type() == sr.TypeAvro) {
		return nil, false
	}
	st := &strict{schema: got.Schema, id: got.ID, at: s.now()}
	s.mu.Lock()
	s.subjects[subject] = st
	s.mu.Unlock()
	return st, true
}

// fieldOf returns the path of the member a format's error names: schemas/avro's *FieldError, or
// any error with a FieldPath method (schemas/protobuf's and schemas/jsonschema's).
func fieldOf(err error) string {
	var fe *avro.FieldError
	if errors.As(err, &fe) {
		return fe.Path
	}
	var fp interface{ FieldPath() string }
	if errors.As(err, &fp) {
		return fp.FieldPath()
	}
	return ""
}

// header is the Confluent wire format's header for id and a Protobuf message index.
func header(id int, index []int) []byte {
	b, _ := new(sr.ConfluentHeader).AppendEncode(make([]byte, 0, 64), id, index) // never fails
	return b
}

// avroName makes s a name: each character that is not a letter, a digit or '_' becomes '_', and
// a leading digit gets a '_' before it ("order.created" -> "order_created").
func avroName(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == '_' || r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'):
			b.WriteRune(r)
		case r < 128 && r >= '0' && r <= '9':
			if i == 0 {
				b.WriteByte('_')
			}
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}
