package sink

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/readcommitted"
	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// The positions topic holds, per transactional id (the record key), the Position each committed
// Kafka transaction reached, written inside that transaction: a read_committed reader of the
// latest record of the key learns exactly how far the committed events go. The value is JSON with
// a version, so it can grow:
//
//	{"v":2,"system_identifier":"7714668250760685997","timeline":2,"commit_lsn":"0/1A2B3C8","events":12}
//
// commit_lsn is the commit LSN of the PostgreSQL transaction of the last committed event, events
// how many events of that transaction (by decoder.Event.Index) are committed; system_identifier
// and timeline are the server that transaction was streamed from, since an LSN names another
// transaction on another timeline (a promoted standby that was behind reuses LSNs the old primary
// had passed) or another database cluster. Version 1 had no origin: it is still read, with an
// unknown origin (SystemID "" and Timeline 0), and the relay decides what such a position may
// skip (relay/origin.go). Version 2 is written only with the origin known; a position whose events
// carry none (not from a replication session) is written as version 1. The topic is compacted:
// only the latest record per key matters.

// Position is how far the events committed in Kafka reach, in WAL stream order.
type Position struct {
	// CommitLSN is the commit LSN (decoder.TxInfo.CommitLSN) of the PostgreSQL transaction of the
	// last committed event.
	CommitLSN pglogrepl.LSN
	// Events is how many events of that transaction (by decoder.Event.Index) are committed.
	Events int
	// SystemID and Timeline are the server the transaction at CommitLSN was streamed from (its
	// database cluster and WAL history): CommitLSN means something only there and on timelines
	// that descend from that one below the point where they forked. "" and 0 when unknown: a
	// position of version 1, written before positions carried their origin.
	SystemID string
	Timeline uint32
}

// Covers reports whether the event with index of the transaction committed at commitLSN is
// already committed in Kafka at p: a replay skips it.
func (p Position) Covers(commitLSN pglogrepl.LSN, index int) bool {
	return commitLSN < p.CommitLSN || (commitLSN == p.CommitLSN && index < p.Events)
}

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

func encodePosition(p Position) []byte { return encodePositionWritten(p, nil) }

