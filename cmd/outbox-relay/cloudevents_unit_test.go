package main

import (
	"flag"
	"io"
	"testing"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// run and replay build their records from relayConfig: the envelope keys must reach the record
// options, or a relay configured for CloudEvents would publish bare records.
func TestTheEnvelopeKeysReachTheRecordOptions(t *testing.T) {
	env := map[string]string{
		"OUTBOX_PG_DSN": "postgres://relay@localhost:5432/app", "OUTBOX_KAFKA_BROKERS": "localhost:9092",
		"OUTBOX_ENVELOPE": "cloudevents", "OUTBOX_CLOUDEVENTS_MODE": "binary", "OUTBOX_CLOUDEVENTS_SUBJECT": "{aggregate_id}",
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := config.NewLoader(fs, func(name string) string { return env[name] })
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	c, err := l.Load()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := relayConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	want := record.CloudEvents{Mode: record.CloudEventsBinary, Source: record.DefaultCloudEventsSource, Type: record.DefaultCloudEventsType,
		Subject: "{aggregate_id}", DataContentType: record.DefaultCloudEventsContentType}
	if got := rc.Sink.Record.CloudEvents; got == nil || *got != want {
		t.Errorf("record options' CloudEvents = %+v, want %+v", got, want)
	}
}
