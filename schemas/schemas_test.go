package schemas_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/schemas/avro"
)

// fakeRegistry isolates the Serializer's corners (caching, error classes); the real registry's
// behaviour is proven in the sink's end-to-end tests.
type fakeRegistry struct {
	calls    int
	ids      map[string]int // subject + schema -> id
	latest   map[string]sr.SubjectSchema
	fail     error // returned by every call while set
	conflict bool  // Register answers 409
}

func (f *fakeRegistry) Register(_ context.Context, subject string, s sr.Schema) (int, error) {
	f.calls++
	if f.fail != nil {
		return 0, f.fail
	}
	if f.conflict {
		return 0, &sr.ResponseError{StatusCode: http.StatusConflict, Message: "incompatible"}
	}
	if f.ids == nil {
		f.ids = map[string]int{}
	}
	k := subject + "\x00" + s.Schema
	if _, ok := f.ids[k]; !ok {
		f.ids[k] = len(f.ids) + 1
	}
	return f.ids[k], nil
}

func (f *fakeRegistry) Latest(_ context.Context, subject string) (sr.SubjectSchema, error) {
	f.calls++
	if f.fail != nil {
		return sr.SubjectSchema{}, f.fail
	}
	ss, ok := f.latest[subject]
	if !ok {
		return ss, &sr.ResponseError{StatusCode: http.StatusNotFound, Message: "Subject not found"}
	}
	return ss, nil
}

func (f *fakeRegistry) Version(ctx context.Context, subject string, _ int) (sr.SubjectSchema, error) {
	return f.Latest(ctx, subject)
}

func (f *fakeRegistry) SchemaByID(_ context.Context, id int) (sr.Schema, error) {
	for k, v := range f.ids {
		if v == id {
			_, s, _ := strings.Cut(k, "\x00")
			return sr.Schema{Schema: s, Type: sr.TypeAvro}, nil
		}
	}
	for _, ss := range f.latest {
		if ss.ID == id {
			return ss.Schema, nil
		}
	}
	return sr.Schema{}, &sr.ResponseError{StatusCode: http.StatusNotFound}
}

func TestSubjectsFollowTheNamingStrategy(t *testing.T) {
	tests := []struct {
		name     string
		o        schemas.Options
		subjects []string
	}{
		{"the topic strategy names the topic's value and key subjects",
			schemas.Options{}, []string{"orders-key", "orders-value"}},
		{"the record strategy names the value subject after the event type and the key's after its type",
			schemas.Options{Strategy: schemas.StrategyRecord, RecordNamespace: "shop"}, []string{"string", "shop.order_created"}},
		{"the topic-record strategy puts the topic before the record's name",
			schemas.Options{Strategy: schemas.StrategyTopicRecord}, []string{"orders-string", "orders-order_created"}},
		{"a configured record name names every event's record",
			schemas.Options{Strategy: schemas.StrategyRecord, RecordName: "Order"}, []string{"string", "Order"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := &fakeRegistry{}
			tt.o.Value, tt.o.AvroKey, tt.o.AutoRegister = avro.New(), true, true
			s, err := schemas.New(reg, tt.o)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Serialize(context.Background(), "orders", "order.created", []byte("o-1"), []byte(`{"a":1}`)); err != nil {
				t.Fatal(err)
			}
			var got []string
			for k := range reg.ids {
				subject, _, _ := strings.Cut(k, "\x00")
				got = append(got, subject)
			}
			if len(got) != 2 || !(got[0] == tt.subjects[0] && got[1] == tt.subjects[1] || got[1] == tt.subjects[0] && got[0] == tt.subjects[1]) {
				t.Fatalf("subjects %v, want %v", got, tt.subjects)
			}
		})
	}
}