// encodePositionWritten encodes p with where its transaction's records lie (spans not known are
// left out).
func encodePositionWritten(p Position, written map[producer.TopicPartition]producer.Span) []byte {
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

func decodePosition(b []byte) (Position, error) {
	pos, _, err := decodePositionWritten(b)
	return pos, err
}

// decodePositionWritten decodes a position record and where its transaction's records lie.
func decodePositionWritten(b []byte) (Position, map[producer.TopicPartition]producer.Span, error) {
	pos, v, err := decodePositionValue(b)
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

func decodePositionValue(b []byte) (Position, positionValue, error) {
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

// positionsTopicConfig is what the relay creates a missing positions topic with. Compaction keeps
// the latest position per key; it can only clean closed segments, so segments roll hourly (and
// small): that keeps the topic, and the backward read of ReadPosition, short.
var positionsTopicConfig = []kafka.ConfigEntry{
	{ConfigName: "cleanup.policy", ConfigValue: "compact"},
	{ConfigName: "segment.ms", ConfigValue: "3600000"},
	{ConfigName: "segment.bytes", ConfigValue: "16777216"},
}

// positionsPartition returns the partition of the positions topic that holds key (murmur2, as a
// Java producer would place it), creating the topic, compacted, when it is missing. created is
// true when this call created it (so it holds no position yet).
func positionsPartition(ctx context.Context, client *kafka.Client, topic, key string, log *zap.Logger) (partition int, created bool, err error) {
	for attempt := 0; ; attempt++ {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 {
			t := md.Topics[0]
			switch {
			case t.Error == nil && len(t.Partitions) > 0:
				return int((producer.Murmur2([]byte(key)) & 0x7fffffff) % uint32(len(t.Partitions))), created, nil
			case t.Error == nil || errors.Is(t.Error, kafka.LeaderNotAvailable):
				err = kafka.LeaderNotAvailable // just created: no partitions yet
			case errors.Is(t.Error, kafka.UnknownTopicOrPartition):
				if created {
					err = t.Error // created, not yet known to the broker answering
					break
				}
				if cerr := createPositionsTopic(ctx, client, topic); cerr != nil {
					if ctx.Err() != nil || !retriableCreate(cerr) {
						return 0, false, cerr
					}
					err = cerr // a timeout, a controller moving, the network: try again
					break
				}
				log.Info("created the positions topic (compacted)", zap.String("topic", topic))
				created = true
				continue
			case errors.Is(t.Error, kafka.TopicAuthorizationFailed):
				return 0, false, fmt.Errorf("sink: the relay may not use positions topic %s: %w (grant its principal READ, WRITE and DESCRIBE on it, or set positions_topic)", topic, t.Error)
			default:
				err = t.Error
			}
		}
		if err == nil {
			err = errors.New("metadata does not list the topic")
		}
		if werr := producer.Wait(ctx, attempt, log, "positions topic not available yet; retrying", err); werr != nil {
			return 0, false, fmt.Errorf("sink: positions topic %s: %w", topic, werr)
		}
	}
}

// retriableCreate reports whether creating the positions topic may succeed if tried again: a
// refusal the broker calls temporary (a request timed out, the controller moved, a quota), or no
// answer at all (the connection, a timeout); any other refusal needs an operator.
func retriableCreate(err error) bool {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		return kerr.Temporary()
	}
	return true
}

func createPositionsTopic(ctx context.Context, client *kafka.Client, topic string) error {
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: -1, ConfigEntries: positionsTopicConfig,
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	switch {
	case err == nil, errors.Is(err, kafka.TopicAlreadyExists):
		return nil
	case errors.Is(err, kafka.TopicAuthorizationFailed), errors.Is(err, kafka.ClusterAuthorizationFailed):
		return fmt.Errorf("sink: positions topic %s does not exist and the relay may not create it: %w "+
			"(create it with cleanup.policy=compact, or set positions_topic to one that exists)", topic, err)
	}
	return fmt.Errorf("sink: positions topic %s does not exist and creating it failed: %w "+
		"(create it with cleanup.policy=compact, or set positions_topic to one that exists)", topic, err)
}

// checkPositionsTopic refuses a positions topic that deletes records by time or size (one that
// existed before the relay, created by an operator or the brokers' auto-creation): a relay quiet
// for longer than its retention would find no position at its next start. It warns, without
// refusing, when one lost disk can lose the latest position: a single replica, or
// min.insync.replicas 1, which lets acks=all be answered by one replica. A principal that may not
// describe the topic's configuration, or a broker that does not answer, leaves it unchecked, with
// a warning: the check protects against a mistake, and must not refuse a relay that works.
func checkPositionsTopic(ctx context.Context, client *kafka.Client, topic string, log *zap.Logger) error {
	var policy, minISR string
	for attempt := 0; ; attempt++ {
		res, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"cleanup.policy", "min.insync.replicas"},
		}}})
		if err == nil && len(res.Resources) != 1 {
			err = errors.New("describe configs: the answer does not hold the topic")
		}
		if err == nil {
			err = res.Resources[0].Error
		}
		if err == nil {
			for _, e := range res.Resources[0].ConfigEntries {
				switch e.ConfigName {
				case "cleanup.policy":
					policy = e.ConfigValue
				case "min.insync.replicas":
					minISR = e.ConfigValue
				}
			}
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("sink: positions topic %s: %w", topic, ctx.Err())
		}
		if authError(err) || attempt >= 4 {
			log.Warn("cannot read the positions topic's configuration, so it is not checked; it must have cleanup.policy=compact "+
				"(grant the relay's principal DescribeConfigs on it to have it checked)", zap.String("topic", topic), zap.Error(err))
			return nil
		}
		if werr := producer.Wait(ctx, attempt, log, "retrying reading the positions topic's configuration", err); werr != nil {
			return fmt.Errorf("sink: positions topic %s: %w", topic, werr)
		}
	}
	if policy != "compact" {
		return fmt.Errorf("sink: positions topic %s has cleanup.policy %s: it deletes old records, so a relay that commits nothing for its retention "+
			"loses its position. Make it compacted: kafka-configs --bootstrap-server <broker> --alter --entity-type topics --entity-name %s "+
			"--add-config cleanup.policy=compact (or set positions_topic to a new name: the relay creates it compacted)", topic, policy, topic)
	}
	replicas := 0
	if md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}}); err == nil && len(md.Topics) == 1 {
		for _, p := range md.Topics[0].Partitions {
			if replicas == 0 || len(p.Replicas) < replicas {
				replicas = len(p.Replicas)
			}
		}
	}
	isr, _ := strconv.Atoi(minISR)
	switch {
	case replicas == 1:
		log.Warn("the positions topic has replication factor 1: losing that broker's disk loses every relay's position, and "+
			"exactly-once then stops at the next start until duplicates are accepted; give it at least 3 replicas "+
			"(kafka-reassign-partitions) where the cluster has them", zap.String("topic", topic), zap.Int("replication_factor", replicas))
	case replicas > 1 && isr > 0 && isr < 2:
		log.Warn("the positions topic has min.insync.replicas "+minISR+": a position acknowledged by one replica is lost with that "+
			"replica's disk; set min.insync.replicas=2 on it (kafka-configs --alter --add-config min.insync.replicas=2)",
			zap.String("topic", topic), zap.Int("replication_factor", replicas), zap.Int("min_insync_replicas", isr))
	}
	return nil
}

