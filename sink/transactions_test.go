package sink_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// pgStream makes events the way the decoder does: runs of `size` events share a PostgreSQL
// transaction (commit LSN) and are numbered by Index within it.
type pgStream struct {
	size  int
	lsn   pglogrepl.LSN
	index int
	n     int
}

func newPGStream(size int) *pgStream { return &pgStream{size: size, lsn: 0x5000000} }

func (p *pgStream) next(key string) *decoder.Event {
	if p.index == p.size || p.n == 0 {
		p.lsn += 0x10000
		p.index = 0
	}
	ev := &decoder.Event{
		ID: fmt.Appendf(nil, "ev-%05d", p.n), AggregateType: []byte("Order"), AggregateID: []byte(key), EventType: []byte("Changed"),
		Payload: fmt.Appendf(nil, `{"n":%d}`, p.n), LSN: p.lsn - 0x100 + pglogrepl.LSN(p.index),
		Tx: decoder.TxInfo{Xid: uint32(p.lsn >> 16), CommitLSN: p.lsn, CommitTime: time.Now()}, Index: p.index,
	}
	p.index++
	p.n++
	return ev
}

// position is where the stream's last event puts the committed position.
func (p *pgStream) position() sink.Position { return sink.Position{CommitLSN: p.lsn, Events: p.index} }

// txnConfig is a sink configuration for exactly-once delivery on fresh topics.
func txnConfig(t *testing.T, k *devenv.Kafka, interval time.Duration, maxEvents int) sink.Config {
	t.Helper()
	topic := testenv.UniqueName(t, "eo")
	if err := k.CreateTopic(context.Background(), topic, 3); err != nil {
		t.Fatal(err)
	}
	return sink.Config{
		Brokers: []string{k.Brokers()},
		Record:  record.Options{TopicTemplate: topic}, DeadLetterTopic: testenv.UniqueName(t, "dlq"), WriteTimeout: 5 * time.Second,
		Transactions: &sink.Transactions{
			ID: testenv.UniqueName(t, "txn"), Interval: interval, MaxEvents: maxEvents,
			PositionsTopic: testenv.UniqueName(t, "pos"),
		},
	}
}

// committedFor reads topics like a read_committed consumer for d and returns what it saw.
func committedFor(t *testing.T, brokers string, d time.Duration, topics ...string) []harness.Record {
	t.Helper()
	c := harness.NewCommittedConsumer(brokers, topics...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_ = c.ReadUntil(ctx, 0, func([]harness.Record) bool { return false }) // reads until d is over
	return c.Records()
}

// noTransactionOpen reports whether every partition of topic has its last stable offset at its
// high watermark, that is no transaction open on it (false also when it cannot tell).
func noTransactionOpen(ctx context.Context, client *kafka.Client, topic string) bool {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(md.Topics) != 1 || len(md.Topics[0].Partitions) == 0 {
		return false
	}
	var last []kafka.OffsetRequest
	for _, p := range md.Topics[0].Partitions {
		last = append(last, kafka.LastOffsetOf(p.ID))
	}
	ends := make(map[kafka.IsolationLevel]map[int]int64)
	for _, level := range []kafka.IsolationLevel{kafka.ReadCommitted, kafka.ReadUncommitted} {
		res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: last}, IsolationLevel: level})
		if err != nil || len(res.Topics[topic]) != len(last) {
			return false
		}
		ends[level] = make(map[int]int64)
		for _, p := range res.Topics[topic] {
			if p.Error != nil {
				return false
			}
			ends[level][p.Partition] = p.LastOffset
		}
	}
	return maps.Equal(ends[kafka.ReadCommitted], ends[kafka.ReadUncommitted])
}

