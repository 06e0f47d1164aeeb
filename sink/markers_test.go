package sink_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zapcore"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/readcommitted"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestLostCommitMarkers runs the scenarios of commit markers lost with a partition's leader on one
// two-node cluster, one after the other: starting the cluster (a minute or two on a loaded
// machine) costs more than a scenario.
func TestLostCommitMarkers(t *testing.T) {
	c := startMarkerCluster(t)
	t.Run("AnEventIsAcknowledgedOnlyOnceItsCommitMarkerIsWritten", func(t *testing.T) {
		testAnEventIsAcknowledgedOnlyOnceItsCommitMarkerIsWritten(t, c)
	})
	t.Run("AStartSettlesTheTransactionOfItsPosition", func(t *testing.T) {
		testAStartSettlesTheTransactionOfItsPosition(t, c)
	})
}

// testAnEventIsAcknowledgedOnlyOnceItsCommitMarkerIsWritten: an EndTxn(commit) answered with
// success does not prove that every partition of the transaction got its commit marker. The
// transaction coordinator (Kafka 4.4, TransactionMarkerChannelManager.addTxnMarkersToBrokerQueue)
// skips the partitions that have no leader when it sends the markers ("likely deleted already"),
// and completes the transaction without them: their records stay in an open transaction, the
// partition's last stable offset stays at the first of them, and a read_committed reader sees
// none of them (nor anything after them) until the producer's next transaction on that partition
// ends, its commit taking them in, its abort killing them. A sink that acknowledges at EndTxn has
// then confirmed events nobody can read, and may lose them. So an event must be acknowledged only
// once a read_committed reader can read it, and a dropped marker must be made good.
//
// Two nodes: node 1 (controller, and the coordinator of the transactional id) and node 2, the
// only replica of the data topic's partition. The events are written in a transaction; node 2
// stops (its partition has no leader then); an event to a topic on node 1 fills the transaction
// (MaxEvents), so it commits at once; node 2 starts again. Each acknowledgement checks, when it
// arrives, that a read_committed reader can read the events, and within 30s of node 2's return
// every event must be readable and acknowledged.
func testAnEventIsAcknowledgedOnlyOnceItsCommitMarkerIsWritten(t *testing.T, c *markerCluster) {
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client, broker := c.client, c.broker
	const n = 20
	m := c.newMarkerTxn(ctx, t, n, c.ctrl.NodeID(), nil)
	data, positions, acks := m.data, m.positions, m.acks

	stopped := time.Now()
	if err := broker.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d stopped in %v", broker.NodeID(), time.Since(stopped).Round(time.Millisecond))
	eventually(t, 30*time.Second, "the data partition without leader", func() bool { return leaderless(ctx, client, data) })
	if committed, err := stableOffset(ctx, client, positions); committed != 0 || err != nil || acks.count() != 0 {
		t.Fatalf("the transaction ended before the commit was due: positions LSO %d (%v), %d events acknowledged", committed, err, acks.count())
	}

	m.fill(t) // the sink commits now
	// The position is written in the transaction too, on node 1: its partition's LSO moves past it
	// once the commit's markers are written. A sink may also wait with the commit for the leader.
	commitAt := time.Now()
	committed := pollUntil(10*time.Second, func() bool { lso, err := stableOffset(ctx, client, positions); return err == nil && lso > 0 })
	if committed {
		t.Logf("committed (the position's marker written) %v after the trigger event, while the data partition had no leader", time.Since(commitAt).Round(time.Millisecond))
		pollUntil(2*time.Second, func() bool { return acks.count() > 0 }) // acknowledgements at the commit come by now
	} else {
		t.Log("no commit within 10s while the data partition had no leader")
	}

	restarted := time.Now()
	if err := broker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d back after %v (restart %v)", broker.NodeID(), time.Since(stopped).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))
	back := time.Now()
	var readable int
	var lso, hw int64
	var lastErr error
	pollUntil(30*time.Second, func() bool {
		readable, lso, hw, lastErr = readCommittedCount(ctx, client, data)
		return readable >= n && acks.count() >= n
	})
	waited := time.Since(back).Round(time.Millisecond)

	if early := acks.early(n); len(early) > 0 {
		t.Errorf("%d of %d events acknowledged while a read_committed reader could not read them: %s",
			acks.count(), n, strings.Join(early, "; "))
	}
	if readable < n {
		t.Errorf("%v after node %d's return a read_committed reader reads %d of %d events: the partition's LSO is %d, its high watermark %d (last error %v); "+
			"offsets 0-%d hold the events and no marker after them: their transaction is still open there", waited, broker.NodeID(), readable, n, lso, hw, lastErr, n-1)
	}
	if got := acks.count(); got != n {
		t.Errorf("%v after node %d's return %d of %d events acknowledged", waited, broker.NodeID(), got, n)
	}
	logLines(t, c.ctrl.Logs(), "likely deleted")
	t.Logf("data partition: LSO %d, high watermark %d, %d events readable; test body took %v", lso, hw, readable, time.Since(started).Round(time.Millisecond))
}

