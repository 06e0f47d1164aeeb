package decoder

import "fmt"

// RowColumns lists the outbox table's columns to select for events read from the table instead of
// the WAL (the backfill, a replay), in the order FromRow takes their values: the mapped columns,
// the optional ones that are configured, then Extra.
func (c Config) RowColumns() []string {
	cols := c.Columns
	out := []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload}
	for _, optional := range []string{cols.Headers, cols.AggregateVersion, cols.Timestamp, cols.TracingSpanContext} {
		if optional != "" {
			out = append(out, optional)
		}
	}
	return append(out, c.Extra...)
}

// FromRow makes an insert of one row's values, selected as RowColumns says and in text form, as
// pgoutput sends them (timestamps with DateStyle ISO), so that events look the same however they
// were read. oids are the values' type OIDs (the query's field descriptions), which tell a bytea
// payload (hex, decoded), a timestamptz column and the JSON kinds of the extra values. The event
// aliases vals. As from the stream, a row the relay cannot publish as it is (an unreadable
// timestamp) comes back with Change.Unusable set, for the failure policy; an error means the
// values do not match RowColumns.
func (c Config) FromRow(vals [][]byte, oids []uint32) (Change, error) {
	want := len(c.RowColumns())
	if len(vals) != want || len(oids) != want {
		return Change{}, fmt.Errorf("row has %d values and %d types, want %d (RowColumns)", len(vals), len(oids), want)
	}
	ev := &Event{ID: vals[0], AggregateType: vals[1], AggregateID: vals[2], EventType: vals[3], Payload: vals[4]}
	ch := Change{Kind: Insert, Event: ev}
	i := 5
	next := func(name string) (v []byte, oid uint32, ok bool) {
		if name == "" {
			return nil, 0, false
		}
		i++
		return vals[i-1], oids[i-1], true
	}
	if v, _, ok := next(c.Columns.Headers); ok {
		ev.Headers = v
	}
	if v, _, ok := next(c.Columns.AggregateVersion); ok {
		ev.AggregateVersion = v
	}
	if v, oid, ok := next(c.Columns.Timestamp); ok && v != nil {
		var err error
		if ev.Time, err = ParseTimestamp(v, oid == timestamptzOID); err != nil {
			ch.Unusable = fmt.Errorf("timestamp column %q: %w", c.Columns.Timestamp, err)
		}
	}
	if v, _, ok := next(c.Columns.TracingSpanContext); ok {
		ev.SpanContext = v
	}
	if len(c.Extra) > 0 {
		ev.Extra = vals[i : i+len(c.Extra)]
		ev.ExtraKinds = make([]ValueKind, len(c.Extra))
		for j, oid := range oids[i : i+len(c.Extra)] {
			ev.ExtraKinds[j] = KindOf(oid)
		}
	}
	if oids[4] == byteaOID && ev.Payload != nil {
		var err error
		if ev.Payload, err = Bytea(ev.Payload); err != nil {
			return Change{}, fmt.Errorf("payload of event %s: %w", ev.ID, err)
		}
	}
	return ch, nil
}
