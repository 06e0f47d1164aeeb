package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// The options of Debezium's outbox event router (io.debezium.transforms.outbox.EventRouter, 3.x)
// that shape a record beyond topic, key, value and headers: regex routing
// (route.topic.regex/route.topic.replacement), additional fields in the envelope or as the
// partition (table.fields.additional.placement), tombstones for empty payloads
// (route.tombstone.on.empty.payload), the record timestamp (table.field.event.timestamp) and the
// trace context (tracingspancontext). Each follows the router's code, with the differences
// docs/migrating-from-debezium.md names.

// Placement says where an extra column goes (Debezium's table.fields.additional.placement).
type Placement uint8

const (
	PlaceHeader       Placement = iota // a header named by Options.ExtraHeaders, left out when NULL (the default)
	PlaceEnvelope                      // a member of the value's envelope object, named by Options.ExtraHeaders
	PlacePartition                     // the record's partition: an integer column
	PlaceHeaderOrNull                  // a header, with a null value when NULL (Debezium's header placement)
)

// DefaultTopicReplacement is Debezium's route.topic.replacement.
const DefaultTopicReplacement = "outbox.event.${routedByValue}"

// regexRouter routes like Debezium's EventRouter with route.topic.regex: the aggregate type is the
// routed-by value; when the expression matches all of it, the topic is the replacement with the
// expression's groups expanded; when it does not, the event is refused, or with passthrough the
// aggregate type itself is the topic (Kafka Connect's RegexRouter leaves a topic it does not match
// alone; a row then chooses its topic, within the allowed ones).
type regexRouter struct {
	re          *regexp.Regexp
	replacement string
	passthrough bool
}