// testAStartSettlesTheTransactionOfItsPosition: a relay killed while it waits for a lost commit
// marker (markers.go) leaves, in the partition whose leader was away, the records of a Kafka
// transaction its coordinator calls committed, open, with none of their events acknowledged,
// and its position committed, or open too when the positions partition lost its marker. The next
// relay with the transactional id settles that at its start (Sink.ReadPosition): it commits what
// was left open and returns the position; a position whose records were discarded meanwhile is
// not trusted (the zero Position: everything from the slot is published again).
//
// One outage of node 2 serves three sinks, each with its own transactional id and topics, their
// data partition on node 2:
//   - open: its positions on node 1. It commits while node 2 is down, so the data partition's
//     marker is lost, and is killed while it waits for the partition.
//   - discarded: the same; then, before the next start, a producer taking the transactional id
//     over aborts the records left open, as a takeover that aborted an open repair would.
//   - ownOpen: its positions on node 2 too. Its EndTxn is held until node 2 is down, so both the
//     data and the positions partition lose their marker.
func testAStartSettlesTheTransactionOfItsPosition(t *testing.T, c *markerCluster) {
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const n = 10
	open := c.newMarkerTxn(ctx, t, n, c.ctrl.NodeID(), nil)
	discarded := c.newMarkerTxn(ctx, t, n, c.ctrl.NodeID(), nil)
	ownOpen := c.newMarkerTxn(ctx, t, n, c.broker.NodeID(), func(cfg *sink.Config) {
		cfg.WriteTimeout = 2 * time.Minute // its EndTxn is held while node 2 stops: no retry meanwhile
	})
	all := []*markerTxn{open, discarded, ownOpen}

	ownOpen.gate.hold()
	ownOpen.fill(t) // its position goes to node 2 now, its EndTxn waits
	eventually(t, 30*time.Second, "the EndTxn of the sink whose positions are on node 2 held", func() bool { return ownOpen.gate.held() > 0 })

	stopped := time.Now()
	if err := c.broker.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d stopped in %v", c.broker.NodeID(), time.Since(stopped).Round(time.Millisecond))
	for _, tp := range []string{open.data, discarded.data, ownOpen.data, ownOpen.positions} {
		eventually(t, 30*time.Second, tp+" without leader", func() bool { return leaderless(ctx, c.client, tp) })
	}
	open.fill(t)
	discarded.fill(t)
	ownOpen.gate.open()
	for _, m := range all {
		eventually(t, 30*time.Second, m.cfg.Transactions.ID+" committed (EndTxn answered)", func() bool {
			return m.s.metric(t, "outbox_relay_kafka_transactions_total", "outcome", "committed") > 0
		})
	}
	// Each sink now waits for its data partition's marker (landed), which cannot come before the
	// partition has a leader: kill it there.
	for _, m := range all {
		m.kill(t)
	}
	for _, m := range all {
		if got := m.acks.count(); got != 0 {
			t.Fatalf("%s: %d events acknowledged while their commit marker was lost", m.cfg.Transactions.ID, got)
		}
		if ends := m.gate.ends(); !slices.Equal(ends, []string{"commit"}) {
			t.Fatalf("%s: the sink sent EndTxn %v, want one commit: an abort reaching the data partition would discard the records", m.cfg.Transactions.ID, ends)
		}
	}

	restarted := time.Now()
	if err := c.broker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d back after %v (restart %v)", c.broker.NodeID(), time.Since(stopped).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))
	logLines(t, c.ctrl.Logs(), "likely deleted")
	for _, m := range all {
		for _, tp := range []string{m.data, m.positions} {
			eventually(t, 30*time.Second, tp+" has its leader", func() bool { return !leaderless(ctx, c.client, tp) })
		}
		// The records are still open: no marker, commit or abort, reached them. The metadata
		// names the leader a moment before it answers for the partition (NOT_LEADER_OR_FOLLOWER):
		// ask until it does.
		var lso, hw int64
		await.NoError(t, 30*time.Second, m.data+" answers for its offsets", func() error {
			var err, herr error
			lso, err = stableOffset(ctx, c.client, m.data)
			hw, herr = highWatermark(ctx, c.client, m.data)
			return errors.Join(err, herr)
		})
		if lso != 0 || hw != n {
			t.Fatalf("%s: LSO %d, high watermark %d, want 0 and %d: the records left open were decided before the start", m.data, lso, hw, n)
		}
	}
	var posLSO int64
	await.NoError(t, 30*time.Second, ownOpen.positions+" answers for its offsets", func() (err error) {
		posLSO, err = stableOffset(ctx, c.client, ownOpen.positions)
		return err
	})
	if posLSO != 0 {
		t.Fatalf("%s: LSO %d, want 0: the position is not open", ownOpen.positions, posLSO)
	}

	t.Run("CommitsWhatALostCommitMarkerLeftOpen", func(t *testing.T) {
		checkStart(ctx, t, c, open, open.stream.position(), n)
	})
	t.Run("DoesNotTrustAPositionWhoseRecordsWereDiscarded", func(t *testing.T) {
		abortAsATakeover(ctx, t, c.client, discarded.cfg.Transactions.ID, discarded.data)
		var readable int
		var lso, hw int64
		var err error
		if !pollUntil(10*time.Second, func() bool {
			readable, lso, hw, err = readCommittedCount(ctx, c.client, discarded.data)
			return err == nil && lso > n
		}) || readable != 0 {
			t.Fatalf("after the takeover's abort a read_committed reader reads %d records (LSO %d, high watermark %d, %v), want none with the LSO past them", readable, lso, hw, err)
		}
		s := checkStart(ctx, t, c, discarded, sink.Position{}, 0)
		if warned := s.logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("not trusting it").Len(); warned != 1 {
			t.Errorf("%d warnings that the position is not trusted, want 1", warned)
		}
	})
	t.Run("CommitsItsOwnPositionLeftOpen", func(t *testing.T) {
		checkStart(ctx, t, c, ownOpen, ownOpen.stream.position(), n)
	})
	t.Logf("test body took %v", time.Since(started).Round(time.Millisecond))
}

