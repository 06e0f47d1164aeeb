// Package redrive publishes dead-lettered records to their original topics again, once the cause
// (a topic's size limit, its permissions, a missing topic) is fixed. Each record goes back with its
// original key, value and headers (the outbox.dlq.* headers removed, outbox.redrive=true added),
// partitioned as the relay does, and is then recorded in a ledger: a compacted topic next to the
// dead-letter topic, keyed by the dead letter's partition and offset. A second run skips what the
// ledger holds, so re-running a redrive, or running it over an overlapping range, sends nothing
// twice; a crash between a record's acknowledgement and its ledger entry sends that one record
// again on the next run (consumers deduplicate it by its id, like any redelivery). An entry counts
// only for the event id it records, so a dead-letter topic created again, whose offsets start
// over, is redriven in full. The ledger is in Kafka rather than in the database because the dead
// letters are: what became of each lives beside it, with the same retention and permissions, and
// a redrive needs no database access.
//
// Records of one key go back in dead-letter order. When one fails, the later dead letters of the
// same key are held back in this run, so an aggregate's events never overtake each other.
package redrive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Header marks a redriven record; its value is "true".
const Header = record.HeaderRedrive

// LedgerSuffix names the default ledger topic: the dead-letter topic's name with it appended.
// The relay refuses to route an event there (sink.RedriveLedgerSuffix).
const LedgerSuffix = sink.RedriveLedgerSuffix

// Config says what to redrive and how to reach Kafka.
type Config struct {
	Brokers []string
	// Transport (TLS, SASL and client id; nil for kafka-go's default) and Dialer (for reading;
	// the same TLS and SASL) come from sink.NewClient and sink.NewDialer in the relay's binary,
	// so redrive reaches Kafka exactly as the relay does.
	Transport *kafka.Transport
	Dialer    *kafka.Dialer

	DeadLetterTopic string
	LedgerTopic     string // default DeadLetterTopic + LedgerSuffix

	// Partition limits the run to one partition of the dead-letter topic; -1 for all.
	Partition int
	// FromOffset and ToOffset bound the offsets read in each partition (inclusive); -1 leaves a
	// bound open. The end is the partition's end when the run starts: records dead-lettered
	// during the run wait for the next one.
	FromOffset, ToOffset int64
	// EventIDs, when not empty, limits the run to these events.
	EventIDs []string

	// KeyEncoding is the relay's key_encoding: the dead letter's key is the raw aggregate id, the
	// original record's key is encoded with it.
	KeyEncoding record.Encoding
	// Serializer, when the relay frames records for a schema registry (value_encoding or
	// key_encoding avro), frames what goes back the same way: the key from the raw aggregate id
	// (KeyEncoding is then raw), and a value the dead letter holds unframed (the payload as
	// written: it failed before it was framed, e.g. schema_incompatible) from that payload. A value
	// already framed (sink.HeaderDLQFramed; without it, magic byte 0) goes back as it is.
	Serializer sink.Serializer
	// BuiltinHeaders is the relay's builtin_headers: dead letters always carry id, event_type and
	// aggregate_type, and the ones the original records did not carry are removed.
	BuiltinHeaders []string

	// Route is the relay's routing (topic_template or topic_regex, topic_allow, topic_deny): a
	// dead letter goes back only when its aggregate type routes now to a topic outbox rows may
	// reach, and to the one its header names. Nil sends it to the topic its header names, which
	// must not be reserved.
	Route *record.Options
	// PositionsTopic is the relay's positions_topic. It, the dead-letter and the ledger topics and
	// any name starting with '_' are never a target: a record there is one the relay trusts.
	PositionsTopic string

	WriteTimeout time.Duration // default 10s
	DryRun       bool          // read and report, write nothing
}

// Result is what a run did.
type Result struct {
	Read     int // dead letters in the range (and matching EventIDs)
	Redriven int // published to their original topics in this run
	Already  int // found in the ledger: redriven by an earlier run
	Failed   []Failure
}

// Failure is a dead letter that could not be published again.
type Failure struct {
	Partition int
	Offset    int64
	EventID   string
	Topic     string // the original topic ("" when the dead letter does not name one)
	Err       error
}

func (f Failure) String() string {
	return fmt.Sprintf("%d@%d event %s to %q: %v", f.Partition, f.Offset, f.EventID, f.Topic, f.Err)
}

// ledgerEntry is the value of a ledger record.
type ledgerEntry struct {
	EventID string    `json:"event_id"`
	Topic   string    `json:"topic"`
	At      time.Time `json:"redriven_at"`
}

