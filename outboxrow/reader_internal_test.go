package outboxrow

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/decoder"
)

var columns = decoder.Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type", Payload: "payload"}

func TestSelectQuotesEveryColumnAndEndsWithTheCreationTime(t *testing.T) {
	r := NewReader(decoder.Config{Columns: columns, Extra: []string{"Tenant"}}, "created_at")
	for _, tc := range []struct{ name, alias, want string }{
		{"a query on the table alone names the columns bare", "",
			`"id", "aggregatetype", "aggregateid", "type", "payload", "Tenant", "created_at"`},
		{"a query joining the table names them through its alias", "t",
			`t."id", t."aggregatetype", t."aggregateid", t."type", t."payload", t."Tenant", t."created_at"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := r.Select(tc.alias); got != tc.want {
				t.Errorf("Select(%q) = %s, want %s", tc.alias, got, tc.want)
			}
			if got := r.Columns(); got != strings.Count(tc.want, ",")+1 {
				t.Errorf("Columns() = %d, Select lists %d", got, strings.Count(tc.want, ",")+1)
			}
		})
	}
}

func TestDecodeMakesTheRowsEvent(t *testing.T) {
	r := NewReader(decoder.Config{Columns: columns}, "created_at")
	oids := []uint32{pgtype.UUIDOID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, pgtype.JSONBOID}
	row := func(created string, rest ...string) [][]byte {
		vals := [][]byte{[]byte("e1"), []byte("order"), []byte("42"), []byte("created"), []byte(`{"a":1}`)}
		if created == "NULL" {
			vals = append(vals, nil)
		} else {
			vals = append(vals, []byte(created))
		}
		for _, v := range rest {
			vals = append(vals, []byte(v))
		}
		return vals
	}
	at := time.Date(2026, 12, 6, 12, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		raw     [][]byte
		created time.Time
		rest    []string
	}{
		{"a row's creation time is its event's commit time", row("2026-12-06 18:00:00+05:30"), at, nil},
		{"a row without a creation time has none", row("NULL"), time.Time{}, nil},
		{"an unreadable creation time leaves it unset", row("infinity"), time.Time{}, nil},
		{"the values selected after the creation time come back in order", row("2026-12-06 12:30:00+00", "7", "t"), at, []string{"7", "t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var size int64
			for _, v := range tc.raw {
				size += int64(len(v))
			}
			got, err := r.decode(tc.raw, oids)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range tc.raw {
				clear(v) // pgx reuses its buffers for the next row: the row must not alias them
			}
			if ev := got.Event; string(ev.ID) != "e1" || string(ev.AggregateID) != "42" || string(ev.Payload) != `{"a":1}` {
				t.Errorf("event = id %q, aggregate %q, payload %q: want the row's values, copied", ev.ID, ev.AggregateID, ev.Payload)
			}
			if !got.Created.Equal(tc.created) || !got.Event.Tx.CommitTime.Equal(tc.created) {
				t.Errorf("created %v, commit time %v, want %v", got.Created, got.Event.Tx.CommitTime, tc.created)
			}
			if len(got.Rest) != len(tc.rest) {
				t.Fatalf("rest = %q, want %q", got.Rest, tc.rest)
			}
			for i, v := range tc.rest {
				if string(got.Rest[i]) != v {
					t.Errorf("rest[%d] = %q, want %q", i, got.Rest[i], v)
				}
			}
			if got.Size != size {
				t.Errorf("size = %d, want %d (every value of the row)", got.Size, size)
			}
		})
	}
}

func TestDecodeRefusesARowShorterThanTheSelectList(t *testing.T) {
	r := NewReader(decoder.Config{Columns: columns}, "created_at")
	if _, err := r.decode(make([][]byte, 5), make([]uint32, 5)); err == nil {
		t.Fatal("a row without its creation time value decoded without an error")
	}
}