func TestFramesAreConfluentsWireFormatAndRoundTrip(t *testing.T) {
	reg := &fakeRegistry{}
	s, err := schemas.New(reg, schemas.Options{Value: avro.New(), AvroKey: true, AutoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	k, v, err := s.Serialize(ctx, "orders", "created", []byte("o-1"), []byte(`{"id":"o-1","qty":2}`))
	if err != nil {
		t.Fatal(err)
	}
	// The key: magic 0, id 1 (the key subject registered first), then "o-1" as an Avro string.
	if want := []byte{0, 0, 0, 0, 1, 6, 'o', '-', '1'}; !bytes.Equal(k, want) {
		t.Fatalf("key % x, want % x", k, want)
	}
	if v[0] != 0 || v[4] != 2 {
		t.Fatalf("value header % x, want magic 0 and id 2", v[:5])
	}
	d := schemas.NewDeserializer(reg, avro.New())
	doc, _, err := d.Decode(ctx, v)
	if err != nil || string(doc) != `{"id":"o-1","qty":2}` {
		t.Fatalf("decoded %s, %v", doc, err)
	}
	key, _, err := d.Decode(ctx, k)
	if err != nil || string(key) != `"o-1"` {
		t.Fatalf("decoded key %s, %v", key, err)
	}
	if _, _, err := d.Decode(ctx, []byte(`{"id":1}`)); !errors.Is(err, schemas.ErrNotFramed) {
		t.Fatalf("unframed bytes: %v, want ErrNotFramed", err)
	}
	// Nothing more goes to the registry for events of known shapes: the ids are cached.
	calls := reg.calls
	for range 10 {
		if _, _, err := s.Serialize(ctx, "orders", "created", []byte("o-2"), []byte(`{"id":"o-2","qty":3}`)); err != nil {
			t.Fatal(err)
		}
	}
	if reg.calls != calls {
		t.Fatalf("%d registry calls for 10 events of a known shape, want none", reg.calls-calls)
	}
	// A tombstone stays one.
	if _, v, err := s.Serialize(ctx, "orders", "deleted", []byte("o-1"), nil); err != nil || v != nil {
		t.Fatalf("tombstone value %x, %v", v, err)
	}
}

func TestErrorsSayWhetherTheEventOrTheRegistryIsAtFault(t *testing.T) {
	order := sr.SubjectSchema{Subject: "orders-value", ID: 7, Schema: sr.Schema{Type: sr.TypeAvro,
		Schema: `{"type":"record","name":"Order","fields":[{"name":"qty","type":"int"}]}`}}
	tests := []struct {
		name      string
		reg       *fakeRegistry
		o         schemas.Options
		payload   string
		reason    string // "" for an error the stream waits out
		wantInErr string
	}{
		{"an inferred schema the registry finds incompatible fails the event with schema_incompatible",
			&fakeRegistry{conflict: true}, schemas.Options{AutoRegister: true}, `{"qty":1}`, schemas.ReasonIncompatible, "compatibility rule"},
		{"a payload that infers nothing fails the event with schema_mismatch",
			&fakeRegistry{}, schemas.Options{AutoRegister: true}, `"text"`, schemas.ReasonMismatch, "not a JSON object"},
		{"a payload that does not fit the strict schema fails with schema_mismatch naming the field",
			&fakeRegistry{latest: map[string]sr.SubjectSchema{"orders-value": order}}, schemas.Options{}, `{"qty":"two"}`, schemas.ReasonMismatch, "field qty"},
		{"a registry answering 503 holds the event",
			&fakeRegistry{fail: &sr.ResponseError{StatusCode: 503}}, schemas.Options{AutoRegister: true}, `{"qty":1}`, "", "unavailable"},
		{"a strict subject not registered yet holds the event, naming the fix",
			&fakeRegistry{}, schemas.Options{}, `{"qty":1}`, "", "register the schema"},
		{"refused credentials hold the event, naming the fix",
			&fakeRegistry{fail: &sr.ResponseError{StatusCode: 401}}, schemas.Options{AutoRegister: true}, `{"qty":1}`, "", "basic auth or token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.o.Value = avro.New()
			s, err := schemas.New(tt.reg, tt.o)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = s.Serialize(context.Background(), "orders", "created", []byte("o-1"), []byte(tt.payload))
			if err == nil || !strings.Contains(err.Error(), tt.wantInErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantInErr)
			}
			reason, permanent := schemas.Permanent(err)
			if reason != tt.reason || permanent != (tt.reason != "") {
				t.Fatalf("Permanent: %q %v, want %q", reason, permanent, tt.reason)
			}
		})
	}
}

func TestAStrictSubjectKeepsItsCachedSchemaThroughAnOutage(t *testing.T) {
	order := sr.SubjectSchema{Subject: "orders-value", ID: 7, Schema: sr.Schema{Type: sr.TypeAvro,
		Schema: `{"type":"record","name":"Order","fields":[{"name":"qty","type":"int"}]}`}}
	reg := &fakeRegistry{latest: map[string]sr.SubjectSchema{"orders-value": order}}
	s, err := schemas.New(reg, schemas.Options{Value: avro.New(), LatestRefresh: 1}) // always stale
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := s.Serialize(ctx, "orders", "", nil, []byte(`{"qty":1}`)); err != nil {
		t.Fatal(err)
	}
	reg.fail = errors.New("connection refused")
	_, v, err := s.Serialize(ctx, "orders", "", nil, []byte(`{"qty":2}`))
	if err != nil {
		t.Fatalf("a stale cached schema should serve while the registry is down: %v", err)
	}
	if v[4] != 7 {
		t.Fatalf("framed with id %d, want 7", v[4])
	}
}

