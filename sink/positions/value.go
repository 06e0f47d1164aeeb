package positions

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// positionValue is the JSON form of a Position.
type positionValue struct {
	V         int    `json:"v"`
	SystemID  string `json:"system_identifier,omitempty"`
	Timeline  uint32 `json:"timeline,omitempty"`
	CommitLSN string `json:"commit_lsn"`
	Events    int    `json:"events"`
	// Written is where the records of the position's Kafka transaction lie: the offsets of its
	// first and last record in each partition it wrote. A start checks that they were committed
	// (producer.Committer.Settle). Readers that predate it ignore it.
	Written []writtenValue `json:"written,omitempty"`
}

type writtenValue struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	First     int64  `json:"first"`
	Last      int64  `json:"last"`
}

// Encode is the value of p's record, with where its transaction's records lie (spans not known
// are left out; nil for none).
func Encode(p Position, written map[producer.TopicPartition]producer.Span) []byte {
	v := positionValue{V: 1, CommitLSN: p.CommitLSN.String(), Events: p.Events}
	if p.SystemID != "" && p.Timeline != 0 {
		v.V, v.SystemID, v.Timeline = 2, p.SystemID, p.Timeline
	}
	for tp, sp := range written {
		if sp.Known() {
			v.Written = append(v.Written, writtenValue{Topic: tp.Topic, Partition: tp.Partition, First: sp.First, Last: sp.Last})
		}
	}
	slices.SortFunc(v.Written, func(a, b writtenValue) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	b, _ := json.Marshal(v)
	return b
}

// Decode reads a position record's value, and where its transaction's records lie (nil when the
// value does not say).
func Decode(b []byte) (Position, map[producer.TopicPartition]producer.Span, error) {
	pos, v, err := decodeValue(b)
	if err != nil {
		return Position{}, nil, err
	}
	var written map[producer.TopicPartition]producer.Span
	for _, w := range v.Written {
		if w.First < 0 || w.Last < w.First {
			return Position{}, nil, fmt.Errorf("position record %.80q: bad offsets written in %s/%d", b, w.Topic, w.Partition)
		}
		if written == nil {
			written = make(map[producer.TopicPartition]producer.Span, len(v.Written))
		}
		written[producer.TopicPartition{Topic: w.Topic, Partition: w.Partition}] = producer.Span{First: w.First, Last: w.Last}
	}
	return pos, written, nil
}

// decodeValue reads the versions this relay knows, 1 (no origin) and 2.
func decodeValue(b []byte) (Position, positionValue, error) {
	var v positionValue
	if err := json.Unmarshal(b, &v); err != nil {
		return Position{}, v, fmt.Errorf("position record %.80q: %w", b, err)
	}
	switch v.V {
	case 1:
		v.SystemID, v.Timeline = "", 0 // written before positions carried their origin
	case 2:
		if v.SystemID == "" || v.Timeline == 0 {
			return Position{}, v, fmt.Errorf("position record %.80q: version 2 without system_identifier or timeline", b)
		}
	default:
		return Position{}, v, fmt.Errorf("position record of version %d; this relay reads versions 1 and 2 (a newer relay wrote it?)", v.V)
	}
	lsn, err := pglogrepl.ParseLSN(v.CommitLSN)
	if err != nil || v.Events < 0 {
		return Position{}, v, fmt.Errorf("position record %.80q: bad commit_lsn or events", b)
	}
	return Position{CommitLSN: lsn, Events: v.Events, SystemID: v.SystemID, Timeline: v.Timeline}, v, nil
}