// positionChunk is how many offsets ReadPosition reads at a time, from the end backwards, and
// positionFetchBytes what one fetch of them asks for. A fetch returns whole batches from its offset
// on, up to its size, whatever offset the chunk ends at: sized for a chunk of position records
// (one small record per Kafka transaction, about a hundred bytes), the read back to a
// partition's start costs about what the partition holds. A full MB per chunk made a relay's first
// start (no position of its own among other relays') read and hold twenty times that.
const (
	positionChunk      = 512
	positionFetchBytes = 64 << 10
)

// ReadPosition returns the last committed position for cfg.Transactions.ID (read_committed);
// ok is false when none was ever committed. It creates the positions topic (compacted) when it is
// missing. It reads backwards from the partition's last stable offset in chunks, so a long-lived
// partition is not scanned from its start.
//
// A relay must read its position only after its sink has fenced earlier producers (WaitReady, or
// Sink.ReadPosition): a paused old producer could otherwise still commit after the read.
func ReadPosition(ctx context.Context, cfg Config) (pos Position, ok bool, err error) {
	cfg.setDefaults()
	if cfg.Transactions == nil {
		return Position{}, false, errors.New("sink: ReadPosition needs exactly-once delivery (Config.Transactions)")
	}
	if len(cfg.Brokers) == 0 {
		return Position{}, false, errors.New("sink: no Kafka brokers configured")
	}
	client, transport := newClient(cfg, cfg.WriteTimeout)
	defer transport.CloseIdleConnections()
	return readPosition(ctx, client, cfg.Transactions.PositionsTopic, cfg.Transactions.ID, stableWait(cfg.Transactions.Timeout), zap.NewNop())
}

// stableWait is how long a read of the position waits for other producers' transactions open in
// the positions partition (waitStable) before it says so: relays sharing the topic normally share
// the transaction timeout, and the coordinator aborts a transaction older than it at its next sweep
// (transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by default); the rest is
// margin for a loaded broker.
func stableWait(timeout time.Duration) time.Duration { return timeout + 30*time.Second }

func readPosition(ctx context.Context, client *kafka.Client, topic, key string, bound time.Duration, log *zap.Logger) (Position, bool, error) {
	pos, _, found, err := readPositionWritten(ctx, client, topic, key, bound, log)
	return pos, found, err
}

