package config_test

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/sink/record"
)

func TestCloudEventsKeysLoadFromAFileAndBecomeTheRecordOption(t *testing.T) {
	c, _, err := load(t, `
envelope: cloudevents
cloudevents:
  mode: binary
  source: https://shop.example/{aggregate_type}
  type: com.example.{event_type}
  subject: "{aggregate_id}"
`, required())
	if err != nil {
		t.Fatal(err)
	}
	want := record.CloudEvents{Mode: record.CloudEventsBinary, Source: "https://shop.example/{aggregate_type}",
		Type: "com.example.{event_type}", Subject: "{aggregate_id}", DataContentType: "application/json"}
	if got := c.RecordCloudEvents(); got == nil || *got != want {
		t.Errorf("RecordCloudEvents() = %+v, want %+v", got, want)
	}
	d, _, err := load(t, "", required())
	if err != nil || d.RecordCloudEvents() != nil {
		t.Errorf("by default there is no envelope: %v, %+v", err, d.RecordCloudEvents())
	}
}

func TestCloudEventsKeysAreCheckedWithTheValueEncoding(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"an unknown mode", []string{"OUTBOX_ENVELOPE", "cloudevents", "OUTBOX_CLOUDEVENTS_MODE", "batch"}, "config key cloudevents.mode"},
		{"an unknown placeholder", []string{"OUTBOX_ENVELOPE", "cloudevents", "OUTBOX_CLOUDEVENTS_TYPE", "{type}"}, "config key envelope"},
		{"a JSON encoding whose data is said not to be JSON",
			[]string{"OUTBOX_ENVELOPE", "cloudevents", "OUTBOX_VALUE_ENCODING", "json-expanded", "OUTBOX_CLOUDEVENTS_DATA_CONTENT_TYPE", "text/plain"}, "not JSON"},
		{"a cloudevents key without the envelope", []string{"OUTBOX_CLOUDEVENTS_MODE", "binary"}, "applies with envelope: cloudevents only"},
		{"a structured envelope around a registry encoding",
			[]string{"OUTBOX_ENVELOPE", "cloudevents", "OUTBOX_VALUE_ENCODING", "avro", "OUTBOX_SCHEMA_REGISTRY_URLS", "http://registry:8081"},
			"value_encoding avro with envelope cloudevents needs cloudevents.mode binary"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := load(t, "", with(required(), tt.env...))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to say %q", err, tt.want)
			}
		})
	}
}

func TestBinaryCloudEventsAroundARegistryEncodingSayTheFormatsMediaType(t *testing.T) {
	for enc, want := range map[string]string{"avro": "application/avro", "protobuf": "application/protobuf", "json-schema": "application/json"} {
		t.Run(enc, func(t *testing.T) {
			c, _, err := load(t, "", with(required(), "OUTBOX_ENVELOPE", "cloudevents", "OUTBOX_CLOUDEVENTS_MODE", "binary",
				"OUTBOX_VALUE_ENCODING", enc, "OUTBOX_SCHEMA_REGISTRY_URLS", "http://registry:8081"))
			if err != nil {
				t.Fatal(err)
			}
			if ce := c.RecordCloudEvents(); ce == nil || ce.DataContentType != want {
				t.Errorf("RecordCloudEvents() = %+v, want content type %s", ce, want)
			}
		})
	}
}