// TestTransactionsCommitPrefixesOfTheStreamAndTheirPositions publishes PostgreSQL transactions of
// 37 events into Kafka transactions of at most 100: a read_committed reader sees every event once,
// in key order; the positions topic holds one position per Kafka transaction, each a prefix of the
// stream, some in the middle of a PostgreSQL transaction; ReadPosition returns the last.
func TestTransactionsCommitPrefixesOfTheStreamAndTheirPositions(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, 50*time.Millisecond, 100)
	s := readySink(t, k.Brokers(), cfg)
	log, stream := newSent(), newPGStream(37)
	const n = 1500
	for i := range n {
		ev := stream.next(fmt.Sprintf("order-%02d", i%17))
		a := &acker{}
		log.add(ev, a, nil)
		s.publish(t, ev, a)
	}
	eventually(t, 60*time.Second, "every event acknowledged", func() bool { events, _ := s.InFlight(); return events == 0 })
	committed, ok := s.Committed()
	s.mustClose(t)
	log.checkAcked(t)
	if !ok || committed != stream.position() {
		t.Errorf("Committed() = %v %v, want %v", committed, ok, stream.position())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pos, ok, err := sink.ReadPosition(ctx, cfg)
	if err != nil || !ok || pos != stream.position() {
		t.Errorf("ReadPosition = %v %v %v, want %v", pos, ok, err, stream.position())
	}
	records := readCommitted(t, k.Brokers(), 60*time.Second, atLeast(n), cfg.Record.TopicTemplate)
	if dups := log.verify(t, cfg.Record.TopicTemplate, records); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	txns := s.metric(t, "outbox_relay_kafka_transactions_total", "outcome", "committed")
	positions := readCommitted(t, k.Brokers(), 60*time.Second, atLeast(int(txns)), cfg.Transactions.PositionsTopic)
	if len(positions) != int(txns) || txns < n/100 {
		t.Fatalf("%d positions for %v committed transactions of at most 100 events (%d events)", len(positions), txns, n)
	}
	var last sink.Position
	mid := 0
	for _, r := range positions {
		pos, err := sink.DecodePosition(r.Value)
		if err != nil || string(r.Key) != cfg.Transactions.ID {
			t.Fatalf("position record %q=%q: %v", r.Key, r.Value, err)
		}
		if pos.CommitLSN < last.CommitLSN || (pos.CommitLSN == last.CommitLSN && pos.Events <= last.Events) {
			t.Errorf("position %v after %v: not further", pos, last)
		}
		if pos.Events != 37 {
			mid++
		}
		last = pos
	}
	if mid == 0 {
		t.Error("no Kafka transaction ended inside a PostgreSQL transaction: the test did not test that")
	}
	t.Logf("%d events in %v Kafka transactions, %d ending inside a PostgreSQL transaction", n, txns, mid)
}

// TestAnOpenTransactionIsInvisibleAndAnAbortedOneStaysSo: records written in a Kafka transaction
// that has not committed are not acknowledged and a read_committed reader does not see them
// (kafka-go's own Reader does); a Close that gives up aborts the transaction, and a later sink
// with the same transactional id commits only its own records.
func TestAnOpenTransactionIsInvisibleAndAnAbortedOneStaysSo(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, time.Hour, 100000)
	cfg.Transactions.Linger = time.Hour // the transaction stays open
	s := readySink(t, k.Brokers(), cfg)
	a := &acker{}
	stream := newPGStream(10)
	for i := range 50 {
		s.publish(t, stream.next(fmt.Sprintf("order-%d", i%5)), a)
	}
	uncommitted := readBack(t, k.Brokers(), 60*time.Second, atLeast(50), cfg.Record.TopicTemplate)
	if seen := committedFor(t, k.Brokers(), 2*time.Second, cfg.Record.TopicTemplate); len(seen) != 0 {
		t.Errorf("a read_committed reader sees %d records of the open transaction", len(seen))
	}
	if a.n.Load() != 0 {
		t.Errorf("%d events acknowledged before their transaction committed", a.n.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.close(ctx); err == nil {
		t.Error("Close with an ended context reported success")
	}
	if a.n.Load() != 0 {
		t.Errorf("%d events of the aborted transaction acknowledged", a.n.Load())
	}
	if got := s.metric(t, "outbox_relay_kafka_transactions_total", "outcome", "aborted"); got != 1 {
		t.Errorf("kafka_transactions_total{aborted} = %v, want 1", got)
	}

	next := readySink(t, k.Brokers(), cfg)
	if _, ok, err := next.ReadPosition(context.Background()); ok || err != nil {
		t.Errorf("ReadPosition after the abort = ok %v, %v; want nothing committed", ok, err)
	}
	publishAndVerify(t, next, k.Brokers(), cfg.Record.TopicTemplate, "second", 20)
	t.Logf("the log holds %d records of the aborted transaction; a read_committed reader saw none of them", len(uncommitted))
}

// TestAnAbandonedSinkCommitsNothingMore: a relay that was fenced abandons its sink (Abandon)
// while events wait in the open Kafka transaction. Nothing more may be committed, not even by a
// Close that is given time to commit: the transaction is aborted, no event is acknowledged and a
// read_committed reader sees none of them (another instance may lead already, and publishes them
// itself).
func TestAnAbandonedSinkCommitsNothingMore(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, time.Hour, 100000)
	cfg.Transactions.Linger = time.Hour // the transaction stays open until Close would commit it
	s := readySink(t, k.Brokers(), cfg)
	a := &acker{}
	stream := newPGStream(10)
	for i := range 20 {
		s.publish(t, stream.next(fmt.Sprintf("order-%d", i%5)), a)
	}
	readBack(t, k.Brokers(), 60*time.Second, atLeast(20), cfg.Record.TopicTemplate) // written, not committed
	s.Abandon()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = s.close(ctx) // time enough to commit: Close commits what was published unless abandoned
	if a.n.Load() != 0 {
		t.Errorf("%d events of the abandoned transaction acknowledged", a.n.Load())
	}
	if seen := committedFor(t, k.Brokers(), 2*time.Second, cfg.Record.TopicTemplate); len(seen) != 0 {
		t.Errorf("a read_committed reader sees %d records of the abandoned transaction", len(seen))
	}
	if got := s.metric(t, "outbox_relay_kafka_transactions_total", "outcome", "committed"); got != 0 {
		t.Errorf("kafka_transactions_total{committed} = %v, want 0", got)
	}
	// Aborted, not left open: an open one would hold every read_committed reader of these
	// partitions at it until the transaction timeout, and a reader that sees nothing above cannot
	// tell the two apart.
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(k.Brokers(), ",")...), Timeout: 5 * time.Second}
	if !noTransactionOpen(context.Background(), client, cfg.Record.TopicTemplate) {
		t.Error("a transaction is still open after the abandoned sink closed: the abort did not reach it")
	}
}

