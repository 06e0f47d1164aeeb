package decoder

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ErrInvalidTimestamp marks an event whose timestamp column (Columns.Timestamp) holds a value that
// is no Kafka record timestamp (infinity, a date BC): Change.Unusable wraps it, and the event goes
// to the failure policy.
var ErrInvalidTimestamp = errors.New("invalid timestamp")

// ParseTimestamp reads a timestamp column's text form as PostgreSQL writes it with DateStyle ISO
// (the replication connection sets it): timestamptz with its offset ("2026-01-02 15:04:05.123456+00",
// "+05:30"), timestamp without one, read as UTC (as Debezium reads a timestamp column for
// table.field.event.timestamp). infinity, -infinity and dates BC have no Kafka timestamp: an error.
func ParseTimestamp(text []byte, withZone bool) (time.Time, error) {
	s := string(text)
	if bytes.HasSuffix(text, []byte(" BC")) || s == "infinity" || s == "-infinity" {
		return time.Time{}, fmt.Errorf("%w: %q has no Kafka record timestamp", ErrInvalidTimestamp, s)
	}
	layouts := []string{"2006-01-02 15:04:05.999999999"}
	if withZone {
		layouts = []string{"2006-01-02 15:04:05.999999999-07", "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999-07:00:00"}
	}
	for _, l := range layouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: %q is not in PostgreSQL's ISO format", ErrInvalidTimestamp, s)
}

// parseMessageTimestamp reads a message's timestamp member: a JSON string in RFC 3339 or in
// PostgreSQL's ISO format (with or without an offset; without one it is UTC), or a JSON integer of
// milliseconds since the Unix epoch.
func parseMessageTimestamp(raw []byte) (time.Time, error) {
	if len(raw) > 0 && raw[0] != '"' {
		ms, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil {
			return time.Time{}, errors.New("must be a string or an integer of milliseconds since the epoch")
		}
		return time.UnixMilli(ms).UTC(), nil
	}
	text, _, err := jsonText(raw)
	if err != nil {
		return time.Time{}, err
	}
	if t, err := time.Parse(time.RFC3339Nano, string(text)); err == nil {
		return t.UTC(), nil
	}
	if t, err := ParseTimestamp(text, true); err == nil {
		return t, nil
	}
	return ParseTimestamp(text, false)
}