// readPositionWritten is readPosition, with where the position's Kafka transaction wrote its
// records (nil when the position does not say).
func readPositionWritten(ctx context.Context, client *kafka.Client, topic, key string, bound time.Duration, log *zap.Logger) (Position, map[producer.TopicPartition]producer.Span, bool, error) {
	partition, created, err := positionsPartition(ctx, client, topic, key, log)
	if err != nil || created {
		return Position{}, nil, false, err
	}
	first, stable, err := waitStable(ctx, client, topic, partition, bound, log)
	if err != nil {
		return Position{}, nil, false, err
	}
	var forged *readcommitted.Record // the latest record of the key the relay cannot have written
	defer func() {
		if forged != nil {
			log.Error("exactly-once: ignored a record in the positions topic keyed by this relay's transactional id that was not written in a Kafka transaction, "+
				"so not by the relay (a redriven dead letter, a console producer): it would have made the relay skip events; the relay resumes from the last position it committed itself. "+
				"Find who writes to the positions topic and take that right away (only the relay's principal needs Write on it)",
				zap.String("positions_topic", topic), zap.Int("partition", partition), zap.Int64("offset", forged.Offset),
				zap.Int64("producer_id", forged.ProducerID), zap.String("transactional_id", key))
		}
	}()
	for end := stable; end > first; {
		from := max(first, end-positionChunk)
		var found *readcommitted.Record
		for at := from; at < end; {
			res, err := readcommitted.Fetch(ctx, client, topic, partition, at, positionFetchBytes, 100*time.Millisecond)
			if err != nil {
				return Position{}, nil, false, fmt.Errorf("sink: reading positions topic %s: %w", topic, err)
			}
			for i := range res.Records {
				r := &res.Records[i]
				if r.Offset >= end || string(r.Key) != key {
					continue
				}
				// The relay writes its positions inside its Kafka transactions only: a value
				// outside one is somebody else's, and trusted it would skip events for good. A
				// tombstone from anyone is taken (deleting a position skips nothing: the start
				// then checks the slot ledger).
				if r.Value != nil && !r.Transactional {
					if forged == nil || r.Offset > forged.Offset {
						f := *r
						forged = &f
					}
					continue
				}
				found = r
			}
			if res.Next <= at {
				break // nothing more below the last stable offset
			}
			at = res.Next
		}
		if found != nil {
			if found.Value == nil {
				return Position{}, nil, false, nil // a tombstone: the position was deleted on purpose
			}
			pos, written, err := decodePositionWritten(found.Value)
			if err != nil {
				return Position{}, nil, false, fmt.Errorf("sink: positions topic %s, offset %d: %w", topic, found.Offset, err)
			}
			return pos, written, true, nil
		}
		end = from
	}
	return Position{}, nil, false, nil
}