// TestASecondProducerWithTheSameTransactionalIDFencesTheFirst: B takes over A's transactional id
// while A has a transaction open. A learns it is fenced on its own, without being called
// (Failed closes, Err wraps ErrFenced), its Publish fails, and nothing A wrote becomes visible.
func TestASecondProducerWithTheSameTransactionalIDFencesTheFirst(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	// A's transaction stays open 20s: B surely takes over while it is open, even on a loaded
	// machine, and A notices when it tries to commit.
	cfg := txnConfig(t, k, 20*time.Second, 100000)
	cfg.Transactions.Linger = 20 * time.Second
	a := readySink(t, k.Brokers(), cfg)
	acksA := &acker{}
	stream := newPGStream(5)
	for i := range 30 {
		a.publish(t, stream.next(fmt.Sprintf("order-%d", i%3)), acksA)
	}
	readBack(t, k.Brokers(), 30*time.Second, atLeast(30), cfg.Record.TopicTemplate) // written, not committed

	b := readySink(t, k.Brokers(), cfg) // InitProducerID: fences A and aborts its transaction
	select {
	case <-a.Failed():
	case <-time.After(90 * time.Second):
		t.Fatal("A never learned it was fenced")
	}
	if !errors.Is(a.Err(), sink.ErrFenced) {
		t.Errorf("A's Err = %v, want ErrFenced", a.Err())
	}
	if err := a.Publish(context.Background(), stream.next("order-0"), acksA); !errors.Is(err, sink.ErrFenced) {
		t.Errorf("A's Publish = %v, want ErrFenced", err)
	}
	if acksA.n.Load() != 0 {
		t.Errorf("A acknowledged %d events", acksA.n.Load())
	}
	if a.logs.FilterMessageSnippet("fenced").Len() == 0 {
		t.Error("no log line says A was fenced")
	}
	_ = a.close(context.Background())

	publishAndVerify(t, b, k.Brokers(), cfg.Record.TopicTemplate, "b", 30) // verify also fails on A's ids
}

