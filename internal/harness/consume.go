package harness

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/sink/readcommitted"
)

// Record is one Kafka record read back.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   map[string]string
	Time      time.Time
}

// Header returns a header's value.
func (r Record) Header(name string) string { return r.Headers[name] }

// Consumer reads topics from their beginning, partition by partition, without a consumer group.
type Consumer struct {
	// ReadCommitted reads like a read_committed consumer: up to the last stable offset, without
	// the records of aborted transactions. (Otherwise it reads like kafka-go's Reader, which sees
	// records of open and aborted transactions too.) Set it before the first read.
	ReadCommitted bool

	brokers []string
	topics  []string
	readers map[string]*kafka.Reader // by topic/partition
	next    map[string]int64         // next offset to read, by topic/partition
	// own transport, so connections left broken by a broker restart are not shared with others
	transport *kafka.Transport
	records   []Record
}

// NewConsumer reads the given topics; topics that do not exist yet are picked up when they appear.
func NewConsumer(brokers string, topics ...string) *Consumer {
	return &Consumer{brokers: strings.Split(brokers, ","), topics: topics, readers: make(map[string]*kafka.Reader), next: make(map[string]int64), transport: &kafka.Transport{}}
}

// NewCommittedConsumer is NewConsumer reading like a read_committed consumer.
func NewCommittedConsumer(brokers string, topics ...string) *Consumer {
	c := NewConsumer(brokers, topics...)
	c.ReadCommitted = true
	return c
}

// Close stops the readers.
func (c *Consumer) Close() {
	for _, r := range c.readers {
		r.Close()
	}
}

// Records returns everything read so far, ordered by topic, partition and offset.
func (c *Consumer) Records() []Record { return c.records }

// ReadUntil polls until done(records) is true or ctx ends; it then keeps reading for linger to
// catch duplicates that arrive late.
func (c *Consumer) ReadUntil(ctx context.Context, linger time.Duration, done func([]Record) bool) error {
	var lastErr error
	for {
		// Errors are retried until ctx ends: tests read while brokers restart.
		if err := c.poll(ctx); err != nil {
			lastErr = err
			c.resetTransport()
		}
		if done(c.records) {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("read %d records, condition not met (last error: %v): %w", len(c.records), lastErr, ctx.Err())
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	if linger > 0 {
		lctx, cancel := context.WithTimeout(context.Background(), linger)
		defer cancel()
		for lctx.Err() == nil {
			if err := c.poll(lctx); err != nil {
				c.resetTransport()
			}
			select {
			case <-time.After(200 * time.Millisecond):
			case <-lctx.Done():
			}
		}
	}
	sort.SliceStable(c.records, func(i, j int) bool {
		a, b := c.records[i], c.records[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	return nil
}

// poll reads whatever each partition has up to its current end.
func (c *Consumer) poll(ctx context.Context) error {
	client := &kafka.Client{Addr: kafka.TCP(c.brokers...), Timeout: 10 * time.Second, Transport: c.transport}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: c.topics})
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	// One partition that cannot be read right now (a leader still being elected, a lookup timing
	// out on a loaded machine) must not keep the others from being read.
	var errs []error
	for _, t := range md.Topics {
		if t.Error != nil {
			continue // not created yet
		}
		for _, p := range t.Partitions {
			if err := c.drain(ctx, t.Name, p.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// offsets asks the partition's leader directly for its first and end offsets. (Client.ListOffsets
// goes through the transport's cached cluster layout, which on a loaded machine was seen to time out
// for minutes on partitions of topics created moments before.)
func (c *Consumer) offsets(ctx context.Context, topic string, partition int) (first, end int64, err error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := kafka.DialLeader(dctx, "tcp", c.brokers[0], topic, partition)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn.ReadOffsets()
}

// resetTransport drops the transport's connections and its cached cluster metadata, which can
// hold on to a state from before a topic's partitions had leaders.
func (c *Consumer) resetTransport() {
	c.transport.CloseIdleConnections()
	c.transport = &kafka.Transport{}
}

func (c *Consumer) drain(ctx context.Context, topic string, partition int) error {
	if c.ReadCommitted {
		return c.drainCommitted(ctx, topic, partition)
	}
	first, end, err := c.offsets(ctx, topic, partition)
	if err != nil {
		return fmt.Errorf("offsets of %s/%d: %w", topic, partition, err)
	}
	key := fmt.Sprintf("%s/%d", topic, partition)
	r := c.readers[key]
	if r == nil {
		r = kafka.NewReader(kafka.ReaderConfig{
			Brokers: c.brokers, Topic: topic, Partition: partition,
			MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond,
		})
		if err := r.SetOffset(first); err != nil {
			return err
		}
		c.readers[key] = r
		c.next[key] = first
	}
	for c.next[key] < end {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := r.ReadMessage(rctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return nil
			}
			return fmt.Errorf("read %s: %w", key, err)
		}
		rec := Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value,
			Headers: make(map[string]string, len(m.Headers)), Time: m.Time}
		for _, h := range m.Headers {
			rec.Headers[h.Key] = string(h.Value)
		}
		c.records = append(c.records, rec)
		c.next[key] = m.Offset + 1
	}
	return nil
}

// drainCommitted reads the partition up to its last stable offset, dropping what aborted
// transactions wrote.
func (c *Consumer) drainCommitted(ctx context.Context, topic string, partition int) error {
	key := fmt.Sprintf("%s/%d", topic, partition)
	client := &kafka.Client{Addr: kafka.TCP(c.brokers...), Timeout: 10 * time.Second, Transport: c.transport}
	if _, ok := c.next[key]; !ok {
		first, _, err := c.offsets(ctx, topic, partition)
		if err != nil {
			return fmt.Errorf("offsets of %s: %w", key, err)
		}
		c.next[key] = first
	}
	for {
		res, err := readcommitted.Fetch(ctx, client, topic, partition, c.next[key], 16<<20, 100*time.Millisecond)
		if err != nil {
			return err
		}
		for _, r := range res.Records {
			rec := Record{Topic: topic, Partition: partition, Offset: r.Offset, Key: r.Key, Value: r.Value,
				Headers: make(map[string]string, len(r.Headers)), Time: r.Time}
			for _, h := range r.Headers {
				rec.Headers[h.Key] = string(h.Value)
			}
			c.records = append(c.records, rec)
		}
		if res.Next <= c.next[key] || res.Next >= res.LastStableOffset {
			c.next[key] = max(c.next[key], res.Next)
			return nil
		}
		c.next[key] = res.Next
	}
}
