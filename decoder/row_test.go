package decoder_test

import (
	"reflect"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
)

func TestARowReadFromTheTableBecomesTheEventTheStreamWouldGive(t *testing.T) {
	cfg := defaultConfig()
	cfg.Columns.AggregateVersion = "version"
	cfg.Extra = []string{"tenant"}
	if got, want := cfg.RowColumns(), []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "version", "tenant"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("RowColumns = %v, want %v", got, want)
	}
	ev, err := cfg.FromRow([][]byte{bs("e-1"), bs("order"), bs("o-1"), bs("Placed"), bs(`\x7b7d`), bs(`{"h":"v"}`), bs("3"), nil}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := &decoder.Event{ID: bs("e-1"), AggregateType: bs("order"), AggregateID: bs("o-1"), EventType: bs("Placed"),
		Payload: bs("{}"), Headers: bs(`{"h":"v"}`), AggregateVersion: bs("3"), Extra: [][]byte{nil}}
	if !reflect.DeepEqual(ev, want) {
		t.Fatalf("FromRow = %+v, want %+v", ev, want)
	}
	if _, err := cfg.FromRow([][]byte{bs("e-1")}, false); err == nil {
		t.Fatal("FromRow accepted a row with too few values")
	}
}