// publishAndVerify publishes n events (ids prefix-0...) through s, closes it, and checks that a
// read_committed reader of topic sees exactly those events, each once, in key order.
func publishAndVerify(t *testing.T, s *testSink, brokers, topic, prefix string, n int) {
	t.Helper()
	log, a := newSent(), &acker{}
	stream := newPGStream(5)
	for i := range n {
		ev := stream.next(fmt.Sprintf("order-%d", i%3))
		ev.ID = fmt.Appendf(nil, "%s-%d", prefix, i)
		log.add(ev, a, nil)
		s.publish(t, ev, a)
	}
	s.mustClose(t)
	log.checkAcked(t)
	records := readCommitted(t, brokers, 60*time.Second, atLeast(n), topic)
	if dups := log.verify(t, topic, records); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
}

// TestReadPositionFindsTheLatestPositionBehindOtherRelays: the positions topic is created
// compacted; a fresh transactional id has no position; the latest position of a key is found by
// reading backwards from the end, past more records of other keys than one chunk holds (written
// without a transaction, so they count as no one's position).
func TestReadPositionFindsTheLatestPositionBehindOtherRelays(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, 20*time.Millisecond, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, ok, err := sink.ReadPosition(ctx, cfg); ok || err != nil {
		t.Fatalf("ReadPosition of a new id = ok %v, %v", ok, err)
	}
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers())}
	desc, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: cfg.Transactions.PositionsTopic, ConfigNames: []string{"cleanup.policy"},
	}}})
	if err != nil || len(desc.Resources) != 1 || len(desc.Resources[0].ConfigEntries) != 1 || desc.Resources[0].ConfigEntries[0].ConfigValue != "compact" {
		t.Errorf("positions topic config: %+v %v; want cleanup.policy=compact", desc, err)
	}

	s := readySink(t, k.Brokers(), cfg)
	stream := newPGStream(4)
	for i := range 10 {
		s.publish(t, stream.next(fmt.Sprintf("k%d", i)), &acker{})
	}
	s.mustClose(t)
	// Another relay's positions after ours: more than one backward chunk of them.
	other := &kafka.Writer{Addr: kafka.TCP(k.Brokers()), Topic: cfg.Transactions.PositionsTopic, BatchSize: 500, RequiredAcks: kafka.RequireAll}
	msgs := make([]kafka.Message, 1500)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte("another-relay"), Value: fmt.Appendf(nil, `{"v":1,"commit_lsn":"0/%X","events":1}`, i+1)}
	}
	// The topic was created moments ago: its partition may not have a leader yet.
	await.NoError(t, 30*time.Second, "another relay's positions written", func() error { return other.WriteMessages(ctx, msgs...) })
	other.Close()
	pos, ok, err := sink.ReadPosition(ctx, cfg)
	if err != nil || !ok || pos != stream.position() {
		t.Errorf("ReadPosition = %v %v %v, want %v", pos, ok, err, stream.position())
	}
	// Written here without a Kafka transaction, the other key's records are no relay's positions
	// (TestAPositionNotWrittenInAKafkaTransactionIsIgnored): none is taken.
	cfg.Transactions.ID = "another-relay"
	if pos, ok, err := sink.ReadPosition(ctx, cfg); err != nil || ok {
		t.Errorf("the other key's ReadPosition = %v %v %v, want none: its records were not written in a transaction", pos, ok, err)
	}
}

// TestDeadLetteredEventsAreCommittedInTheSameTransaction: an event too large for its topic goes
// to the dead-letter topic inside the Kafka transaction of its neighbours, and is acknowledged
// with them at the commit.
func TestDeadLetteredEventsAreCommittedInTheSameTransaction(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, 50*time.Millisecond, 1000)
	cfg.MaxMessageBytes = 2000
	s := readySink(t, k.Brokers(), cfg)
	a := &acker{}
	stream := newPGStream(5)
	for i := range 20 {
		ev := stream.next(fmt.Sprintf("k%d", i%4))
		if i == 7 {
			ev.Payload = []byte(`"` + strings.Repeat("x", 3000) + `"`)
		}
		s.publish(t, ev, a)
	}
	eventually(t, 60*time.Second, "every event acknowledged", func() bool { return a.n.Load() == 20 })
	s.mustClose(t)
	dead := readCommitted(t, k.Brokers(), 60*time.Second, atLeast(1), cfg.DeadLetterTopic)
	if len(dead) != 1 || dead[0].Header("id") != "ev-00007" {
		t.Errorf("dead-letter topic holds %d records, want ev-00007", len(dead))
	}
	if got := readCommitted(t, k.Brokers(), 60*time.Second, atLeast(19), cfg.Record.TopicTemplate); len(got) != 19 {
		t.Errorf("%d records on the topic, want 19", len(got))
	}
}

