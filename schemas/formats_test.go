package schemas_test

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/schemas"
)

func TestValueFormatsByEncodingName(t *testing.T) {
	for enc, typ := range map[string]sr.SchemaType{"avro": sr.TypeAvro, "protobuf": sr.TypeProtobuf, "json-schema": sr.TypeJSON} {
		f, err := schemas.ValueFormat(enc)
		if err != nil || f.Type() != typ {
			t.Errorf("ValueFormat(%q) = %v, %v; want a %s format", enc, f, err, typ)
		}
	}
	if _, err := schemas.ValueFormat("json-string"); err == nil {
		t.Error("ValueFormat accepted json-string, which needs no registry")
	}
	if n := len(schemas.Formats()); n != 3 {
		t.Errorf("Formats() has %d formats, want 3", n)
	}
}

// TestEveryFormatsMismatchNamesItsField: the field a format's error names reaches the *Error the
// sink reads, whatever the format (the registry is a fake here: only the error's path is at
// stake; the real registry's part is in the sink's tests).
func TestEveryFormatsMismatchNamesItsField(t *testing.T) {
	for _, tc := range []struct {
		encoding string
		schema   sr.Schema
	}{
		{"avro", sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":"Order","fields":[{"name":"lines","type":{"type":"array","items":` +
			`{"type":"record","name":"Line","fields":[{"name":"qty","type":"int"}]}}}]}`}},
		{"protobuf", sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3"; message Order { message Line { int32 qty = 1; } repeated Line lines = 1; }`}},
		{"json-schema", sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","properties":{"lines":{"type":"array","items":{"type":"object","properties":{"qty":{"type":"integer"}}}}}}`}},
	} {
		t.Run(tc.encoding, func(t *testing.T) {
			f, err := schemas.ValueFormat(tc.encoding)
			if err != nil {
				t.Fatal(err)
			}
			reg := &fakeRegistry{latest: map[string]sr.SubjectSchema{"orders-value": {Subject: "orders-value", Version: 1, ID: 7, Schema: tc.schema}}}
			ser, err := schemas.New(reg, schemas.Options{Value: f})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = ser.Serialize(context.Background(), "orders", "Created", nil, []byte(`{"lines":[{"qty":1},{"qty":"two"}]}`))
			var se *schemas.Error
			if !errors.As(err, &se) || se.Reason != schemas.ReasonMismatch || se.Field != "lines[1].qty" {
				t.Fatalf("error %v (field %q), want %s naming lines[1].qty", err, fieldOf(se), schemas.ReasonMismatch)
			}
		})
	}
}

func fieldOf(e *schemas.Error) string {
	if e == nil {
		return ""
	}
	return e.Field
}