// Run redrives the dead letters cfg selects and reports each one that still fails.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return Result{}, err
	}
	targets, err := newTargets(cfg)
	if err != nil {
		return Result{}, err
	}
	if !cfg.DryRun {
		if err := ensureLedger(ctx, cfg); err != nil {
			return Result{}, err
		}
	}
	done, err := readLedger(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	r := newRedriver(cfg, targets, done)
	defer r.close()
	if err := scan(ctx, cfg, cfg.DeadLetterTopic, cfg.Partition, cfg.FromOffset, cfg.ToOffset, false, func(m kafka.Message) error {
		return r.redrive(ctx, m)
	}); err != nil {
		return r.res, fmt.Errorf("redrive: %w", err)
	}
	return r.res, nil
}

// withDefaults fills in what cfg leaves to the defaults, and refuses a cfg without brokers or a
// dead-letter topic.
func withDefaults(cfg Config) (Config, error) {
	if cfg.LedgerTopic == "" {
		cfg.LedgerTopic = cfg.DeadLetterTopic + LedgerSuffix
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &kafka.Dialer{Timeout: 10 * time.Second}
	}
	if cfg.Transport == nil {
		// A nil *kafka.Transport in the Writer's and the Client's RoundTripper interface is not
		// nil there, and panics on first use.
		cfg.Transport = &kafka.Transport{}
	}
	if cfg.BuiltinHeaders == nil {
		cfg.BuiltinHeaders = record.BuiltinHeaders
	}
	if len(cfg.Brokers) == 0 || cfg.DeadLetterTopic == "" {
		return cfg, errors.New("redrive: brokers and the dead-letter topic are required")
	}
	return cfg, nil
}

