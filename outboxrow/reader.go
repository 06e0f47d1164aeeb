// Package outboxrow reads outbox rows from the table as events: the one reader behind the
// backfill, a lost slot's recovery, a replay and polling. A row read here makes the same event as
// the WAL mode decodes from its insert (decoder.Config.FromRow): every column in text form, as
// pgoutput sends it, with the row's creation time as the event's commit time.
//
// It reads and decodes; what is published, and in which transaction and order the rows are read,
// stays with the caller. It imports nothing of the daemon but the decoder.
package outboxrow

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// Reader selects an outbox table's rows and decodes them into events.
type Reader struct {
	dec     decoder.Config
	columns []string // the event's columns, in the order dec.FromRow takes them
	created string   // the creation time column
}

// NewReader returns a reader of the columns dec maps, and of the creation time column created.
func NewReader(dec decoder.Config, created string) Reader {
	return Reader{dec: dec, columns: dec.RowColumns(), created: created}
}

// Columns is how many values Select lists: the event's, then the creation time. A query may
// select more after them; a Row hands those back in Rest.
func (r Reader) Columns() int { return len(r.columns) + 1 }

// Select is the beginning of a query's select list: the event's columns and the creation time,
// quoted, each prefixed with alias and a dot when alias is not empty (a query joining the table).
func (r Reader) Select(alias string) string {
	prefix := ""
	if alias != "" {
		prefix = alias + "."
	}
	quoted := make([]string, 0, r.Columns())
	for _, c := range append(r.columns[:len(r.columns):len(r.columns)], r.created) {
		quoted = append(quoted, prefix+pgx.Identifier{c}.Sanitize())
	}
	return strings.Join(quoted, ", ")
}

// Querier is a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Query runs sql, whose select list begins with Select's, and returns its rows to read with
// Next and Row. args are the query's, after an optional pgx.QueryExecMode.
func (r Reader) Query(ctx context.Context, q Querier, sql string, args ...any) (*Rows, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	fields := rows.FieldDescriptions()
	if len(fields) < r.Columns() {
		// The extended protocol reports a failed query through rows.Err, after Close.
		rows.Close()
		return nil, cmp.Or(rows.Err(), fmt.Errorf("the query returned %d columns, want at least %d", len(fields), r.Columns()))
	}
	oids := make([]uint32, len(r.columns))
	for i, f := range fields[:len(r.columns)] {
		oids[i] = f.DataTypeOID
	}
	return &Rows{r: r, rows: rows, oids: oids}, nil
}

// Rows is a query's outbox rows, read one at a time.
type Rows struct {
	r    Reader
	rows pgx.Rows
	oids []uint32
	row  Row
	err  error
}

// Row is one outbox row read as an event.
type Row struct {
	// Event is the row's event, its Tx.CommitTime the row's creation time (when readable).
	Event *decoder.Event
	// Unusable is set for a row that cannot be published as it is (decoder.Change.Unusable):
	// for the failure policy, as from the stream.
	Unusable error
	// Created is the row's creation time; zero when NULL or unreadable.
	Created time.Time
	// Rest are the values the query selected after Select's, in text form.
	Rest [][]byte
	// Size is the bytes of all the row's values, which the event and Rest alias.
	Size int64
}

// Next reads the next row, false after the last one or an error (see Err).
func (rs *Rows) Next() bool {
	if rs.err != nil || !rs.rows.Next() {
		return false
	}
	rs.row, rs.err = rs.r.decode(rs.rows.RawValues(), rs.oids)
	return rs.err == nil
}

// Row is the row Next read.
func (rs *Rows) Row() Row { return rs.row }

// Err is why Next stopped before the last row, if it did.
func (rs *Rows) Err() error {
	if rs.err != nil {
		return rs.err
	}
	return rs.rows.Err()
}

// Close ends the query; Rows may be closed more than once.
func (rs *Rows) Close() { rs.rows.Close() }

// decode makes a Row of raw, the values of one row in text form (which it copies: pgx reuses
// them for the next row); oids are the types of the event's columns.
func (r Reader) decode(raw [][]byte, oids []uint32) (Row, error) {
	if len(raw) < r.Columns() {
		return Row{}, fmt.Errorf("row has %d values, want at least %d", len(raw), r.Columns())
	}
	vals := make([][]byte, len(raw))
	var size int64
	for i, v := range raw {
		if v != nil {
			vals[i] = append([]byte{}, v...)
			size += int64(len(v))
		}
	}
	n := len(r.columns)
	ch, err := r.dec.FromRow(vals[:n], oids)
	if err != nil {
		return Row{}, err
	}
	row := Row{Event: ch.Event, Unusable: ch.Unusable, Rest: vals[n+1:], Size: size}
	if vals[n] != nil {
		if t, err := decoder.ParseTimestamp(vals[n], true); err == nil { // any offset: +05:30 too
			row.Created = t
			row.Event.Tx.CommitTime = t // what the end-to-end latency and the record timestamp go by
		}
	}
	return row, nil
}
