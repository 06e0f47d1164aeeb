package decoder

import (
	"fmt"
	"strings"
)

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

// TableOrder is the ORDER BY list for reading events from a table without an insertion sequence
// column, where the creation time column created is what is left to order by. What matters is each
// aggregate's order (its events share a key, so a partition), and the creation time may disagree
// with it (equal within a transaction, clocks): where a version column is configured, each
// aggregate's events go in version order, aggregate after aggregate, and an event without a
// version goes after the versions created before it (the highest of them), so mixing them keeps
// the versioned ones in order and the others about where they were written (within one
// transaction, which shares a creation time, anywhere among its versioned events). The version
// column must be of a numeric type (the caller checks), and the order sorts the whole selection
// before its first row: for selections (a replay), not for reading a whole table.
func (c Config) TableOrder(created string) string {
	col := quoteIdent
	cols := c.Columns
	if cols.AggregateVersion == "" {
		return col(created) + ", " + col(cols.ID)
	}
	typ, id, v := col(cols.AggregateType), col(cols.AggregateID), col(cols.AggregateVersion)
	return fmt.Sprintf("%s, %s, coalesce(%s, max(%s) OVER (PARTITION BY %s, %s ORDER BY %s, %s), 0), %s, %s",
		typ, id, v, v, typ, id, col(created), col(cols.ID), col(created), col(cols.ID))
}

// quoteIdent quotes a column name for SQL, as pgx.Identifier does.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(name, "\x00", ""), `"`, `""`) + `"`
}