// readLedger returns the event each ledger entry recorded, by the dead letter's position. The
// position alone does not name a dead letter: a dead-letter topic deleted and created again counts
// its offsets from 0 again, so an entry counts only for the event it names.
func readLedger(ctx context.Context, cfg Config) (map[string]string, error) {
	done := make(map[string]string)
	if err := scan(ctx, cfg, cfg.LedgerTopic, -1, -1, -1, true, func(m kafka.Message) error {
		var e ledgerEntry
		if m.Value == nil || json.Unmarshal(m.Value, &e) != nil { // a tombstone undoes an entry
			delete(done, string(m.Key))
		} else {
			done[string(m.Key)] = e.EventID
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("redrive: read the ledger %s: %w", cfg.LedgerTopic, err)
	}
	return done, nil
}

// redriver redrives dead letters one at a time, in dead-letter order, and counts what became of
// each.
type redriver struct {
	cfg     Config
	targets *targets
	done    map[string]string // the ledger: dead letter's position -> event id
	wanted  map[string]bool   // cfg.EventIDs; empty for all
	held    map[string]error  // original topic + key -> the failure holding them back
	// byKey partitions as the relay does and writes the ledger; named sends the records whose
	// event named its own partition.
	byKey, named *kafka.Writer
	res          Result
}

func newRedriver(cfg Config, t *targets, done map[string]string) *redriver {
	r := &redriver{cfg: cfg, targets: t, done: done, wanted: make(map[string]bool, len(cfg.EventIDs)), held: make(map[string]error)}
	for _, id := range cfg.EventIDs {
		r.wanted[id] = true
	}
	writer := func(b kafka.Balancer) *kafka.Writer {
		return &kafka.Writer{
			Addr:         kafka.TCP(cfg.Brokers...),
			Transport:    cfg.Transport,
			Balancer:     b,
			RequiredAcks: kafka.RequireAll,
			MaxAttempts:  3,
			BatchSize:    1,
			WriteTimeout: cfg.WriteTimeout,
		}
	}
	r.byKey = writer(&kafka.Murmur2Balancer{Consistent: true}) // the relay's partitioner (murmur2, as Java's)
	// Events that named their own partition (extra_fields placement partition) go back there, as
	// the relay would have sent them, next to their aggregate's other events.
	r.named = writer(namedPartition{})
	return r
}

func (r *redriver) close() {
	r.byKey.Close()
	r.named.Close()
}

// redrive sends dead letter m back unless it is not selected, already redriven, or cannot go back
// (then it is counted as a failure). An error ends the run: the context ended, or a record went
// back that the ledger could not record.
func (r *redriver) redrive(ctx context.Context, m kafka.Message) error {
	id := headerValue(m, record.HeaderID)
	if len(r.wanted) > 0 && !r.wanted[id] {
		return nil
	}
	r.res.Read++
	ledgerKey := fmt.Sprintf("%s/%d/%d", r.cfg.DeadLetterTopic, m.Partition, m.Offset)
	if recorded, ok := r.done[ledgerKey]; ok && recorded == id {
		r.res.Already++
		return nil
	}
	orig, err := original(m, r.cfg)
	fail := func(err error) {
		r.res.Failed = append(r.res.Failed, Failure{Partition: m.Partition, Offset: m.Offset, EventID: id, Topic: orig.Topic, Err: err})
	}
	if err == nil {
		orig.Topic, err = r.targets.of(m, orig.Topic)
	}
	if err == nil && r.cfg.Serializer != nil {
		var held bool
		if held, err = reframe(ctx, r.cfg.Serializer, m, &orig); held {
			return err // the registry cannot answer: the run stops, nothing more goes back
		}
	}
	if err != nil {
		fail(err)
		return nil
	}
	order := orig.Topic + "\x00" + string(orig.Key)
	if cause, held := r.held[order]; held {
		fail(fmt.Errorf("held back: an earlier dead letter of the same key failed (%v)", cause))
		return nil
	}
	if r.cfg.DryRun {
		return nil
	}
	send := r.byKey
	if p := headerValue(m, sink.HeaderDLQPartition); p != "" {
		if orig.Partition, err = strconv.Atoi(p); err != nil || orig.Partition < 0 {
			fail(fmt.Errorf("header %s is %q, not a partition", sink.HeaderDLQPartition, p))
			return nil
		}
		send = r.named
	}
	if err := send.WriteMessages(ctx, orig); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.held[order] = err
		fail(err)
		return nil
	}
	return r.record(ctx, ledgerKey, id, orig.Topic)
}

// record writes the ledger entry of a dead letter that went back.
func (r *redriver) record(ctx context.Context, ledgerKey, id, topic string) error {
	entry, _ := json.Marshal(ledgerEntry{EventID: id, Topic: topic, At: time.Now().UTC()})
	if err := r.byKey.WriteMessages(ctx, kafka.Message{Topic: r.cfg.LedgerTopic, Key: []byte(ledgerKey), Value: entry}); err != nil {
		// The record is back but not recorded: stop, so the operator learns of it before a
		// re-run publishes it again.
		return fmt.Errorf("event %s is back on %s but could not be recorded in the ledger %s (a re-run publishes it once more): %w",
			id, topic, r.cfg.LedgerTopic, err)
	}
	r.res.Redriven++
	return nil
}

// original rebuilds the record the relay meant to publish.
func original(m kafka.Message, cfg Config) (kafka.Message, error) {
	topic := headerValue(m, sink.HeaderDLQTopic)
	// The event's own timestamp (its commit time, or columns.timestamp), as the relay stamped it.
	out := kafka.Message{Topic: topic, Value: m.Value, Time: m.Time}
	reason := headerValue(m, sink.HeaderDLQReason)
	switch {
	case topic == "":
		return out, fmt.Errorf("the dead letter names no original topic (reason %s): fix the row's aggregate type or the topic_template, then replay the event by id", reason)
	case headerValue(m, "outbox.dlq.payload_bytes") != "":
		return out, errors.New("the dead letter holds a reference, not the payload (it was too large for the dead-letter topic too): replay the event by id from the outbox table")
	case reason == sink.ReasonBadHeaders:
		return out, errors.New("the event's headers were malformed and were not kept: fix the row's headers, then replay the event by id")
	case headerValue(m, sink.HeaderDLQFramed) == "false" && cfg.Serializer == nil:
		// Sent back as it is, a payload would reach a registry-encoded topic unframed.
		return out, errors.New("the dead letter's value was never framed for the schema registry (outbox.dlq.framed: false): redrive with the relay's value_encoding, key_encoding and schema_registry settings, so it goes back framed")
	case reason == sink.ReasonSchemaMismatch && !hasHeader(m, sink.HeaderDLQSubject):
		return out, errors.New("the row lacked a mapped column when it was written, so the event is incomplete: replay it by id once the row is complete")
	case reason == sink.ReasonTopicNotAllowed:
		// The row asked for a topic outbox rows may not reach (a platform's internal topic, the
		// relay's positions): sending it there is what the refusal prevented.
		return out, fmt.Errorf("the event was refused its topic %s, one outbox rows may not reach (topic_allow, topic_deny): it never goes there; fix the row's aggregate type (or topic_allow), then replay the event by id", topic)
	case reason == sink.ReasonInvalidCloudEvent:
		// Its value is the record without its CloudEvents envelope: sent back, consumers that read
		// CloudEvents would get a bare payload.
		return out, errors.New("the event could not be a CloudEvent (its value is the record without the envelope): fix the row or the cloudevents settings, then replay the event by id")
	case reason == sink.ReasonInvalidMessage:
		// Its value is the message's whole content as written, not a payload: sent back, it would
		// reach consumers as a malformed event.
		return out, errors.New("the logical decoding message's content was not an outbox event (its value is the content as written): fix the producer; the event exists only in the WAL and cannot be replayed")
	}
	key := m.Key
	if k := headerValue(m, sink.HeaderDLQKey); k != "" || hasHeader(m, sink.HeaderDLQKey) {
		key = []byte(k)
	}
	out.Key = record.EncodeKey(key, cfg.KeyEncoding)
	builtin := make(map[string]bool, len(cfg.BuiltinHeaders))
	for _, h := range cfg.BuiltinHeaders {
		builtin[h] = true
	}
	for _, h := range m.Headers {
		switch {
		case strings.HasPrefix(h.Key, "outbox.dlq."):
		case (h.Key == record.HeaderEventType || h.Key == record.HeaderAggregateType || h.Key == record.HeaderID) && !builtin[h.Key]:
		default:
			out.Headers = append(out.Headers, h)
		}
	}
	out.Headers = append(out.Headers, kafka.Header{Key: Header, Value: []byte("true")})
	return out, nil
}

// reframe frames orig's key, and its value unless already framed, as the relay frames records. An
// error the Serializer says is the event's (schemas.Permanent) fails this dead letter; any other
// (the registry cannot answer) is held: it ends the run.
func reframe(ctx context.Context, ser sink.Serializer, m kafka.Message, orig *kafka.Message) (held bool, err error) {
	eventType := headerValue(m, record.HeaderEventType)
	value := orig.Value
	framed := len(value) >= 5 && value[0] == 0 // a dead letter older than its header
	if hasHeader(m, sink.HeaderDLQFramed) {
		// Only the sink knows: a payload the application serialized (frame-only) may start with
		// a zero byte too.
		framed = headerValue(m, sink.HeaderDLQFramed) == "true"
	}
	if framed {
		value = nil
	}
	k, v, err := ser.Serialize(ctx, orig.Topic, eventType, orig.Key, value)
	if err != nil {
		if _, ok := schemas.Permanent(err); ok {
			return false, fmt.Errorf("cannot be framed for the schema registry: %w", err)
		}
		return true, fmt.Errorf("schema registry: %w", err)
	}
	orig.Key = k
	if !framed {
		orig.Value = v
	}
	return false, nil
}

func headerValue(m kafka.Message, name string) string {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == name {
			return string(m.Headers[i].Value)
		}
	}
	return ""
}