// waitStable returns the partition's first offset and a last stable offset that has reached the
// high watermark the partition had when it was called: everything written before then is decided
// (committed or aborted), so the backward read from it sees the last position this transactional
// id committed.
//
// Every relay shares the positions topic (one partition by default), and a read_committed read
// ends at the last stable offset: the first offset of the oldest transaction still open in the
// partition, whoever's it is. Fencing (InitProducerID) ends only this transactional id's own
// transaction; another relay killed or paused between writing its position and committing leaves
// its transaction open until the coordinator aborts it, and the positions this relay committed
// above it stay hidden meanwhile: reading then would return an older position (its events would be
// published again, duplicates a read_committed consumer sees) or none (a refused start). So the
// read waits for the transactions open at its start to end, which takes at most the other
// producer's transaction.timeout.ms. Reading above the last stable offset instead (read_uncommitted,
// deciding each record by its producer's commit or abort marker) would not wait, but it would
// redo the broker's read_committed bookkeeping here, where a mistake repeats or skips events; a
// wait that only a dead relay's open transaction makes long is the safer trade.
//
// The high watermark is taken once: live relays keep opening transactions, so the last stable
// offset may never catch up with a moving high watermark, but it always passes a fixed one. Past
// bound the read fails with an error that names the partition and the likely cause; the relay
// says so and tries again.
func waitStable(ctx context.Context, client *kafka.Client, topic string, partition int, bound time.Duration, log *zap.Logger) (first, stable int64, err error) {
	var high int64
	for attempt := 0; ; attempt++ {
		if high, err = producer.HighWatermark(ctx, client, topic, partition); err == nil {
			break
		}
		if werr := producer.Wait(ctx, attempt, log, "retrying reading the positions topic", err); werr != nil {
			return 0, 0, fmt.Errorf("sink: positions topic %s: %w", topic, werr)
		}
	}
	start := time.Now()
	delay := 50 * time.Millisecond
	logged := false
	for attempt := 0; ; attempt++ {
		first, stable, err = producer.Offsets(ctx, client, topic, partition)
		switch {
		case err != nil:
			if werr := producer.Wait(ctx, attempt, log, "retrying reading the positions topic", err); werr != nil {
				return 0, 0, fmt.Errorf("sink: positions topic %s: %w", topic, werr)
			}
			continue
		case stable >= high:
			return first, stable, nil
		case time.Since(start) >= bound:
			return 0, 0, fmt.Errorf("sink: positions topic %s partition %d: its last stable offset stayed at %d, below the high watermark %d, for %s: another producer's open transaction in the partition holds it down (most likely another relay sharing the positions topic, killed or paused between writing its position and committing; Kafka aborts it once it is older than that producer's transaction.timeout.ms, 60 s for a relay). The position this relay committed may lie above it, so it is not read until that transaction ends; if it never does, look for a paused relay, or give each relay its own positions_topic",
				topic, partition, stable, high, bound.Round(time.Second))
		}
		if !logged {
			logged = true
			log.Info("waiting for a transaction open in the positions partition to end before reading the committed position (another relay's, until its transaction timeout at most)",
				zap.String("positions_topic", topic), zap.Int("partition", partition), zap.Int64("last_stable_offset", stable), zap.Int64("high_watermark", high))
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("sink: positions topic %s partition %d: waiting for another producer's open transaction to end (last stable offset %d, high watermark %d) before reading the position: %w",
				topic, partition, stable, high, ctx.Err())
		}
		delay = min(2*delay, time.Second)
	}
}

// positionsWriter writes the position record of each Kafka transaction.
type positionsWriter struct {
	e         *exactlyOnce
	topic, id string // the positions topic; the transactional id, the records' key

	mu    sync.Mutex
	tp    producer.TopicPartition
	ready bool
	ps    producer.State // the next position record's; only the committer uses it once ready
}

// partition returns the positions partition once resolved.
func (w *positionsWriter) partition() (producer.TopicPartition, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tp, w.ready
}