// NewTopicRegex checks a route.topic.regex-style expression and replacement: Go syntax, where
// (?<name>...) and (?P<name>...) name a group and $name, ${name}, $1 and ${1} refer to one (Java's
// \$ for a literal dollar is $$ here).
func NewTopicRegex(expr, replacement string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(`^(?:` + expr + `)$`)
	if err != nil {
		return nil, fmt.Errorf("topic regex %q: %w", expr, err)
	}
	names := re.SubexpNames()
	for _, ref := range regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*|[0-9]+)\}?`).FindAllStringSubmatch(strings.ReplaceAll(replacement, "$$", ""), -1) {
		if n, err := strconv.Atoi(ref[1]); err == nil {
			if n > re.NumSubexp() {
				return nil, fmt.Errorf("topic replacement %q refers to group %d, and topic regex %q has %d", replacement, n, expr, re.NumSubexp())
			}
			continue
		}
		found := false
		for _, name := range names {
			found = found || name == ref[1]
		}
		if !found {
			return nil, fmt.Errorf("topic replacement %q refers to group %q, which topic regex %q does not name (write (?<%s>...))", replacement, ref[1], expr, ref[1])
		}
	}
	return re, nil
}

// route returns the topic for value; ok is false when the expression does not match and the value
// does not pass through (the value is then returned as the name the event asked for).
func (r *regexRouter) route(value string) (topic string, ok bool) {
	m := r.re.FindStringSubmatchIndex(value)
	if m == nil {
		return value, r.passthrough
	}
	return string(r.re.ExpandString(nil, r.replacement, value, m)), true
}

// blank reports whether a payload counts as empty for route.tombstone.on.empty.payload: NULL, or
// nothing but whitespace (Java's String.trim().isEmpty(): code points up to U+0020).
func blank(payload []byte) bool {
	for _, c := range payload {
		if c > ' ' {
			return false
		}
	}
	return true
}

// recordTime is the record timestamp: the event's own (table.field.event.timestamp), else the
// commit time, so that a record published again after a crash keeps its timestamp; only an event
// without either (never from the stream) gets the time it is handed to the producer.
func recordTime(ev *decoder.Event, now time.Time) time.Time {
	switch {
	case !ev.Time.IsZero():
		return ev.Time
	case !ev.Tx.CommitTime.IsZero():
		return ev.Tx.CommitTime
	}
	return now
}

// partitionOf returns the partition an extra column names (PlacePartition), or -1 when none does
// or its value is NULL (the key's partition, as Debezium leaves a null partition to the producer).
func (b *Builder) partitionOf(ev *decoder.Event) (int, error) {
	for i, p := range b.o.ExtraPlacement {
		if p != PlacePartition || i >= len(ev.Extra) || ev.Extra[i] == nil {
			continue
		}
		n, err := strconv.ParseInt(string(ev.Extra[i]), 10, 32)
		if err != nil || n < 0 {
			return -1, fmt.Errorf("partition column %s is %.40q, not a partition number", b.o.ExtraHeaders[i], ev.Extra[i])
		}
		return int(n), nil
	}
	return -1, nil
}

// HasEnvelope reports whether any extra column goes into the value's envelope.
func (o Options) HasEnvelope() bool {
	for _, p := range o.ExtraPlacement {
		if p == PlaceEnvelope {
			return true
		}
	}
	return false
}

// envelope builds the value Debezium's router builds when a column is placed in the envelope: a
// JSON object with the payload as "payload" and each envelope column under its alias, in the
// configured order (JsonConverter with schemas.enable=false writes it compactly, in that order).
// The payload is a JSON string of its text (value_encoding json-string: Debezium's default for a
// jsonb column), or expanded as Debezium's table.expand.json.payload expands it (raw or
// json-expanded: a JSON object as Connect data, anything else a string). A column value is a
// number, a boolean or a string by its column type (decoder.Event.ExtraKinds).
func (b *Builder) envelope(ev *decoder.Event) []byte {
	out := make([]byte, 0, len(ev.Payload)+64)
	out = append(out, `{"payload":`...)
	switch {
	case ev.Payload == nil:
		out = append(out, "null"...)
	case b.o.ValueEncoding == JSONString:
		out = appendJSONString(out, validUTF8(ev.Payload))
	default:
		out = append(out, expandedValue(ev.Payload, b.o.PayloadField)...)
	}
	for i, p := range b.o.ExtraPlacement {
		if p != PlaceEnvelope {
			continue
		}
		out = append(out, ',')
		out = appendJSONString(out, []byte(b.o.ExtraHeaders[i]))
		out = append(out, ':')
		var v []byte
		kind := decoder.KindString
		if i < len(ev.Extra) {
			v = ev.Extra[i]
		}
		if i < len(ev.ExtraKinds) {
			kind = ev.ExtraKinds[i]
		}
		out = appendJSONValue(out, v, kind)
	}
	return append(out, '}')
}

// appendJSONValue writes a column value as the JSON value of its kind; NULL is null, and a value
// its kind cannot hold (a float's NaN) is a string.
func appendJSONValue(b, v []byte, kind decoder.ValueKind) []byte {
	switch {
	case v == nil:
		return append(b, "null"...)
	case kind == decoder.KindBool && (string(v) == "t" || string(v) == "f"):
		if v[0] == 't' {
			return append(b, "true"...)
		}
		return append(b, "false"...)
	case (kind == decoder.KindNumber || kind == decoder.KindJSON) && json.Valid(v):
		return append(b, v...)
	}
	return appendJSONString(b, validUTF8(v))
}

// validUTF8 replaces invalid UTF-8 (a bytea payload's bytes, say) so the JSON stays valid.
func validUTF8(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	return bytes.ToValidUTF8(b, []byte("\uFFFD"))
}

// traceHeaders adds the W3C traceparent and tracestate of the event's tracing span context column
// (Debezium's tracingspancontext) to hs, unless hs has them already (a traceparent header member
// or column wins: it is the event's own). The column holds Java Properties text, as Debezium's
// tracing writes it, or (in a logical decoding message) a JSON object; a traceparent that is not
// valid W3C is left out, as the W3C recommendation says, and takes its tracestate with it.
func traceHeaders(hs []kafka.Header, spanContext []byte) []kafka.Header {
	if len(spanContext) == 0 {
		return hs
	}
	for _, h := range hs {
		if h.Key == "traceparent" {
			return hs
		}
	}
	var props map[string]string
	if spanContext[0] == '{' {
		var obj map[string]any
		if json.Unmarshal(spanContext, &obj) == nil {
			props = make(map[string]string, len(obj))
			for k, v := range obj {
				if s, ok := v.(string); ok {
					props[k] = s
				}
			}
		}
	} else {
		props = parseProperties(string(spanContext))
	}
	tp := props["traceparent"]
	if !validTraceparent(tp) {
		return hs
	}
	hs = append(hs, kafka.Header{Key: "traceparent", Value: []byte(tp)})
	if ts := props["tracestate"]; ts != "" {
		hs = append(hs, kafka.Header{Key: "tracestate", Value: []byte(ts)})
	}
	return hs
}

// validTraceparent accepts a version-00 W3C traceparent with non-zero ids in lower-case hex.
func validTraceparent(s string) bool {
	if len(s) != 55 || s[:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return false
	}
	hex := func(x string) bool {
		zero := true
		for i := 0; i < len(x); i++ {
			c := x[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
			zero = zero && c == '0'
		}
		return !zero
	}
	return hex(s[3:35]) && hex(s[36:52]) && (hex(s[53:]) || s[53:] == "00")
}

// parseProperties reads java.util.Properties text (Properties.load): lines of key=value, key:value
// or key value; # and ! start comments; a backslash escapes the next character (\t \n \r \f and
// \uXXXX decoded), and one at the end of a line continues it on the next.
func parseProperties(text string) map[string]string {
	out := make(map[string]string)
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n") {
		line = strings.TrimLeft(line, " \t\f")
		if cur.Len() == 0 && (line == "" || line[0] == '#' || line[0] == '!') {
			continue
		}
		// An odd number of trailing backslashes continues the line.
		n := len(line) - len(strings.TrimRight(line, `\`))
		if n%2 == 1 {
			cur.WriteString(line[:len(line)-1])
			continue
		}
		cur.WriteString(line)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		logical = append(logical, cur.String())
	}
	for _, l := range logical {
		key, value := splitProperty(l)
		out[unescapeProperty(key)] = unescapeProperty(value)
	}
	return out
}

// splitProperty splits a logical line at its first unescaped '=', ':' or whitespace.
func splitProperty(l string) (key, value string) {
	for i := 0; i < len(l); i++ {
		switch c := l[i]; c {
		case '\\':
			i++
		case '=', ':', ' ', '\t', '\f':
			rest := strings.TrimLeft(l[i+1:], " \t\f")
			if c == ' ' || c == '\t' || c == '\f' {
				if len(rest) > 0 && (rest[0] == '=' || rest[0] == ':') {
					rest = strings.TrimLeft(rest[1:], " \t\f")
				}
			}
			return l[:i], rest
		}
	}
	return l, ""
}

func unescapeProperty(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch c := s[i]; c {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+4 < len(s) {
				if r, err := strconv.ParseUint(s[i+1:i+5], 16, 32); err == nil {
					b.WriteRune(rune(r))
					i += 4
					continue
				}
			}
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