// checkStart starts a new sink with m's transactional id and checks that its ReadPosition returns
// want (found), and that a read_committed reader then reads readable events of m's data partition
// with its last stable offset past them all.
func checkStart(ctx context.Context, t *testing.T, c *markerCluster, m *markerTxn, want sink.Position, readable int) *testSink {
	t.Helper()
	s := readySink(t, c.ctrl.Brokers(), m.cfg)
	// Past it, a position left open in the positions partition fails the start instead of
	// holding it for the default bound (the transaction timeout and 30s).
	sink.SetStableWait(s.Sink, 10*time.Second)
	begin := time.Now()
	pos, found, err := s.ReadPosition(ctx)
	took := time.Since(begin).Round(time.Millisecond)
	if err != nil || !found || pos != want {
		t.Fatalf("ReadPosition = %+v, %v, %v after %v, want %+v, true, nil", pos, found, err, took, want)
	}
	got, lso, hw, err := readCommittedCount(ctx, c.client, m.data)
	if err != nil || got != readable || lso < hw {
		t.Fatalf("after ReadPosition a read_committed reader reads %d of the %d records of %s (LSO %d, high watermark %d, %v), want %d with the LSO at the high watermark",
			got, m.n, m.data, lso, hw, err, readable)
	}
	if lso, err := stableOffset(ctx, c.client, m.positions); err != nil || lso < 1 {
		t.Fatalf("%s: LSO %d (%v) after ReadPosition, want the position committed", m.positions, lso, err)
	}
	t.Logf("ReadPosition took %v; %d repairs of lost markers", took, s.logs.FilterMessageSnippet("did not reach these partitions").Len())
	s.mustClose(t)
	return s
}