// TestAHaltAbortsTheTransactionThatHoldsTheHaltedEvent: under the halt policy the Kafka
// transactions before the halted event's commit; the one holding it is aborted, so none of its
// events (those before the halted one included) is acknowledged or visible, and the position stays at
// the end of the last committed transaction.
func TestAHaltAbortsTheTransactionThatHoldsTheHaltedEvent(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, 200*time.Millisecond, 1000)
	cfg.Policy = sink.Halt
	cfg.MaxMessageBytes = 2000
	s := readySink(t, k.Brokers(), cfg)
	a := &acker{}
	stream := newPGStream(4)
	for i := range 10 {
		s.publish(t, stream.next(fmt.Sprintf("k%d", i%3)), a)
	}
	eventually(t, 60*time.Second, "the first transaction committed", func() bool { return a.n.Load() == 10 })
	before := stream.position()
	for i := range 5 {
		ev := stream.next(fmt.Sprintf("k%d", i%3))
		if i == 4 {
			ev.Payload = []byte(`"` + strings.Repeat("x", 3000) + `"`) // too large: halts (and Publish blocks from then on)
		}
		s.publish(t, ev, a)
	}
	eventually(t, 30*time.Second, "the sink halted", func() bool { _, _, _, h := s.Halted(); return h })
	eventually(t, 30*time.Second, "the transaction aborted", func() bool {
		return s.metric(t, "outbox_relay_kafka_transactions_total", "outcome", "aborted") == 1
	})
	// Close returns once the producers and the committer have stopped: anything wrongly
	// acknowledged would be by then. Halted, it reports the halt.
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	_ = s.close(cctx)
	if a.n.Load() != 10 {
		t.Errorf("%d events acknowledged, want the first transaction's 10", a.n.Load())
	}
	if got := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(10), cfg.Record.TopicTemplate); len(got) != 10 {
		t.Errorf("a read_committed reader sees %d records, want 10", len(got))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if pos, ok, err := sink.ReadPosition(ctx, cfg); err != nil || !ok || pos != before {
		t.Errorf("ReadPosition = %v %v %v, want %v", pos, ok, err, before)
	}
}

// TestATransactionTheCoordinatorTimedOutEndsTheSinkAsAbortedNotFenced: a transaction left open
// past its timeout is aborted by the coordinator, which bumps the epoch; the sink's next request
// is refused like a fenced one, and asking the coordinator tells the two apart: ErrAborted, so
// the relay may start again, and nothing of the transaction is visible or acknowledged.
func TestATransactionTheCoordinatorTimedOutEndsTheSinkAsAbortedNotFenced(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, time.Hour, 100000)
	cfg.Transactions.Linger = time.Hour    // the transaction stays open
	cfg.Transactions.Timeout = time.Second // the broker checks for timed-out transactions every 10s
	s := readySink(t, k.Brokers(), cfg)
	a := &acker{}
	stream := newPGStream(5)
	for i := range 10 {
		s.publish(t, stream.next(fmt.Sprintf("k%d", i%3)), a)
	}
	readBack(t, k.Brokers(), 30*time.Second, atLeast(10), cfg.Record.TopicTemplate) // written, not committed
	// The coordinator aborts it at its next scan for timed-out transactions (every 10 s), which
	// writes the abort markers: then no partition has a transaction open. A fixed sleep gave a
	// busy broker's late scan 4 s.
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(k.Brokers(), ",")...), Timeout: 5 * time.Second}
	eventually(t, time.Minute, "the coordinator aborted the timed-out transaction", func() bool {
		return noTransactionOpen(context.Background(), client, cfg.Record.TopicTemplate)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := s.close(ctx) // tries to commit
	if err == nil || !errors.Is(s.Err(), sink.ErrAborted) || errors.Is(s.Err(), sink.ErrFenced) {
		t.Errorf("Close = %v, Err = %v; want the sink ended with ErrAborted, not ErrFenced", err, s.Err())
	}
	if a.n.Load() != 0 {
		t.Errorf("%d events acknowledged", a.n.Load())
	}
	if got := committedFor(t, k.Brokers(), 2*time.Second, cfg.Record.TopicTemplate); len(got) != 0 {
		t.Errorf("a read_committed reader sees %d records", len(got))
	}
}
