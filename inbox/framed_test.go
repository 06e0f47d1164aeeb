package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/schemas/avro"
)

// mapRegistry keeps schemas in memory: it isolates Unframe; the relay's records are read through a
// real registry in cmd/outbox-relay's TestAvroThroughTheRelayAndAKill9LosesNothing.
type mapRegistry struct{ byID []sr.Schema }

func (r *mapRegistry) Register(_ context.Context, _ string, s sr.Schema) (int, error) {
	for i, have := range r.byID {
		if have.Schema == s.Schema {
			return i + 1, nil
		}
	}
	r.byID = append(r.byID, s)
	return len(r.byID), nil
}

func (r *mapRegistry) Latest(context.Context, string) (sr.SubjectSchema, error) {
	return sr.SubjectSchema{}, &sr.ResponseError{StatusCode: 404}
}

func (r *mapRegistry) Version(context.Context, string, int) (sr.SubjectSchema, error) {
	return sr.SubjectSchema{}, &sr.ResponseError{StatusCode: 404}
}

func (r *mapRegistry) SchemaByID(_ context.Context, id int) (sr.Schema, error) {
	if id < 1 || id > len(r.byID) {
		return sr.Schema{}, errors.New("no such id")
	}
	return r.byID[id-1], nil
}

func TestUnframeReadsWhatTheRelayFramesAndLeavesTheRestAlone(t *testing.T) {
	ctx := context.Background()
	reg := &mapRegistry{}
	ser, err := schemas.New(reg, schemas.Options{Value: avro.New(), AvroKey: true, AutoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	k, v, err := ser.Serialize(ctx, "orders", "Placed", []byte("order-1"), []byte(`{"total":12.5,"lines":[{"sku":"a"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// value_encoding protobuf and json-schema, read by the same Deserializer.
	framedIn := func(encoding, payload string) []byte {
		t.Helper()
		f, err := schemas.ValueFormat(encoding)
		if err != nil {
			t.Fatal(err)
		}
		s, err := schemas.New(reg, schemas.Options{Value: f, AutoRegister: true})
		if err != nil {
			t.Fatal(err)
		}
		_, v, err := s.Serialize(ctx, "orders", "Placed", nil, []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		name               string
		key, value         []byte
		wantKey, wantValue string
	}{
		{"a framed key and value read back as the aggregate id and the JSON payload", k, v, "order-1", `{"total":12.5,"lines":[{"sku":"a"}]}`},
		{"a protobuf value reads back as its JSON", k, framedIn("protobuf", `{"total":12.5}`), "order-1", `{"total":12.5}`},
		{"a json-schema value reads back as its JSON", k, framedIn("json-schema", `{"total":12.5,"lines":[{"sku":"a"}]}`), "order-1", `{"total":12.5,"lines":[{"sku":"a"}]}`},
		{"an unframed record is left as it is", []byte("order-2"), []byte(`{"total":1}`), "order-2", `{"total":1}`},
		{"a tombstone stays one", k, nil, "order-1", ""},
	}
	d := schemas.NewDeserializer(reg, schemas.Formats()...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := kafka.Message{Topic: "orders", Key: tt.key, Value: tt.value, Headers: []kafka.Header{{Key: "id", Value: []byte("e-1")}}}
			m, err := inbox.Unframe(ctx, d, m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := inbox.ParseDelivery(m)
			if err != nil {
				t.Fatal(err)
			}
			if got.AggregateID != tt.wantKey || string(got.Payload) != tt.wantValue {
				t.Fatalf("aggregate id %q, payload %s; want %q, %s", got.AggregateID, got.Payload, tt.wantKey, tt.wantValue)
			}
		})
	}
	// An id the registry does not know leaves the record unread, with the reason.
	if _, err := inbox.Unframe(ctx, d, kafka.Message{Value: []byte{0, 0, 0, 0, 99, 2}}); err == nil {
		t.Fatal("an unknown schema id was read")
	}
}