// kill stops the sink as a relay dies: Close with a context already ended gives up at once and
// ends the sink's context. The committer, waiting for the data partition's marker, stops without
// a repair; having committed, it holds no partition an abort would end (the gate checks that no
// EndTxn(abort) goes out).
func (m *markerTxn) kill(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := m.s.close(ctx)
	t.Logf("%s killed (Close: %v)", m.cfg.Transactions.ID, err)
}

// abortAsATakeover does to what the transactional id left open in topic's partition 0 what a
// producer taking the id over does when it aborts an open repair: InitProducerID bumps the epoch,
// the partition joins a transaction of the new epoch, and that transaction's abort marker ends the
// old epoch's records there too.
func abortAsATakeover(ctx context.Context, t *testing.T, client *kafka.Client, txnID, topic string) {
	t.Helper()
	try := func(what string, f func() error) {
		t.Helper()
		var err error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			err = f()
			var kerr kafka.Error
			if err == nil || errors.As(err, &kerr) && !kerr.Temporary() && kerr != kafka.ConcurrentTransactions {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var pid, epoch int
	try("InitProducerID", func() error {
		res, err := client.InitProducerID(ctx, &kafka.InitProducerIDRequest{TransactionalID: txnID, TransactionTimeoutMs: 60000, ProducerID: -1, ProducerEpoch: -1})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			pid, epoch = res.Producer.ProducerID, res.Producer.ProducerEpoch
		}
		return err
	})
	try("AddPartitionsToTxn", func() error {
		res, err := client.AddPartitionsToTxn(ctx, &kafka.AddPartitionsToTxnRequest{TransactionalID: txnID, ProducerID: pid, ProducerEpoch: epoch,
			Topics: map[string][]kafka.AddPartitionToTxn{topic: {{Partition: 0}}}})
		if err != nil {
			return err
		}
		for _, p := range res.Topics[topic] {
			if p.Error != nil {
				return p.Error
			}
		}
		return nil
	})
	try("EndTxn(abort)", func() error {
		res, err := client.EndTxn(ctx, &kafka.EndTxnRequest{TransactionalID: txnID, ProducerID: pid, ProducerEpoch: epoch, Committed: false})
		if err == nil {
			err = res.Error
		}
		return err
	})
	t.Logf("%s: producer %d epoch %d aborted a transaction holding %s", txnID, pid, epoch, topic)
}

// markerCluster is two nodes: node 1, the controller and the transaction coordinator of every
// transactional id, which stays up, and node 2, a broker that tests stop so that the partitions it
// leads (their only replica) have no leader.
type markerCluster struct {
	ctrl, broker *devenv.Kafka
	client       *kafka.Client
}

// startMarkerCluster starts the two nodes. FindCoordinator creates __transaction_state (one
// replica) while node 1 is the only broker, so node 1 coordinates every transactional id.
func startMarkerCluster(t *testing.T) *markerCluster {
	t.Helper()
	started := time.Now()
	// The coordinator logs the skipped partitions at INFO.
	ctrl := testenv.Kafka(t, devenv.KafkaOptions{HeapMB: 256, LogLevels: map[string]string{"kafka.coordinator.transaction": "INFO"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(ctrl.Brokers()), Timeout: 5 * time.Second,
		Transport: &kafka.Transport{MetadataTTL: 100 * time.Millisecond}} // sees node 2 leave and return at once
	t.Cleanup(client.Transport.(*kafka.Transport).CloseIdleConnections)
	if coord := transactionCoordinator(ctx, t, client, testenv.UniqueName(t, "txn")); coord != ctrl.NodeID() {
		t.Fatalf("the transaction coordinator is node %d, want node %d", coord, ctrl.NodeID())
	}
	broker := testenv.KafkaBroker(t, ctrl, devenv.KafkaOptions{HeapMB: 256})
	t.Logf("two nodes ready after %v", time.Since(started).Round(time.Millisecond))
	return &markerCluster{ctrl: ctrl, broker: broker, client: client}
}

// markerTxn is a sink with its own transactional id and topics, holding an open Kafka transaction
// of n events in the only partition of data, on node 2. The transaction commits when fill
// publishes one more event (MaxEvents n+1), to trigger, on node 1; positions is on the node given.
// Every connection of the sink goes through gate.
type markerTxn struct {
	cfg                      sink.Config
	s                        *testSink
	gate                     *endTxnGate
	data, trigger, positions string
	n                        int
	acks                     *visibilityAcker
	stream                   *pgStream
}

// newMarkerTxn creates the topics and the sink (configured by tweak, when not nil), publishes
// the n events and waits until they are written.
func (c *markerCluster) newMarkerTxn(ctx context.Context, t *testing.T, n, positionsNode int, tweak func(*sink.Config)) *markerTxn {
	t.Helper()
	started := time.Now()
	txnID := testenv.UniqueName(t, "txn")
	// The coordinator must stay up while node 2 stops.
	if coord := transactionCoordinator(ctx, t, c.client, txnID); coord != c.ctrl.NodeID() {
		t.Fatalf("the coordinator of %s is node %d, want node %d", txnID, coord, c.ctrl.NodeID())
	}
	base := testenv.UniqueName(t, "mk")
	m := &markerTxn{data: base + "_data", trigger: base + "_trigger", positions: base + "_pos", n: n, stream: newPGStream(n + 1), gate: newEndTxnGate()}
	createTopicOn(ctx, t, c.client, m.data, c.broker.NodeID())
	createTopicOn(ctx, t, c.client, m.trigger, c.ctrl.NodeID())
	createTopicOn(ctx, t, c.client, m.positions, positionsNode, kafka.ConfigEntry{ConfigName: "cleanup.policy", ConfigValue: "compact"})
	m.cfg = sink.Config{
		Brokers: []string{c.ctrl.Brokers()}, Record: record.Options{TopicTemplate: base + "_{aggregate_type}"}, DeadLetterTopic: base + "_dlq",
		WriteTimeout: 5 * time.Second,
		// Only the (n+1)th event, which fills the transaction, ends it; its records go to the
		// brokers at once (Config.Linger) all the same.
		Transactions: &sink.Transactions{ID: txnID, Interval: 40 * time.Second, Linger: 40 * time.Second, MaxEvents: n + 1, PositionsTopic: m.positions},
	}
	if tweak != nil {
		tweak(&m.cfg)
	}
	m.s = newSink(t, c.ctrl.Brokers(), m.cfg)
	sink.SetDialer(m.s.Sink, m.gate.dial)
	t.Cleanup(m.gate.open) // before the sink's cleanup closes it
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := m.s.WaitReady(rctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	m.acks = &visibilityAcker{visible: func() (int64, error) { return stableOffset(ctx, c.client, m.data) }}
	for i := range n {
		ev := m.stream.next(fmt.Sprintf("k%d", i%3))
		ev.AggregateType = []byte("data")
		m.s.publish(t, ev, m.acks)
	}
	eventually(t, 30*time.Second, "the events written to their partition", func() bool {
		hw, err := highWatermark(ctx, c.client, m.data)
		return err == nil && hw >= int64(n)
	})
	t.Logf("%s: topics ready and %d events written after %v", txnID, n, time.Since(started).Round(time.Millisecond))
	return m
}

// fill publishes the event that fills the transaction: the sink commits it at once.
func (m *markerTxn) fill(t *testing.T) {
	t.Helper()
	ev := m.stream.next("k0")
	ev.AggregateType = []byte("trigger")
	m.s.publish(t, ev, &acker{})
}

// endTxnGate is the dialer of a sink's connections, watching its EndTxn requests on the wire: it
// notes whether each commits or aborts, and while held it keeps them from going out (the sink
// waits for the answer), so a test can take a partition's leader away between the sink's last
// record and its commit.
type endTxnGate struct {
	mu      sync.Mutex
	holding bool
	release chan struct{}
	waiting int      // EndTxn requests held now
	sent    []string // "commit", "abort" or "?" for each EndTxn sent
}

func newEndTxnGate() *endTxnGate { return &endTxnGate{release: make(chan struct{})} }

func (g *endTxnGate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, g: g}, nil
}

// hold keeps the EndTxn requests sent from now on until open.
func (g *endTxnGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.holding {
		g.holding, g.release = true, make(chan struct{})
	}
}

func (g *endTxnGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holding {
		g.holding = false
		close(g.release)
	}
}

func (g *endTxnGate) held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// ends returns what the EndTxn requests sent so far said.
func (g *endTxnGate) ends() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sent)
}

// pass lets an EndTxn go out once the gate is open.
func (g *endTxnGate) pass(what string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.holding {
		g.waiting++
		release := g.release
		g.mu.Unlock()
		<-release
		g.mu.Lock()
		g.waiting--
	}
	g.sent = append(g.sent, what)
}

type gatedConn struct {
	net.Conn
	g *endTxnGate

	mu   sync.Mutex
	left int // bytes of the current request frame still to come
}

const apiKeyEndTxn = 26

// Write follows the request frames (size, api key, version; kafka-go writes a request's head in
// one piece) and passes each EndTxn through the gate. EndTxn's last field is Committed, followed
// in the flexible versions (v3 and later) by an empty tagged-field section.
func (c *gatedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.left == 0 && len(b) >= 8 && binary.BigEndian.Uint16(b[4:]) == apiKeyEndTxn {
		what := "?"
		if size := 4 + int(binary.BigEndian.Uint32(b)); len(b) >= size {
			committed := b[size-1]
			if binary.BigEndian.Uint16(b[6:]) >= 3 {
				committed = b[size-2]
			}
			switch committed {
			case 0:
				what = "abort"
			case 1:
				what = "commit"
			}
		}
		c.mu.Unlock()
		c.g.pass(what)
		c.mu.Lock()
	}
	for rest := b; len(rest) > 0; {
		if c.left == 0 {
			if len(rest) < 4 {
				break
			}
			c.left = 4 + int(binary.BigEndian.Uint32(rest))
		}
		n := min(c.left, len(rest))
		c.left -= n
		rest = rest[n:]
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// visibilityAcker checks, at each acknowledgement, how far a read_committed reader can read.
type visibilityAcker struct {
	visible func() (int64, error) // the partition's last stable offset
	mu      sync.Mutex
	acks    []ackSeen
}

type ackSeen struct {
	n   int
	at  time.Time
	lso int64
	err error
}

func (a *visibilityAcker) Ack(n int) {
	at := time.Now()
	lso, err := a.visible()
	// An error says nothing either way (kafka-go's metadata may lag a moment): ask again, briefly.
	for deadline := time.Now().Add(time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		lso, err = a.visible()
	}
	a.mu.Lock()
	a.acks = append(a.acks, ackSeen{n: n, at: at, lso: lso, err: err})
	a.mu.Unlock()
}

func (a *visibilityAcker) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	sum := 0
	for _, s := range a.acks {
		sum += s.n
	}
	return sum
}

// early describes the acknowledgements that came while the last stable offset was below want
// (the events are at offsets 0 to want-1).
func (a *visibilityAcker) early(want int64) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, s := range a.acks {
		if s.err != nil || s.lso < want {
			out = append(out, fmt.Sprintf("%d at %s with the partition's LSO %d (%v)", s.n, s.at.Format("15:04:05.000"), s.lso, s.err))
		}
	}
	return out
}

// transactionCoordinator asks for the coordinator of a transactional id until there is one
// (__transaction_state is created by the first ask).
func transactionCoordinator(ctx context.Context, t *testing.T, client *kafka.Client, id string) int {
	t.Helper()
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var res *kafka.FindCoordinatorResponse
		res, err = client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: id, KeyType: kafka.CoordinatorKeyTypeTransaction})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			return res.Coordinator.NodeID
		}
	}
	t.Fatalf("find the transaction coordinator of %s: %v", id, err)
	return 0
}

