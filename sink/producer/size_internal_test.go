package producer

import (
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
)

func TestRecordSize(t *testing.T) {
	msg := func(key, value int, hdrs ...int) *kafka.Message {
		m := &kafka.Message{Key: make([]byte, key), Value: make([]byte, value)}
		for i, n := range hdrs {
			m.Headers = append(m.Headers, kafka.Header{Key: strings.Repeat("k", i+1), Value: make([]byte, n)})
		}
		return m
	}
	tests := []struct {
		name          string
		smaller, more *kafka.Message
	}{
		{"a longer value is bigger", msg(10, 100), msg(10, 101)},
		{"a longer key is bigger", msg(10, 100), msg(11, 100)},
		{"another header is bigger", msg(10, 100, 5), msg(10, 100, 5, 0)},
		{"a longer header value is bigger", msg(10, 100, 5), msg(10, 100, 6)},
		{"an empty record is smaller than any other", msg(0, 0), msg(0, 1)},
		{"a megabyte value is bigger than a megabyte minus one", msg(36, 1<<20-1, 2, 8), msg(36, 1<<20, 2, 8)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := RecordSize(tt.smaller), RecordSize(tt.more)
			if a >= b {
				t.Fatalf("recordSize = %d then %d, want strictly growing", a, b)
			}
			for _, m := range []*kafka.Message{tt.smaller, tt.more} {
				n := len(m.Key) + len(m.Value)
				for _, h := range m.Headers {
					n += len(h.Key) + len(h.Value)
				}
				if got := RecordSize(m); got < n {
					t.Fatalf("recordSize = %d, less than the %d bytes of key, value and headers", got, n)
				}
			}
		})
	}
}
