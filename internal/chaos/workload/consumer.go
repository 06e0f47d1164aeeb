package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// How the consumer follows the cluster's layout.
const (
	metadataEvery   = 5 * time.Second        // a layout that works is re-read this often anyway
	missingEvery    = 500 * time.Millisecond // while a topic does not exist yet
	consumerBackoff = 2 * time.Second        // the longest pause between failed attempts
)

// Consumer reads every partition of its topics from the start, continuously, without a consumer
// group, and records each record once. It survives broker stops, restarts and freezes: it keeps
// the next offset of each partition and resumes there on a new connection.
type Consumer struct {
	name, isolation string
	brokers         []string
	topics          []string
	cancel          context.CancelFunc
	done            chan struct{}

	mu      sync.Mutex
	reads   []history.Read
	ids     map[string]bool
	next    map[topicPartition]int64 // only the reading goroutine writes it
	changed chan struct{}            // closed and replaced when something was read
	lastErr error
	failed  int // attempts that failed (each dropped the connections), for Failures
}

type topicPartition struct {
	topic     string
	partition int
}

// StartConsumer starts reading topics from brokers (comma-separated) with isolation
// history.ReadCommitted or history.ReadUncommitted; topics that do not exist yet are read once
// they do. It reads until Stop or ctx ends.
func StartConsumer(ctx context.Context, name, brokers, isolation string, topics []string) *Consumer {
	if isolation != history.ReadCommitted && isolation != history.ReadUncommitted {
		panic(fmt.Sprintf("workload: isolation %q: want %q or %q", isolation, history.ReadCommitted, history.ReadUncommitted))
	}
	c := &Consumer{
		name: name, isolation: isolation, brokers: strings.Split(brokers, ","), topics: slices.Clone(topics),
		done: make(chan struct{}), ids: make(map[string]bool), next: make(map[topicPartition]int64),
		changed: make(chan struct{}),
	}
	ctx, c.cancel = context.WithCancel(ctx)
	go func() {
		defer close(c.done)
		c.run(ctx)
	}()
	return c
}

// Name is the consumer's name, as its reads record it.
func (c *Consumer) Name() string { return c.name }

// Isolation is history.ReadCommitted or history.ReadUncommitted.
func (c *Consumer) Isolation() string { return c.isolation }

// Delivered returns how many distinct event ids were read so far.
func (c *Consumer) Delivered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

// Failures returns how many attempts to read have failed so far (each one dropped the consumer's
// connections and paused before the next), and the last one's error: what a test waits for to know
// the consumer noticed a broker that stopped or went silent.
func (c *Consumer) Failures() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed, c.lastErr
}

// WaitFor returns once every id in ids has been read and then quiet has passed (so that late
// duplicates are recorded too), or when ctx ends: then with an error naming how many are missing.
func (c *Consumer) WaitFor(ctx context.Context, ids map[string]bool, quiet time.Duration) error {
	return c.Drain(ctx, ids, quiet, 0)
}

// Drain is WaitFor that also gives up once stall passes with no new event read (0: never): a
// source still working through a backlog is waited for as long as it makes progress, one that
// stopped is not.
func (c *Consumer) Drain(ctx context.Context, ids map[string]bool, quiet, stall time.Duration) error {
	var stalled <-chan time.Time // nil, never ready, without a stall bound
	var timer *time.Timer
	if stall > 0 {
		timer = time.NewTimer(stall)
		defer timer.Stop()
		stalled = timer.C
	}
	for {
		missing, ch, lastErr := c.missing(ids)
		if missing == 0 {
			_ = sleep(ctx, quiet)
			return nil
		}
		select {
		case <-ch:
			if timer != nil {
				timer.Reset(stall)
			}
		case <-stalled:
			return fmt.Errorf("workload: consumer %s: %d of %d events not read, and nothing new for %s (last error: %v)", c.name, missing, len(ids), stall, lastErr)
		case <-ctx.Done():
			return fmt.Errorf("workload: consumer %s: %d of %d events not read (last error: %v): %w", c.name, missing, len(ids), lastErr, ctx.Err())
		}
	}
}