func hasHeader(m kafka.Message, name string) bool {
	for _, h := range m.Headers {
		if h.Key == name {
			return true
		}
	}
	return false
}

// ensureLedger creates the ledger topic (compacted, one partition) unless it exists.
func ensureLedger(ctx context.Context, cfg Config) error {
	client := &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: cfg.Transport, Timeout: cfg.WriteTimeout}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: cfg.LedgerTopic, NumPartitions: 1, ReplicationFactor: -1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}},
	}}})
	if err != nil {
		return fmt.Errorf("redrive: create the ledger topic %s: %w", cfg.LedgerTopic, err)
	}
	if err := resp.Errors[cfg.LedgerTopic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("redrive: create the ledger topic %s (or create it yourself: compacted, one partition): %w", cfg.LedgerTopic, err)
	}
	return nil
}

// scan reads topic's partitions (or one) from the first offset at or after from up to the end at
// the time of the call (or to, inclusive), in offset order, and hands each record to fn. A missing
// topic is empty when missingOK.
func scan(ctx context.Context, cfg Config, topic string, partition int, from, to int64, missingOK bool, fn func(kafka.Message) error) error {
	addr := cfg.Brokers[0]
	parts, err := cfg.Dialer.LookupPartitions(ctx, "tcp", addr, topic)
	if err != nil {
		if missingOK && errors.Is(err, kafka.UnknownTopicOrPartition) {
			return nil
		}
		return fmt.Errorf("partitions of %s: %w", topic, err)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].ID < parts[j].ID })
	found := false
	for _, p := range parts {
		if partition >= 0 && p.ID != partition {
			continue
		}
		found = true
		if err := scanPartition(ctx, cfg.Dialer, addr, topic, p.ID, from, to, fn); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("topic %s has no partition %d", topic, partition)
	}
	return nil
}