func TestFrameOnlyFramesTheApplicationsBytesAsTheyAre(t *testing.T) {
	order := sr.SubjectSchema{Subject: "orders-value", ID: 9, Schema: sr.Schema{Type: sr.TypeAvro, Schema: `"string"`}}
	data := avro.AppendString(nil, []byte("hello"))
	for _, tt := range []struct {
		name    string
		mode    schemas.FrameOnly
		payload []byte
	}{
		{"bytes are framed as they are", schemas.FrameBytes, data},
		{"base64 text is decoded and framed", schemas.FrameBase64, []byte(base64.StdEncoding.EncodeToString(data))},
		{"a base64 JSON string is decoded and framed", schemas.FrameBase64, []byte(`"` + base64.StdEncoding.EncodeToString(data) + `"`)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reg := &fakeRegistry{latest: map[string]sr.SubjectSchema{"orders-value": order}}
			s, err := schemas.New(reg, schemas.Options{FrameOnly: tt.mode})
			if err != nil {
				t.Fatal(err)
			}
			_, v, err := s.Serialize(context.Background(), "orders", "", nil, tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			if want := append([]byte{0, 0, 0, 0, 9}, data...); !bytes.Equal(v, want) {
				t.Fatalf("value % x, want % x", v, want)
			}
		})
	}
	reg := &fakeRegistry{latest: map[string]sr.SubjectSchema{"orders-value": order}}
	s, _ := schemas.New(reg, schemas.Options{FrameOnly: schemas.FrameBase64})
	_, _, err := s.Serialize(context.Background(), "orders", "", nil, []byte("not base64!"))
	if r, ok := schemas.Permanent(err); !ok || r != schemas.ReasonMismatch {
		t.Fatalf("bad base64: %v, want schema_mismatch", err)
	}
}

func TestAnInferredSubjectOnlyGrows(t *testing.T) {
	reg := &fakeRegistry{}
	s, err := schemas.New(reg, schemas.Options{Value: avro.New(), AutoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ids []byte
	for _, p := range []string{`{"qty":5000000000,"note":"x"}`, `{"qty":1}`, `{}`, `{"note":"y","qty":2}`} {
		_, v, err := s.Serialize(ctx, "orders", "", nil, []byte(p))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		ids = append(ids, v[4])
	}
	if !bytes.Equal(ids, []byte{1, 1, 1, 1}) || len(reg.ids) != 1 {
		t.Fatalf("schema ids %v, %d registered; want every event under the first schema", ids, len(reg.ids))
	}
	// A restarted relay starts from the registry's latest, not from a narrower inferred schema.
	latest := sr.SubjectSchema{Subject: "orders-value", ID: 1}
	for k := range reg.ids {
		_, latest.Schema.Schema, _ = strings.Cut(k, "\x00")
	}
	reg.latest = map[string]sr.SubjectSchema{"orders-value": latest}
	again, _ := schemas.New(reg, schemas.Options{Value: avro.New(), AutoRegister: true})
	if _, v, err := again.Serialize(ctx, "orders", "", nil, []byte(`{"qty":1}`)); err != nil || v[4] != 1 || len(reg.ids) != 1 {
		t.Fatalf("after a restart: id %d, %v, %d registered; want the first schema again", v[4], err, len(reg.ids))
	}
}

// BenchmarkSerializeAnInferredPayload is the steady state of infer and register: every id cached.
func BenchmarkSerializeAnInferredPayload(b *testing.B) {
	s, err := schemas.New(&fakeRegistry{}, schemas.Options{Value: avro.New(), AvroKey: true, AutoRegister: true})
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"order_id":"o-123","customer":"c-9","total":42.5,"lines":[{"sku":"a","qty":1},{"sku":"b","qty":2}],"note":"grüße"}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := s.Serialize(ctx, "orders", "Placed", []byte("o-123"), payload); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAReaderDoesNotKeepAnEmptySchemaARegistryAnsweredForAnID(t *testing.T) {
	ctx := context.Background()
	// A registry (or a proxy before it) answers 200 without a schema's text: the reader fails
	// this record, and reads it once the registry answers properly.
	reg := &fakeRegistry{latest: map[string]sr.SubjectSchema{"s": {ID: 9, Schema: sr.Schema{Type: sr.TypeAvro}}}}
	d := schemas.NewDeserializer(reg, avro.New())
	framed := append(append([]byte{0}, 0, 0, 0, 9), avro.AppendString(nil, []byte("o-1"))...)
	if doc, _, err := d.Decode(ctx, framed); err == nil {
		t.Fatalf("Decode with an empty schema = %s; want an error", doc)
	}
	reg.latest["s"] = sr.SubjectSchema{ID: 9, Schema: sr.Schema{Type: sr.TypeAvro, Schema: avro.KeySchema}}
	if doc, _, err := d.Decode(ctx, framed); err != nil || string(doc) != `"o-1"` {
		t.Fatalf("Decode once the registry answers = %s, %v; want \"o-1\"", doc, err)
	}
}
