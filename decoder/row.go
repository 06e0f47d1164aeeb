package decoder

import "fmt"

// RowColumns lists the outbox table's columns to select for events read from the table instead of
// the WAL (the backfill, a replay), in the order FromRow takes their values: the mapped columns,
// the optional ones that are configured, then Extra.
func (c Config) RowColumns() []string {
	cols := c.Columns
	out := []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload}
	if cols.Headers != "" {
		out = append(out, cols.Headers)
	}
	if cols.AggregateVersion != "" {
		out = append(out, cols.AggregateVersion)
	}
	return append(out, c.Extra...)
}

// FromRow makes an event of one row's values, selected as RowColumns says and in text form, as
// pgoutput sends them, so that events look the same however they were read. The event aliases
// vals. A bytea payload (payloadBytea) arrives as hex and is decoded.
func (c Config) FromRow(vals [][]byte, payloadBytea bool) (*Event, error) {
	if want := len(c.RowColumns()); len(vals) != want {
		return nil, fmt.Errorf("row has %d values, want %d (RowColumns)", len(vals), want)
	}
	ev := &Event{ID: vals[0], AggregateType: vals[1], AggregateID: vals[2], EventType: vals[3], Payload: vals[4]}
	i := 5
	if c.Columns.Headers != "" {
		ev.Headers = vals[i]
		i++
	}
	if c.Columns.AggregateVersion != "" {
		ev.AggregateVersion = vals[i]
		i++
	}
	if len(c.Extra) > 0 {
		ev.Extra = vals[i : i+len(c.Extra)]
	}
	if payloadBytea && ev.Payload != nil {
		var err error
		if ev.Payload, err = Bytea(ev.Payload); err != nil {
			return nil, fmt.Errorf("payload of event %s: %w", ev.ID, err)
		}
	}
	return ev, nil
}
