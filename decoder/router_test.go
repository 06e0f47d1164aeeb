package decoder_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// The columns Debezium's router options read: a record timestamp, a tracing span context, and
// extra columns whose JSON kind follows their type.
func TestDecodeRouterColumns(t *testing.T) {
	const (
		timestampOID = 1114
		boolOID      = 16
		int4OID      = 23
		float8OID    = 701
		numericOID   = 1700
	)
	cols := append(append([]col{}, defaultCols...), col{"ts", timestamptzOID}, col{"plain_ts", timestampOID}, col{"tracingspancontext", textOID},
		col{"n", int4OID}, col{"b", boolOID}, col{"f", float8OID}, col{"d", numericOID}, col{"s", textOID})
	cfg := func(ts string) decoder.Config {
		c := defaultConfig()
		c.Columns.Timestamp, c.Columns.TracingSpanContext = ts, "tracingspancontext"
		c.Extra = []string{"n", "b", "f", "d", "s"}
		return c
	}
	tests := []struct {
		name, column string
		value        val
		want         time.Time
		unusable     error
	}{
		{"timestamptz with a +00 offset", "ts", text("2026-01-02 03:04:05.678901+00"), time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.UTC), nil},
		{"timestamptz with a half-hour offset", "ts", text("2026-01-02 09:34:05+05:30"), time.Date(2026, 1, 2, 4, 4, 5, 0, time.UTC), nil},
		{"timestamp without a zone is UTC, as Debezium reads it", "plain_ts", text("1999-12-31 23:59:59.999"), time.Date(1999, 12, 31, 23, 59, 59, 999000000, time.UTC), nil},
		{"NULL: no timestamp of its own (the commit time is used)", "ts", null, time.Time{}, nil},
		{"infinity has no record timestamp: the failure policy", "ts", text("infinity"), time.Time{}, decoder.ErrInvalidTimestamp},
		{"a date BC neither", "plain_ts", text("0044-03-15 12:00:00 BC"), time.Time{}, decoder.ErrInvalidTimestamp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decoder.New(cfg(tt.column))
			vals := with(sampleRow, tt.column, tt.value, "tracingspancontext", text("traceparent=x"),
				"n", text("7"), "b", text("t"), "f", text("NaN"), "d", text("42.00"), "s", null)
			mustDecode(t, d, relationMsg(outboxOID, "public", "outbox", cols), txBegin())
			ch, err := d.Decode(insertAt, insertMsg(outboxOID, row(cols, vals)))
			if err != nil {
				t.Fatal(err)
			}
			if !errors.Is(ch.Unusable, tt.unusable) || (tt.unusable == nil) != (ch.Unusable == nil) {
				t.Fatalf("Unusable = %v, want %v", ch.Unusable, tt.unusable)
			}
			if !ch.Event.Time.Equal(tt.want) {
				t.Errorf("Time = %s, want %s", ch.Event.Time, tt.want)
			}
			if string(ch.Event.SpanContext) != "traceparent=x" {
				t.Errorf("SpanContext = %q", ch.Event.SpanContext)
			}
			want := []decoder.ValueKind{decoder.KindNumber, decoder.KindBool, decoder.KindNumber, decoder.KindString, decoder.KindString}
			for i, k := range want {
				if ch.Event.ExtraKinds[i] != k {
					t.Errorf("ExtraKinds[%d] = %d, want %d", i, ch.Event.ExtraKinds[i], k)
				}
			}
		})
	}
	// A timestamp column of another type: every row to the failure policy, saying why.
	d := decoder.New(cfg("s"))
	mustDecode(t, d, relationMsg(outboxOID, "public", "outbox", cols), txBegin())
	ch, err := d.Decode(insertAt, insertMsg(outboxOID, row(cols, with(sampleRow, "s", text("2026-01-02")))))
	if err != nil || ch.Unusable == nil || !strings.Contains(ch.Unusable.Error(), "must be timestamp or timestamptz") {
		t.Fatalf("a text timestamp column: %v, %v", err, ch.Unusable)
	}
}

func TestDecodeMessageRouterMembers(t *testing.T) {
	cfg := messagesConfig()
	cfg.Columns.Timestamp, cfg.Columns.TracingSpanContext = "ts", "tracing"
	cfg.Extra = []string{"n", "s"}
	for _, tt := range []struct {
		name, members string
		want          time.Time
		ctx           string
		bad           string
	}{
		{"an RFC 3339 timestamp", `"ts":"2026-01-02T03:04:05.5Z"`, time.Date(2026, 1, 2, 3, 4, 5, 500000000, time.UTC), "", ""},
		{"PostgreSQL's text with an offset", `"ts":"2026-01-02 05:04:05+02"`, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "", ""},
		{"epoch milliseconds", `"ts":1767323045000`, time.UnixMilli(1767323045000).UTC(), "", ""},
		{"a timestamp that is none", `"ts":true`, time.Time{}, "", `"ts" (columns.timestamp)`},
		{"a span context in Properties text", `"tracing":"traceparent=abc"`, time.Time{}, "traceparent=abc", ""},
		{"a span context as an object", `"tracing":{"traceparent":"abc"}`, time.Time{}, `{"traceparent":"abc"}`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := decoder.New(cfg)
			mustDecode(t, d, txBegin())
			ch, err := d.Decode(insertAt, outboxMsg(`{"id":"i","aggregate_type":"t","aggregate_id":"a","n":3,"s":"x",`+tt.members+`}`))
			if err != nil {
				t.Fatal(err)
			}
			if tt.bad != "" {
				if ch.Unusable == nil || !strings.Contains(ch.Unusable.Error(), tt.bad) {
					t.Fatalf("Unusable = %v, want it to name %s", ch.Unusable, tt.bad)
				}
				return
			}
			if ch.Unusable != nil || !ch.Event.Time.Equal(tt.want) || string(ch.Event.SpanContext) != tt.ctx {
				t.Fatalf("Unusable %v, Time %s, SpanContext %q; want %s, %q", ch.Unusable, ch.Event.Time, ch.Event.SpanContext, tt.want, tt.ctx)
			}
			if ch.Event.ExtraKinds[0] != decoder.KindJSON || ch.Event.ExtraKinds[1] != decoder.KindString {
				t.Errorf("ExtraKinds %v: a number member is JSON, a string one a string", ch.Event.ExtraKinds)
			}
		})
	}
}