func scanPartition(ctx context.Context, d *kafka.Dialer, addr, topic string, partition int, from, to int64, fn func(kafka.Message) error) error {
	conn, err := d.DialLeader(ctx, "tcp", addr, topic, partition)
	if err != nil {
		return fmt.Errorf("%s/%d: %w", topic, partition, err)
	}
	defer conn.Close()
	first, end, err := conn.ReadOffsets()
	if err != nil {
		return fmt.Errorf("%s/%d: offsets: %w", topic, partition, err)
	}
	if from > first {
		first = from
	}
	if to >= 0 && to+1 < end {
		end = to + 1
	}
	if first >= end {
		return nil
	}
	if _, err := conn.Seek(first, kafka.SeekAbsolute); err != nil {
		return fmt.Errorf("%s/%d: seek to %d: %w", topic, partition, first, err)
	}
	for next := first; next < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		deadline := time.Now().Add(15 * time.Second)
		if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
			deadline = dl
		}
		_ = conn.SetReadDeadline(deadline)
		batch := conn.ReadBatch(1, 16<<20)
		before := next
		for next < end {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			next = m.Offset + 1
			if m.Offset < first {
				continue
			}
			if err := fn(m); err != nil {
				batch.Close()
				return err
			}
		}
		if err := batch.Close(); err != nil && !errors.Is(err, kafka.OffsetOutOfRange) {
			return fmt.Errorf("%s/%d at offset %d: %w", topic, partition, next, err)
		}
		if next == before {
			return fmt.Errorf("%s/%d: no record at or after offset %d, below the end %d", topic, partition, next, end)
		}
	}
	return nil
}

// namedPartition is the balancer of records whose event named its partition: the record's own
// Partition (kafka.Writer leaves partitioning to the balancer).
type namedPartition struct{}

func (namedPartition) Balance(msg kafka.Message, _ ...int) int { return msg.Partition }

// targets decides where a dead letter may go back to.
type targets struct {
	route    *record.Builder // the relay's routing, or nil
	reserved map[string]bool
}

func newTargets(cfg Config) (*targets, error) {
	t := &targets{reserved: map[string]bool{cfg.DeadLetterTopic: true, cfg.LedgerTopic: true}}
	if cfg.PositionsTopic != "" {
		t.reserved[cfg.PositionsTopic] = true
	}
	if cfg.Route != nil {
		o := *cfg.Route
		o.TopicDeny = append(append([]string(nil), o.TopicDeny...), cfg.DeadLetterTopic, cfg.LedgerTopic)
		if cfg.PositionsTopic != "" {
			o.TopicDeny = append(o.TopicDeny, cfg.PositionsTopic)
		}
		b, err := record.NewBuilder(o)
		if err != nil {
			return nil, fmt.Errorf("redrive: the routing: %w", err)
		}
		t.route = b
	}
	return t, nil
}

// of returns the topic dead letter m goes back to, the one it names (named): refused when the
// routing, if any, does not send its aggregate type there now, or when it is reserved.
func (t *targets) of(m kafka.Message, named string) (string, error) {
	if t.route != nil {
		ev := &decoder.Event{ID: []byte(headerValue(m, record.HeaderID)), EventType: []byte(headerValue(m, record.HeaderEventType))}
		if hasHeader(m, record.HeaderAggregateType) {
			ev.AggregateType = []byte(headerValue(m, record.HeaderAggregateType))
		}
		r := t.route.Build(ev, time.Now())
		if r.TopicErr != nil {
			return named, fmt.Errorf("its aggregate type routes to no topic outbox rows may reach under the current routing: %w", r.TopicErr)
		}
		if r.Msg.Topic != named {
			// Most often redrive was not given the relay's routing keys: sending the record where
			// the defaults route it would put it in a topic its consumers do not read.
			return named, fmt.Errorf("its aggregate type routes to %s under the routing redrive was given, not to its original topic %s: give redrive the relay's configuration (topic_template or topic_regex, topic_allow), or replay the event by id if the routing changed", r.Msg.Topic, named)
		}
		return named, nil
	}
	if strings.HasPrefix(named, "_") || t.reserved[named] {
		return named, fmt.Errorf("its original topic %s is reserved (a name starting with '_', the dead-letter, ledger or positions topic): the relay trusts what is written there, so nothing is redriven to it", named)
	}
	return named, nil
}