// createTopicOn creates a topic of one partition whose only replica is on node, and waits until
// it has its leader.
func createTopicOn(ctx context.Context, t *testing.T, client *kafka.Client, topic string, node int, configs ...kafka.ConfigEntry) {
	t.Helper()
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: -1, ReplicationFactor: -1, ConfigEntries: configs,
		ReplicaAssignments: []kafka.ReplicaAssignment{{Partition: 0, Replicas: []int{node}}},
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic %s on node %d: %v", topic, node, err)
	}
	eventually(t, 30*time.Second, "topic "+topic+" has its leader", func() bool {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		return err == nil && len(md.Topics) == 1 && len(md.Topics[0].Partitions) == 1 &&
			md.Topics[0].Partitions[0].Leader.ID == node && md.Topics[0].Partitions[0].Leader.Host != ""
	})
}

// leaderless reports whether partition 0 of topic has no leader (kafka-go shows leader -1 as one
// without host).
func leaderless(ctx context.Context, client *kafka.Client, topic string) bool {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	return err == nil && len(md.Topics) == 1 && len(md.Topics[0].Partitions) == 1 && md.Topics[0].Partitions[0].Leader.Host == ""
}

// stableOffset returns partition 0's last stable offset: where a read_committed reader stops.
func stableOffset(ctx context.Context, client *kafka.Client, topic string) (int64, error) {
	return lastOffset(ctx, client, topic, kafka.ReadCommitted)
}

