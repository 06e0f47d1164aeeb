package inbox

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// CloudEvents content modes (the Kafka protocol binding's), as CloudEvent.Mode names them.
const (
	CloudEventsStructured = "structured"
	CloudEventsBinary     = "binary"
)

// CloudEvent is a record's CloudEvents 1.0 attributes and data, read as the Kafka protocol
// binding says: a content-type header starting with application/cloudevents is a structured
// event (the JSON format: application/cloudevents+json), and a record with the required
// attributes as ce_ headers is a binary one. The relay writes both (envelope: cloudevents), and
// so does any CloudEvents SDK.
type CloudEvent struct {
	Mode            string // CloudEventsStructured or CloudEventsBinary
	ID              string
	Source          string
	SpecVersion     string
	Type            string
	Subject         string    // "" when none
	Time            time.Time // zero when none
	DataContentType string    // "" when none (JSON, in the structured mode)
	// Extensions are the other attributes: strings, or the JSON text of other values.
	Extensions map[string]string
	// Data is the event's data: the JSON value of a structured event's data (unquoted when the
	// content type is not JSON and the value a string), its data_base64 decoded, or a binary
	// event's record value. Nil when the event has none.
	Data []byte
}

// ParseCloudEvent reads m as a CloudEvent; it returns nil and no error for a record that is none
// (no CloudEvents content type, no ce_ headers).
func ParseCloudEvent(m kafka.Message) (*CloudEvent, error) {
	ct, _ := header(m, "content-type")
	if len(ct) >= len("application/cloudevents") && strings.EqualFold(ct[:len("application/cloudevents")], "application/cloudevents") {
		return parseStructured(m, ct)
	}
	if _, ok := header(m, "ce_specversion"); !ok {
		return nil, nil
	}
	return parseBinary(m, ct)
}

// parseBinary reads the ce_ headers: the attributes, and content-type as datacontenttype.
func parseBinary(m kafka.Message, contentType string) (*CloudEvent, error) {
	ce := &CloudEvent{Mode: CloudEventsBinary, DataContentType: contentType, Data: m.Value}
	for _, h := range m.Headers {
		name, ok := strings.CutPrefix(strings.ToLower(h.Key), "ce_")
		if !ok {
			continue
		}
		v := string(h.Value)
		switch name {
		case "id":
			ce.ID = v
		case "source":
			ce.Source = v
		case "specversion":
			ce.SpecVersion = v
		case "type":
			ce.Type = v
		case "subject":
			ce.Subject = v
		case "time":
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return nil, fmt.Errorf("inbox: message %s/%d@%d: header ce_time %q is not an RFC 3339 time", m.Topic, m.Partition, m.Offset, v)
			}
			ce.Time = t
		default:
			if ce.Extensions == nil {
				ce.Extensions = make(map[string]string)
			}
			ce.Extensions[name] = v
		}
	}
	return ce, ce.check(m)
}

// parseStructured reads a structured event in the JSON format.
func parseStructured(m kafka.Message, contentType string) (*CloudEvent, error) {
	where := fmt.Sprintf("inbox: message %s/%d@%d", m.Topic, m.Partition, m.Offset)
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil || !strings.EqualFold(mediaType, "application/cloudevents+json") {
		return nil, fmt.Errorf("%s: content-type %q is a CloudEvents format other than JSON (application/cloudevents+json), which the inbox does not read", where, contentType)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(m.Value, &members); err != nil {
		return nil, fmt.Errorf("%s: a structured CloudEvent that is not a JSON object: %w", where, err)
	}
	ce := &CloudEvent{Mode: CloudEventsStructured}
	str := func(name string) (string, error) {
		raw, ok := members[name]
		if !ok || string(raw) == "null" {
			return "", nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%s: CloudEvents attribute %s is %s, not a string", where, name, raw)
		}
		return s, nil
	}
	for _, a := range []struct {
		name string
		dst  *string
	}{{"id", &ce.ID}, {"source", &ce.Source}, {"specversion", &ce.SpecVersion}, {"type", &ce.Type},
		{"subject", &ce.Subject}, {"datacontenttype", &ce.DataContentType}} {
		if *a.dst, err = str(a.name); err != nil {
			return nil, err
		}
	}
	t, err := str("time")
	if err != nil {
		return nil, err
	}
	if t != "" {
		if ce.Time, err = time.Parse(time.RFC3339Nano, t); err != nil {
			return nil, fmt.Errorf("%s: CloudEvents attribute time %q is not an RFC 3339 time", where, t)
		}
	}
	if raw, ok := members["data_base64"]; ok && string(raw) != "null" {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%s: data_base64 is %.40s, not a string", where, raw)
		}
		if ce.Data, err = base64.StdEncoding.DecodeString(s); err != nil {
			return nil, fmt.Errorf("%s: data_base64 is not base64: %w", where, err)
		}
	} else if raw, ok := members["data"]; ok {
		ce.Data = []byte(raw)
		if !jsonMediaType(ce.DataContentType) && len(raw) > 0 && raw[0] == '"' {
			// The JSON format: data that is not JSON travels as a JSON string of its text.
			var s string
			if err := json.Unmarshal(raw, &s); err == nil {
				ce.Data = []byte(s)
			}
		}
	}
	for name, raw := range members {
		switch name {
		case "id", "source", "specversion", "type", "subject", "datacontenttype", "time", "data", "data_base64":
			continue
		}
		if ce.Extensions == nil {
			ce.Extensions = make(map[string]string)
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			ce.Extensions[name] = s
		} else {
			ce.Extensions[name] = string(bytes.TrimSpace(raw))
		}
	}
	return ce, ce.check(m)
}

// check applies the specification's requirements: id, source and type non-empty, spec version 1.
func (ce *CloudEvent) check(m kafka.Message) error {
	if ce.SpecVersion != "1.0" {
		return fmt.Errorf("inbox: message %s/%d@%d: CloudEvents specversion %q, want 1.0", m.Topic, m.Partition, m.Offset, ce.SpecVersion)
	}
	if ce.ID == "" || ce.Source == "" || ce.Type == "" {
		return fmt.Errorf("inbox: message %s/%d@%d: a %s CloudEvent without its id, source or type (%q, %q, %q)", m.Topic, m.Partition, m.Offset, ce.Mode, ce.ID, ce.Source, ce.Type)
	}
	return nil
}

// jsonMediaType reports whether a datacontenttype is JSON: none (JSON by default in the JSON
// format), application/json, text/json or a +json suffix.
func jsonMediaType(ct string) bool {
	if ct == "" {
		return true
	}
	t, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	t = strings.ToLower(t)
	return t == "application/json" || t == "text/json" || strings.HasSuffix(t, "+json")
}