// missing counts the ids not read yet; ch is closed when something new is read.
func (c *Consumer) missing(ids map[string]bool) (n int, ch chan struct{}, lastErr error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range ids {
		if !c.ids[id] {
			n++
		}
	}
	return n, c.changed, c.lastErr
}

// Stop stops reading and returns every record read, in read order.
func (c *Consumer) Stop() []history.Read {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.reads)
}

// run is the reading loop: it refreshes the layout, fetches each leader's partitions, and on any
// failure drops its connections and tries again after a pause.
func (c *Consumer) run(ctx context.Context) {
	var (
		conns    = make(map[string]*brokerConn) // by broker address
		leaders  map[topicPartition]string
		metaAt   time.Time
		complete bool // every topic was in the last metadata
		pause    time.Duration
		rotate   int
	)
	defer func() {
		for _, b := range conns {
			b.close()
		}
	}()
	fail := func(err error) {
		c.mu.Lock()
		c.lastErr = err
		c.failed++
		c.mu.Unlock()
		for addr, b := range conns {
			b.close()
			delete(conns, addr)
		}
		metaAt = time.Time{}
		pause = min(max(2*pause, 100*time.Millisecond), consumerBackoff)
		_ = sleep(ctx, pause)
	}
	for ctx.Err() == nil {
		if since := time.Since(metaAt); leaders == nil || since > metadataEvery || (!complete && since > missingEvery) {
			l, all, err := c.layout(ctx)
			if err != nil {
				fail(err)
				continue
			}
			leaders, complete, metaAt = l, all, time.Now()
			for tp := range leaders {
				if _, ok := c.next[tp]; !ok {
					c.next[tp] = 0
				}
			}
		}
		if len(leaders) == 0 {
			_ = sleep(ctx, missingEvery)
			continue
		}
		byLeader := make(map[string][]partitionFetch)
		for tp, addr := range leaders {
			byLeader[addr] = append(byLeader[addr], partitionFetch{tp.topic, tp.partition, c.next[tp]})
		}
		rotate++
		var failed error
		for addr, parts := range byLeader {
			// Rotated, so that every partition is first in turn: only the first one with data is
			// sure to get a batch larger than partitionBytes.
			slices.SortFunc(parts, func(a, b partitionFetch) int {
				return strings.Compare(a.topic+"/"+strconv.Itoa(a.partition), b.topic+"/"+strconv.Itoa(b.partition))
			})
			k := rotate % len(parts)
			parts = append(parts[k:], parts[:k]...)
			if err := c.fetchFrom(ctx, conns, addr, parts); err != nil {
				failed = err
				break
			}
		}
		if failed != nil {
			if ctx.Err() == nil {
				fail(failed)
			}
			continue
		}
		pause = 0
	}
}

// fetchFrom fetches parts from the broker at addr once and records what came back.
func (c *Consumer) fetchFrom(ctx context.Context, conns map[string]*brokerConn, addr string, parts []partitionFetch) error {
	b := conns[addr]
	if b == nil {
		var err error
		if b, err = dialBroker(ctx, addr); err != nil {
			return fmt.Errorf("dial %s: %w", addr, err)
		}
		conns[addr] = b
	}
	isolation := int8(0)
	if c.isolation == history.ReadCommitted {
		isolation = 1
	}
	results, err := b.fetch(ctx, isolation, parts)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range results {
		tp := topicPartition{r.topic, r.partition}
		switch {
		case r.err == kafka.OffsetOutOfRange && c.next[tp] == 0 && r.logStartOffset > 0:
			// Records before the log start are gone (retention): reading from the start means from there.
			c.next[tp] = r.logStartOffset
			continue
		case r.err != 0:
			errs = append(errs, fmt.Errorf("%s/%d at %d: %w", r.topic, r.partition, c.next[tp], r.err))
			continue
		}
		c.add(tp, r)
	}
	return errors.Join(errs...)
}