// highWatermarks returns the sum of the high watermarks of topic's partitions 0 to partitions-1:
// how many records were written to it, open transactions included.
func highWatermarks(ctx context.Context, client *kafka.Client, topic string, partitions int) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req := make([]kafka.OffsetRequest, partitions)
	for p := range req {
		req[p] = kafka.LastOffsetOf(p)
	}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: req}})
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return 0, p.Error
		}
		sum += p.LastOffset
	}
	if len(res.Topics[topic]) != partitions {
		return 0, fmt.Errorf("list offsets: %d of %d partitions answered", len(res.Topics[topic]), partitions)
	}
	return sum, nil
}

// highWatermark returns partition 0's high watermark: records of open transactions included.
func highWatermark(ctx context.Context, client *kafka.Client, topic string) (int64, error) {
	return lastOffset(ctx, client, topic, kafka.ReadUncommitted)
}

func lastOffset(ctx context.Context, client *kafka.Client, topic string, level kafka.IsolationLevel) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(0)}}, IsolationLevel: level})
	if err != nil {
		return 0, err
	}
	for _, p := range res.Topics[topic] {
		if p.Partition == 0 {
			return p.LastOffset, p.Error
		}
	}
	return 0, errors.New("list offsets: the response does not hold the partition")
}

// readCommittedCount reads partition 0 of topic as a read_committed consumer does and returns how
// many records it got, with the partition's LSO and high watermark.
func readCommittedCount(ctx context.Context, client *kafka.Client, topic string) (records int, lso, hw int64, err error) {
	for offset := int64(0); ; {
		fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		res, err := readcommitted.Fetch(fctx, client, topic, 0, offset, 1<<20, 50*time.Millisecond)
		cancel()
		if err != nil {
			return records, lso, hw, err
		}
		records += len(res.Records)
		lso, hw = res.LastStableOffset, res.HighWatermark
		if res.Next <= offset || res.Next >= lso {
			return records, lso, hw, nil
		}
		offset = res.Next
	}
}

