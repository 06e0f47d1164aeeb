package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// latencyReader reads every partition of the given topics from the beginning, with
// isolation.level=read_committed, as records arrive and computes, for each, receive time minus the sent_ns in its payload. Writer and reader run in this
// process, so both times come from the same clock.
type latencyReader struct {
	readers []*kafka.Reader
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu        sync.Mutex
	warm      int
	latencies []time.Duration
	bad       int // records without a parsable sent_ns
}

func newLatencyReader(brokers string, topics []string, partitions int) *latencyReader {
	ctx, cancel := context.WithCancel(context.Background())
	l := &latencyReader{cancel: cancel}
	for _, t := range topics {
		for p := range partitions {
			r := kafka.NewReader(kafka.ReaderConfig{
				Brokers: []string{brokers}, Topic: t, Partition: p,
				// Fetches return as soon as one record is there; MaxWait only bounds an idle fetch.
				MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond,
				ReadLagInterval: -1,
				// A record is received once its Kafka transaction has committed (exactly-once);
				// the same as read_uncommitted for the other sides. (kafka-go would also return
				// aborted records, but no side aborts a transaction here.)
				IsolationLevel: kafka.ReadCommitted,
			})
			l.readers = append(l.readers, r)
			l.wg.Go(func() { l.read(ctx, r) })
		}
	}
	return l
}

func (l *latencyReader) read(ctx context.Context, r *kafka.Reader) {
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		now := time.Now().UnixNano()
		sent, warm, ok := parseSent(m.Value)
		l.mu.Lock()
		switch {
		case !ok:
			l.bad++
		case warm:
			l.warm++
		default:
			l.latencies = append(l.latencies, time.Duration(now-sent))
		}
		l.mu.Unlock()
	}
}

// parseSent finds "sent_ns" and "warm" in a payload as PostgreSQL prints jsonb.
func parseSent(v []byte) (sent int64, warm, ok bool) {
	key := []byte(`"sent_ns": `)
	i := bytes.Index(v, key)
	if i < 0 {
		return 0, false, false
	}
	rest := v[i+len(key):]
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	sent, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	if err != nil {
		return 0, false, false
	}
	return sent, bytes.Contains(v, []byte(`"warm": true`)), true
}

// counts returns warm-up records, measured records and unparsable records seen so far.
func (l *latencyReader) counts() (warm, measured, bad int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.warm, len(l.latencies), l.bad
}

// total is every record read so far: with read_committed, what committed transactions hold, not
// counting their markers (which end offsets do).
func (l *latencyReader) total() int64 {
	warm, measured, bad := l.counts()
	return int64(warm + measured + bad)
}

// waitFor polls until cond holds or timeout passes.
func (l *latencyReader) waitFor(ctx context.Context, timeout time.Duration, cond func(warm, measured int) bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		warm, measured, _ := l.counts()
		if cond(warm, measured) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (l *latencyReader) close() {
	l.cancel()
	l.wg.Wait()
	for _, r := range l.readers {
		r.Close()
	}
}

// percentiles of the measured latencies (nearest rank).
func (l *latencyReader) percentiles(ps ...float64) []time.Duration {
	l.mu.Lock()
	sorted := slices.Clone(l.latencies)
	l.mu.Unlock()
	return percentiles(sorted, ps...)
}

func percentiles(d []time.Duration, ps ...float64) []time.Duration {
	out := make([]time.Duration, len(ps))
	if len(d) == 0 {
		return out
	}
	slices.Sort(d)
	for i, p := range ps {
		rank := int(math.Ceil(p/100*float64(len(d)))) - 1
		out[i] = d[min(max(rank, 0), len(d)-1)]
	}
	return out
}
