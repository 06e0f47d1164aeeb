package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// Scan reads every record topic holds when it is called, partition by partition in offset order,
// and hands each to fn without keeping it: for topics too large for Consumer, which keeps
// everything. fn gets kafka-go's message as it is (no header map) because it may run millions of
// times. It returns how many records it read.
func Scan(ctx context.Context, brokers, topic string, fn func(kafka.Message) error) (int, error) {
	addr := strings.Split(brokers, ",")[0]
	conn, err := kafka.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", topic, err)
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		return 0, fmt.Errorf("scan %s: partitions: %w", topic, err)
	}
	n := 0
	for _, p := range parts {
		read, err := scanPartition(ctx, addr, topic, p.ID, fn)
		n += read
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func scanPartition(ctx context.Context, addr, topic string, partition int, fn func(kafka.Message) error) (int, error) {
	conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, partition)
	if err != nil {
		return 0, fmt.Errorf("scan %s/%d: %w", topic, partition, err)
	}
	defer func() { conn.Close() }()
	first, last, err := conn.ReadOffsets()
	if err != nil {
		return 0, fmt.Errorf("scan %s/%d: offsets: %w", topic, partition, err)
	}
	if _, err := conn.Seek(first, kafka.SeekAbsolute); err != nil {
		return 0, fmt.Errorf("scan %s/%d: seek: %w", topic, partition, err)
	}
	n, timeouts := 0, 0
	for next := first; next < last; {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		batch := conn.ReadBatch(1, 8<<20)
		for {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			if err := fn(m); err != nil {
				batch.Close()
				return n, err
			}
			n++
			next = m.Offset + 1
		}
		err := batch.Close()
		var nerr net.Error
		switch {
		case err == nil || errors.Is(err, kafka.OffsetOutOfRange):
			timeouts = 0
		case errors.As(err, &nerr) && nerr.Timeout() && timeouts < 5:
			// A broker slowed by a loaded machine: read on from where we are on a new connection,
			// so a slow fetch is not reported as a missing event.
			timeouts++
			conn.Close()
			if conn, err = kafka.DialLeader(ctx, "tcp", addr, topic, partition); err != nil {
				return n, fmt.Errorf("scan %s/%d: %w", topic, partition, err)
			}
			if _, err := conn.Seek(next, kafka.SeekAbsolute); err != nil {
				return n, fmt.Errorf("scan %s/%d: seek: %w", topic, partition, err)
			}
		default:
			return n, fmt.Errorf("scan %s/%d at offset %d: %w", topic, partition, next, err)
		}
	}
	return n, nil
}

// DuplicatesWithin fails when the report counts more duplicate deliveries than bound, the
// at-least-once window the relay promises.
func (r Report) DuplicatesWithin(bound int) error {
	if r.Duplicates > bound {
		return fmt.Errorf("%d duplicate deliveries exceed the window of %d", r.Duplicates, bound)
	}
	return nil
}