// pollUntil polls cond every 50ms until it holds (true) or timeout passes (false).
func pollUntil(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// logLines logs the lines of the log file at path that hold needle.
func logLines(t *testing.T, path, needle string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("no log %s: %v", path, err)
		return
	}
	found := 0
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, needle) {
			t.Logf("%s: %s", path, strings.TrimSpace(line))
			found++
		}
	}
	if found == 0 {
		t.Logf("no line of %s mentions %q", path, needle)
	}
}

// TestAReadOfThePositionMidRunLeavesTheOpenTransactionAlone: the relay reads the position again
// after each reconnect to PostgreSQL, while the sink may hold an open Kafka transaction. What an
// earlier producer left is settled only at the first read: settling again (an empty commit on the
// positions partition, whose last stable offset another relay's open transaction holds down)
// committed the open transaction half-written, without its position and without acknowledging
// it, and the sink then failed (found in review).
func TestAReadOfThePositionMidRunLeavesTheOpenTransactionAlone(t *testing.T) {
	k := testenv.SharedKafka(t)
	cfgA := txnConfig(t, k, 40*time.Second, 1000)
	cfgA.Transactions.Linger = 40 * time.Second
	cfgB := cfgA
	txnB := *cfgA.Transactions
	txnB.ID = testenv.UniqueName(t, "txn-b")
	txnB.Timeout = 3 * time.Second
	cfgB.Transactions = &txnB
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	a := readySink(t, k.Brokers(), cfgA)
	sink.SetStableWait(a.Sink, 20*time.Second)
	if _, _, err := a.ReadPosition(ctx); err != nil { // the start's read
		t.Fatal(err)
	}
	b := readySink(t, k.Brokers(), cfgB)
	defer closeQuickly(b)
	// Another relay sharing the positions topic, killed between its position and its commit.
	if err := sink.OpenPositionTransaction(ctx, b.Sink, sink.Position{CommitLSN: 0x100, Events: 1}); err != nil {
		t.Fatal(err)
	}
	stream := newPGStream(100)
	acks := &acker{}
	for i := range 5 {
		a.publish(t, stream.next(fmt.Sprintf("order-%d", i)), acks)
	}
	// Written, not committed (Interval and Linger 40 s).
	topicClient := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 5 * time.Second}
	await.State(t, 30*time.Second, "the 5 events written to their topic", func() (bool, string) {
		hw, err := highWatermarks(ctx, topicClient, cfgA.Record.TopicTemplate, 3)
		return err == nil && hw >= 5, fmt.Sprintf("%d written (%v)", hw, err)
	})
	// A reconnect's read.
	if _, _, err := a.ReadPosition(ctx); err != nil {
		t.Fatal(err)
	}
	if got := committedFor(t, k.Brokers(), 2*time.Second, cfgA.Record.TopicTemplate); len(got) != 0 || acks.n.Load() != 0 {
		t.Fatalf("after a read of the position mid-run: %d records readable, %d acknowledged; want 0 and 0 (the transaction is open)", len(got), acks.n.Load())
	}
	for i := range 5 {
		a.publish(t, stream.next(fmt.Sprintf("order-%d", i)), acks)
	}
	a.Flush()
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	defer fcancel()
	if err := a.Close(fctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := a.Err(); err != nil {
		t.Fatalf("the sink failed: %v", err)
	}
	if got := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(10), cfgA.Record.TopicTemplate); len(got) != 10 || acks.n.Load() != 10 {
		t.Fatalf("after Close: %d records readable, %d acknowledged; want 10 and 10", len(got), acks.n.Load())
	}
}