// add records r's records and moves tp's next offset past them.
func (c *Consumer) add(tp topicPartition, r partitionResult) {
	if r.next <= c.next[tp] {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range r.records {
		read := history.Read{
			Consumer: c.name, Isolation: c.isolation, Topic: tp.topic, Partition: tp.partition,
			Offset: f.offset, Key: string(f.key), Seq: seqOf(f.value), Appended: f.time,
			Hash: ContentHash(f.value, f.headers),
		}
		for _, h := range f.headers {
			if h.Key == "id" {
				read.EventID = string(h.Value)
			}
		}
		c.reads = append(c.reads, read)
		if read.EventID != "" {
			c.ids[read.EventID] = true
		}
	}
	c.next[tp] = r.next
	if len(r.records) > 0 {
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// seqOf is the payload's "seq" member; 0 when there is none.
func seqOf(value []byte) int {
	var p struct {
		Seq int `json:"seq"`
	}
	if json.Unmarshal(value, &p) != nil {
		return 0
	}
	return p.Seq
}

// layout reads which broker leads each partition of the topics; complete says whether every
// topic exists.
func (c *Consumer) layout(ctx context.Context) (map[topicPartition]string, bool, error) {
	mctx, cancel := context.WithTimeout(ctx, connectTimeout+fetchIOSlack)
	defer cancel()
	// A transport of its own each time: a broker restart leaves a shared one holding dead
	// connections and a stale view of the cluster.
	transport := &kafka.Transport{DialTimeout: connectTimeout, MetadataTTL: time.Second}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(c.brokers...), Transport: transport, Timeout: connectTimeout + fetchIOSlack}
	md, err := client.Metadata(mctx, &kafka.MetadataRequest{Topics: c.topics})
	if err != nil {
		return nil, false, fmt.Errorf("metadata: %w", err)
	}
	out := make(map[topicPartition]string)
	complete := len(md.Topics) == len(c.topics)
	for _, t := range md.Topics {
		if t.Error != nil {
			complete = false
			continue // not created yet
		}
		for _, p := range t.Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				complete = false
				continue
			}
			out[topicPartition{t.Name, p.ID}] = net.JoinHostPort(p.Leader.Host, strconv.Itoa(p.Leader.Port))
		}
	}
	return out, complete, nil
}

// CreateTopics creates topics (replication factor 1) with message.timestamp.type=LogAppendTime,
// so that a record's timestamp is when the broker appended it; topics that exist are left as they
// are. It returns once every partition has a leader.
func CreateTopics(ctx context.Context, brokers string, topics []string, partitions int) error {
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(brokers, ",")...), Timeout: 30 * time.Second}
	req := &kafka.CreateTopicsRequest{}
	for _, t := range topics {
		// The brokers' default.replication.factor: 3 with three brokers.
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: t, NumPartitions: partitions, ReplicationFactor: -1,
			ConfigEntries: []kafka.ConfigEntry{{ConfigName: "message.timestamp.type", ConfigValue: "LogAppendTime"}}})
	}
	resp, err := client.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("workload: create topics: %w", err)
	}
	for t, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("workload: create topic %s: %w", t, err)
		}
	}
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if err == nil && led(md, len(topics)) {
			return nil
		}
		if sleep(ctx, 50*time.Millisecond) != nil {
			return fmt.Errorf("workload: create topics: partitions without a leader: %w", ctx.Err())
		}
	}
}

func led(md *kafka.MetadataResponse, topics int) bool {
	if len(md.Topics) != topics {
		return false
	}
	for _, t := range md.Topics {
		if t.Error != nil || len(t.Partitions) == 0 {
			return false
		}
		for _, p := range t.Partitions {
			if p.Leader.Host == "" || p.Error != nil {
				return false
			}
		}
	}
	return true
}
