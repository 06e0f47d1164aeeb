package decoder_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// boolType is bool's type OID (the others are in decoder_test.go).
const boolType = 16

func TestARowReadFromTheTableBecomesTheEventTheStreamWouldGive(t *testing.T) {
	cfg := defaultConfig()
	cfg.Columns.AggregateVersion = "version"
	cfg.Columns.Timestamp = "occurred_at"
	cfg.Columns.TracingSpanContext = "span"
	cfg.Extra = []string{"tenant", "priority", "urgent"}
	if got, want := cfg.RowColumns(), []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "version", "occurred_at", "span", "tenant", "priority", "urgent"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("RowColumns = %v, want %v", got, want)
	}
	oids := []uint32{textOID, textOID, textOID, textOID, byteaOID, textOID, int8OID, timestamptzOID, textOID, textOID, int8OID, boolType}
	ch, err := cfg.FromRow([][]byte{bs("e-1"), bs("order"), bs("o-1"), bs("Placed"), bs(`\x7b7d`), bs(`{"h":"v"}`), bs("3"),
		bs("2026-12-01 10:00:00.5+01"), bs("traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), nil, bs("7"), bs("t")}, oids)
	if err != nil {
		t.Fatal(err)
	}
	want := &decoder.Event{ID: bs("e-1"), AggregateType: bs("order"), AggregateID: bs("o-1"), EventType: bs("Placed"),
		Payload: bs("{}"), Headers: bs(`{"h":"v"}`), AggregateVersion: bs("3"),
		Time:        time.Date(2026, 12, 1, 9, 0, 0, 500e6, time.UTC),
		SpanContext: bs("traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
		Extra:       [][]byte{nil, bs("7"), bs("t")}, ExtraKinds: []decoder.ValueKind{decoder.KindString, decoder.KindNumber, decoder.KindBool}}
	if ch.Kind != decoder.Insert || ch.Unusable != nil || !ch.Event.Time.Equal(want.Time) {
		t.Fatalf("FromRow = kind %v, unusable %v, time %v; want an insert at %v", ch.Kind, ch.Unusable, ch.Event.Time, want.Time)
	}
	ch.Event.Time = want.Time // the same instant; the location differs
	if !reflect.DeepEqual(ch.Event, want) {
		t.Fatalf("FromRow = %+v, want %+v", ch.Event, want)
	}
	if _, err := cfg.FromRow([][]byte{bs("e-1")}, oids[:1]); err == nil {
		t.Fatal("FromRow accepted a row with too few values")
	}
}

func TestARowWithAnUnreadableTimestampGoesToTheFailurePolicy(t *testing.T) {
	cfg := defaultConfig()
	cfg.Columns.Timestamp = "occurred_at"
	ch, err := cfg.FromRow([][]byte{bs("e-1"), bs("order"), bs("o-1"), bs("Placed"), bs("{}"), nil, bs("infinity")},
		[]uint32{textOID, textOID, textOID, textOID, textOID, textOID, timestamptzOID})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(ch.Unusable, decoder.ErrInvalidTimestamp) || ch.Event == nil || string(ch.Event.ID) != "e-1" {
		t.Fatalf("FromRow = %+v; want the event, marked unusable with ErrInvalidTimestamp", ch)
	}
}
