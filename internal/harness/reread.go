package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// Reread reads topics again from their first offsets to their current ends, on fresh connections
// to each partition's leader and without kafka-go's Reader: a second, independent look at what is
// in Kafka. A delivery check that finds events missing uses it to tell a consumer that failed to
// read them from a relay that did not publish them.
func Reread(ctx context.Context, brokers string, topics ...string) ([]Record, error) {
	addrs := strings.Split(brokers, ",")
	conn, err := kafka.DialContext(ctx, "tcp", addrs[0])
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var recs []Record
	var errs []error
	for _, topic := range topics {
		parts, err := conn.ReadPartitions(topic)
		if err != nil {
			errs = append(errs, fmt.Errorf("partitions of %s: %w", topic, err))
			continue
		}
		for _, p := range parts {
			got, err := rereadPartition(ctx, addrs[0], topic, p.ID)
			recs = append(recs, got...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return recs, errors.Join(errs...)
}

func rereadPartition(ctx context.Context, broker, topic string, partition int) ([]Record, error) {
	conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, partition)
	if err != nil {
		return nil, fmt.Errorf("leader of %s/%d: %w", topic, partition, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	first, end, err := conn.ReadOffsets()
	if err != nil {
		return nil, fmt.Errorf("offsets of %s/%d: %w", topic, partition, err)
	}
	var recs []Record
	for next := first; next < end; {
		if _, err := conn.Seek(next, kafka.SeekAbsolute); err != nil {
			return recs, fmt.Errorf("seek %s/%d to %d: %w", topic, partition, next, err)
		}
		batch := conn.ReadBatch(1, 16<<20)
		read := 0
		for {
			m, err := batch.ReadMessage()
			if err != nil {
				if !errors.Is(err, io.EOF) && read == 0 {
					batch.Close()
					return recs, fmt.Errorf("read %s/%d at %d: %w", topic, partition, next, err)
				}
				break
			}
			read++
			rec := Record{Topic: topic, Partition: partition, Offset: m.Offset, Key: m.Key, Value: m.Value,
				Headers: make(map[string]string, len(m.Headers)), Time: m.Time}
			for _, h := range m.Headers {
				rec.Headers[h.Key] = string(h.Value)
			}
			recs = append(recs, rec)
			next = m.Offset + 1
		}
		batch.Close()
		if read == 0 {
			return recs, fmt.Errorf("read %s/%d: nothing at offset %d of %d", topic, partition, next, end)
		}
	}
	return recs, nil
}

// Recheck is what a delivery check does when events look missing: it reads the topics again with
// Reread and verifies that. It returns the new report and a line for the test log saying which of
// the two readings to believe.
func Recheck(written []Written, brokers string, first Report) (Report, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recs, err := Reread(ctx, brokers, Topics(written, nil)...)
	rep := Verify(written, recs, nil)
	if err == nil && rep.OK() {
		return rep, fmt.Sprintf("the consumer missed records that an independent re-read found in Kafka (consumer: %s; re-read: %s)", first, rep)
	}
	return rep, fmt.Sprintf("an independent re-read confirms it (re-read error: %v): %s", err, rep)
}