// resolve learns the positions partition (creating the topic if it is missing) and the producer
// state it starts from.
func (w *positionsWriter) resolve(ctx context.Context) error {
	if _, ready := w.partition(); ready {
		return nil
	}
	s := w.e.s
	partition, _, err := positionsPartition(ctx, s.client, w.topic, w.id, s.log)
	if err != nil {
		return err
	}
	if err := checkPositionsTopic(ctx, s.client, w.topic, s.log); err != nil {
		return err
	}
	ps, err := s.ident.Get(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	if !w.ready {
		w.tp, w.ps, w.ready = producer.TopicPartition{Topic: w.topic, Partition: partition}, ps, true
	}
	w.mu.Unlock()
	return nil
}

// write produces pos, inside the current transaction, retrying in place what heals, and returns
// the record's offset (-1 if the broker did not say). written is where the transaction's records
// lie, kept with the position for the next start to check (Sink.settle). Only the committer calls
// it.
func (w *positionsWriter) write(ctx context.Context, pos Position, written map[producer.TopicPartition]producer.Span) (int64, error) {
	s := w.e.s
	if err := w.resolve(ctx); err != nil {
		return -1, err
	}
	if err := w.e.c.Add(ctx, w.tp); err != nil {
		if errors.Is(err, producer.ErrTopicRefused) {
			return -1, positionsRefused(w.tp.Topic, err)
		}
		return -1, err
	}
	now := time.Now()
	rec := &producer.Record{Msg: kafka.Message{Topic: w.tp.Topic, Partition: w.tp.Partition, Key: []byte(w.id), Value: encodePositionWritten(pos, written), Time: now}}
	rec.Size = int64(producer.RecordSize(&rec.Msg))
	ps := w.ps
	for attempt := 0; ; attempt++ {
		err := s.main.Produce(w.tp, []*producer.Record{rec}, ps)
		if err == nil || errors.Is(err, kafka.DuplicateSequenceNumber) {
			w.ps.Seq = producer.NextSequence(ps.Seq, 1)
			return rec.Offset, nil
		}
		if errors.Is(err, kafka.TopicAuthorizationFailed) {
			return -1, positionsRefused(w.tp.Topic, err)
		}
		if producer.Permanent(err) || producer.SequenceLost(err) || producer.ProducerRefused(err) || producer.TransactionFailed(err) {
			return -1, fmt.Errorf("write the position to %s: %w", w.tp.Topic, err)
		}
		delay := producer.Backoff(attempt)
		s.retrying(w.tp.Topic, w.tp.Partition, 1, err, delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return -1, ctx.Err()
		}
	}
}

// commitOwnOpen commits what this producer may have left open in the positions partition: a
// position whose commit marker was lost holds the partition's last stable offset down until this
// producer's next transaction there, and a start waits for it (waitStable). Call it after fencing.
func (e *exactlyOnce) commitOwnOpen(ctx context.Context) error {
	if err := e.positions.resolve(ctx); err != nil {
		return err
	}
	tp, _ := e.positions.partition()
	if err := e.c.CommitOpen(ctx, tp); err != nil {
		return fmt.Errorf("positions topic %w", err)
	}
	return nil
}

// ReadPosition is the package's ReadPosition for this sink's transactional id, after fencing
// every earlier producer with it (InitProducerID): nothing can commit past the position returned.
// It also settles what a lost commit marker left behind (markers.go): this producer's records left
// open are committed, and a position whose records were discarded is returned as the zero
// position, which skips nothing.
func (s *Sink) ReadPosition(ctx context.Context) (Position, bool, error) {
	if s.txn == nil {
		return Position{}, false, errors.New("sink: ReadPosition needs exactly-once delivery (Config.Transactions)")
	}
	if _, err := s.ident.Get(ctx); err != nil {
		return Position{}, false, err
	}
	// What an earlier producer left is settled once, before this sink's first transaction: later
	// reads (the relay reads again after each reconnect to PostgreSQL) come while this sink's own
	// transactions may be open, which an empty commit would commit half-written.
	settle := !s.txn.settled.Load()
	if settle {
		// A commit marker lost at the positions partition leaves the last position open there,
		// and the read below would wait for it.
		if err := s.txn.commitOwnOpen(ctx); err != nil {
			return Position{}, false, fmt.Errorf("sink: commit what this producer left open in the positions topic: %w", err)
		}
	}
	pos, written, found, err := readPositionWritten(ctx, s.client, s.cfg.Transactions.PositionsTopic, s.cfg.Transactions.ID, s.txn.stableWait, s.log)
	if err != nil || !settle {
		return pos, found, err
	}
	trusted := true
	if found {
		if trusted, err = s.txn.c.Settle(ctx, written); err != nil {
			return Position{}, false, fmt.Errorf("sink: check the Kafka transaction of the committed position: %w", err)
		}
	}
	s.txn.settled.Store(true)
	if !trusted {
		// Found, but covering events Kafka does not hold: the zero position skips nothing.
		return Position{}, true, nil
	}
	return pos, found, nil
}

// Committed returns the position of the last Kafka transaction this sink committed; ok is false
// before the first one (and in at-least-once mode).
func (s *Sink) Committed() (pos Position, ok bool) {
	if s.txn == nil {
		return Position{}, false
	}
	return s.txn.committed()
}

// positionsRefused is the error of a positions topic the relay may not write (errPositionsRefused),
// naming the Kafka error without the event topics' wording of err.
func positionsRefused(topic string, err error) error {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		err = kerr
	}
	return fmt.Errorf("%w (topic %s: %v); grant the relay's principal Write, Describe and Read on positions_topic %s", errPositionsRefused, topic, err, topic)
}
