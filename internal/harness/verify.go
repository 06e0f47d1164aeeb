package harness

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Report is what Verify found.
type Report struct {
	Expected        int
	Received        int // records carrying a known event id
	Missing         int
	Duplicates      int // extra deliveries of an event id
	OrderViolations int // an aggregate's seq n+1 first delivered before seq n
	Mismatches      int // wrong topic, key, value or headers
	Unknown         int // records whose id was never written
	Details         []string
}

func (r *Report) note(format string, args ...any) {
	if len(r.Details) < 20 {
		r.Details = append(r.Details, fmt.Sprintf(format, args...))
	}
}

// String summarises the report on one line, with up to 20 details after it.
func (r Report) String() string {
	s := fmt.Sprintf("expected=%d received=%d missing=%d duplicates=%d order_violations=%d mismatches=%d unknown=%d",
		r.Expected, r.Received, r.Missing, r.Duplicates, r.OrderViolations, r.Mismatches, r.Unknown)
	if len(r.Details) > 0 {
		s += "\n  " + strings.Join(r.Details, "\n  ")
	}
	return s
}

// OK reports no loss, no reordering and no alteration (duplicates are allowed: at-least-once).
func (r Report) OK() bool {
	return r.Missing == 0 && r.OrderViolations == 0 && r.Mismatches == 0 && r.Unknown == 0
}

// TopicFor is the relay's default routing: outbox.event.<aggregate_type>.
func TopicFor(aggregateType string) string { return "outbox.event." + aggregateType }

// Verify compares what was written with what Kafka holds. records must be in topic, partition,
// offset order (Consumer.ReadUntil sorts them).
func Verify(written []Written, records []Record, topicFor func(aggregateType string) string) Report {
	if topicFor == nil {
		topicFor = TopicFor
	}
	rep := Report{Expected: len(written)}
	byID := make(map[string]*Written, len(written))
	for i := range written {
		byID[written[i].ID] = &written[i]
	}
	seen := make(map[string]int, len(written))
	type aggState struct {
		lastSeq   int
		partition string
		delivered map[int]bool
	}
	aggs := make(map[string]*aggState)
	for _, r := range records {
		id := r.Header("id")
		w, ok := byID[id]
		if !ok {
			rep.Unknown++
			rep.note("record %s/%d@%d has unknown id %q", r.Topic, r.Partition, r.Offset, id)
			continue
		}
		rep.Received++
		seen[id]++
		if seen[id] > 1 {
			rep.Duplicates++
		}
		if problem := mismatch(w, r, topicFor); problem != "" {
			rep.Mismatches++
			rep.note("event %s: %s", id, problem)
		}
		agg := w.AggregateType + "/" + w.AggregateID
		st := aggs[agg]
		if st == nil {
			st = &aggState{delivered: make(map[int]bool)}
			aggs[agg] = st
		}
		part := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
		if st.partition != "" && st.partition != part {
			rep.OrderViolations++
			rep.note("aggregate %s in two partitions: %s and %s", agg, st.partition, part)
		}
		st.partition = part
		if st.delivered[w.Seq] {
			continue // a duplicate; order is judged by first deliveries
		}
		st.delivered[w.Seq] = true
		if w.Seq < st.lastSeq {
			rep.OrderViolations++
			rep.note("aggregate %s: seq %d first delivered after seq %d (%s@%d)", agg, w.Seq, st.lastSeq, part, r.Offset)
		}
		st.lastSeq = max(st.lastSeq, w.Seq)
	}
	for i := range written {
		if seen[written[i].ID] == 0 {
			rep.Missing++
			rep.note("event %s (%s/%s seq %d) missing", written[i].ID, written[i].AggregateType, written[i].AggregateID, written[i].Seq)
		}
	}
	return rep
}

func mismatch(w *Written, r Record, topicFor func(string) string) string {
	switch {
	case r.Topic != topicFor(w.AggregateType):
		return fmt.Sprintf("topic %q, want %q", r.Topic, topicFor(w.AggregateType))
	case string(r.Key) != w.AggregateID:
		return fmt.Sprintf("key %q, want %q", r.Key, w.AggregateID)
	case string(r.Value) != w.Payload:
		return fmt.Sprintf("value %.80q, want %.80q", r.Value, w.Payload)
	case r.Header("event_type") != w.EventType:
		return fmt.Sprintf("event_type header %q, want %q", r.Header("event_type"), w.EventType)
	case r.Header("aggregate_type") != w.AggregateType:
		return fmt.Sprintf("aggregate_type header %q, want %q", r.Header("aggregate_type"), w.AggregateType)
	}
	for k, v := range w.Headers {
		if r.Header(k) != v {
			return fmt.Sprintf("header %q = %q, want %q", k, r.Header(k), v)
		}
	}
	var probe json.RawMessage
	if json.Unmarshal(r.Value, &probe) != nil {
		return "value is not JSON"
	}
	return ""
}

// Topics lists the distinct topics the written events route to.
func Topics(written []Written, topicFor func(string) string) []string {
	if topicFor == nil {
		topicFor = TopicFor
	}
	set := make(map[string]bool)
	var out []string
	for _, w := range written {
		if t := topicFor(w.AggregateType); !set[t] {
			set[t] = true
			out = append(out, t)
		}
	}
	return out
}
