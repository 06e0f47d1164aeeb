package sink_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/findcoordinator"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"
	"github.com/segmentio/kafka-go/sasl/plain"

	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// fakeBroker speaks just enough of the Kafka protocol (ApiVersions, Metadata, Produce and SASL
// PLAIN), encoded with kafka-go's protocol package, to answer with an error code a real broker
// returns only in rare moments (a restart, a credential rotation). It isolates the classification
// of those codes; the real-broker tests prove the rest. Every topic has one partition on it.
type fakeBroker struct {
	ln net.Listener

	mu sync.Mutex
	// failProduce and failAuth are how many produce requests (metadata lookups, SASL
	// authentications) still fail, and with what code.
	failProduce, failMetadata, failAuth int
	code                                int16
	refuseID                            string     // a record id whose produce requests always fail with code
	stored                              []string   // ids of the records it acknowledged, in order
	produced                            int        // produce requests answered
	requests                            [][]string // per produce request, the "topic/partition"s it held
	// plan answers each partition's batch of a produce request (its records' "topic/id"s): an
	// error code, or 0 for the scripted answer.
	plan func(ids []string) int16
	// idempotent makes the broker offer InitProducerId (producer ids from 1000 on, epoch 0);
	// batches lists the header of every batch produced to it, answered with an error or not.
	idempotent bool
	initCode   int16 // the answer to InitProducerId
	producers  int
	batches    []fakeBatch
}

// fakeBatch is what a produce request's batch said about its producer.
type fakeBatch struct {
	topic      string
	partition  int32
	producerID int64
	epoch      int16
	seq        int32
	ids        []string
	code       int16 // the answer
}

func (b fakeBatch) String() string {
	return fmt.Sprintf("%v pid %d epoch %d seq %d -> %d", b.ids, b.producerID, b.epoch, b.seq, b.code)
}

func (fb *fakeBroker) requestLog() [][]string {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return slices.Clone(fb.requests)
}

func (fb *fakeBroker) produceLog() []fakeBatch {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return append([]fakeBatch(nil), fb.batches...)
}

func newFakeBroker(t *testing.T) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fb := &fakeBroker{ln: ln}
	var wg sync.WaitGroup
	var conns sync.Map
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			wg.Go(func() { fb.serve(c); conns.Delete(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	return fb
}

func (fb *fakeBroker) addr() string { return fb.ln.Addr().String() }

// script makes the next n requests of one kind fail with code.
func (fb *fakeBroker) script(produce, metadata, auth int, code kafka.Error) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.failProduce, fb.failMetadata, fb.failAuth, fb.code = produce, metadata, auth, int16(code)
}

func (fb *fakeBroker) state() (stored []string, pendingFailures int) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return append([]string(nil), fb.stored...), fb.failProduce + fb.failMetadata + fb.failAuth
}

// take returns the code for this request kind: the scripted error while any are left, else 0.
func (fb *fakeBroker) take(left *int) int16 {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if *left > 0 {
		*left--
		return fb.code
	}
	return 0
}

func (fb *fakeBroker) serve(c net.Conn) {
	defer c.Close()
	host, portText, _ := net.SplitHostPort(fb.addr())
	var port int32
	fmt.Sscan(portText, &port)
	for {
		version, correlation, _, msg, err := protocol.ReadRequest(c)
		if err != nil {
			return
		}
		var res protocol.Message
		closeAfter := false
		switch req := msg.(type) {
		case *apiversions.Request:
			var keys []apiversions.ApiKeyResponse
			offered := []protocol.ApiKey{protocol.ApiVersions, protocol.Metadata, protocol.Produce, protocol.SaslHandshake, protocol.SaslAuthenticate}
			fb.mu.Lock()
			if fb.idempotent {
				offered = append(offered, protocol.InitProducerId, protocol.FindCoordinator)
			}
			fb.mu.Unlock()
			for _, k := range offered {
				keys = append(keys, apiversions.ApiKeyResponse{ApiKey: int16(k), MinVersion: k.MinVersion(), MaxVersion: min(k.MaxVersion(), maxVersion(k))})
			}
			res = &apiversions.Response{ApiKeys: keys}
		case *findcoordinator.Request: // kafka-go asks before InitProducerId, transactional id or not
			res = &findcoordinator.Response{NodeID: 1, Host: host, Port: port}
		case *initproducerid.Request:
			fb.mu.Lock()
			res = &initproducerid.Response{ProducerID: int64(1000 + fb.producers), ErrorCode: fb.initCode}
			fb.producers++
			fb.mu.Unlock()
		case *saslhandshake.Request:
			res = &saslhandshake.Response{Mechanisms: []string{"PLAIN"}}
		case *saslauthenticate.Request:
			code := fb.take(&fb.failAuth)
			res = &saslauthenticate.Response{ErrorCode: code}
			closeAfter = code != 0 // a broker drops the connection after a failed authentication
		case *metadata.Request:
			r := &metadata.Response{Brokers: []metadata.ResponseBroker{{NodeID: 1, Host: host, Port: port}}, ControllerID: 1}
			code := fb.take(&fb.failMetadata)
			topics := req.TopicNames
			if topics == nil { // the transport's own lookup: every topic
				topics = []string{"events", "dlq", "A", "B", "C"}
			}
			for _, topic := range topics {
				rt := metadata.ResponseTopic{Name: topic, ErrorCode: code}
				if code == 0 {
					rt.Partitions = []metadata.ResponsePartition{{PartitionIndex: 0, LeaderID: 1, ReplicaNodes: []int32{1}, IsrNodes: []int32{1}}}
				}
				r.Topics = append(r.Topics, rt)
			}
			res = r
		case *produce.Request:
			code := fb.take(&fb.failProduce)
			r := &produce.Response{}
			var inRequest []string
			var stored []string
			var batches []fakeBatch
			fb.mu.Lock()
			for _, t := range req.Topics {
				rt := produce.ResponseTopic{Topic: t.Topic}
				for _, p := range t.Partitions {
					inRequest = append(inRequest, fmt.Sprintf("%s/%d", t.Topic, p.Partition))
					b := fakeBatch{topic: t.Topic, partition: p.Partition}
					if stream, ok := p.RecordSet.Records.(*protocol.RecordStream); ok && len(stream.Records) > 0 {
						if rb, ok := stream.Records[0].(*protocol.RecordBatch); ok {
							b.producerID, b.epoch, b.seq = rb.ProducerID, rb.ProducerEpoch, rb.BaseSequence
						}
					}
					var ids []string
					for {
						rec, err := p.RecordSet.Records.ReadRecord()
						if err != nil {
							break
						}
						for _, h := range rec.Headers {
							if h.Key == record.HeaderID {
								ids = append(ids, t.Topic+"/"+string(h.Value))
								b.ids = append(b.ids, string(h.Value))
							}
						}
					}
					// Like a real broker, it answers each partition on its own.
					b.code = code
					if fb.plan != nil {
						if c := fb.plan(ids); c != 0 {
							b.code = c
						}
					}
					if fb.refuseID != "" && slices.Contains(ids, "events/"+fb.refuseID) {
						b.code = fb.code
					}
					if b.code == 0 {
						stored = append(stored, ids...)
					}
					rt.Partitions = append(rt.Partitions, produce.ResponsePartition{Partition: p.Partition, ErrorCode: b.code})
					batches = append(batches, b)
				}
				r.Topics = append(r.Topics, rt)
			}
			fb.produced++
			fb.stored = append(fb.stored, stored...)
			fb.batches = append(fb.batches, batches...)
			fb.requests = append(fb.requests, inRequest)
			fb.mu.Unlock()
			res = r
		default:
			return
		}
		if err := protocol.WriteResponse(c, version, correlation, res); err != nil || closeAfter {
			return
		}
	}
}

// maxVersion keeps the fake on the non-flexible versions its answers are written for.
func maxVersion(k protocol.ApiKey) int16 {
	switch k {
	case protocol.ApiVersions:
		return 2
	case protocol.Metadata, protocol.Produce:
		return 8
	}
	return 1
}

// TestSinkRetriesBrokerErrorsThatAreNotAboutTheRecord: error codes kafka-go does not mark temporary
// but that say nothing about the record (a broker restarting, a credential or ACL rotation) must be
// retried in place, never dead-lettered or halted on; a record-level code must still go to the
// policy.
func TestSinkRetriesBrokerErrorsThatAreNotAboutTheRecord(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		produce, metadata, auth int
		code                    kafka.Error
		deadLettered            bool // code refuses e0 for good
	}{
		{"broker not available on produce", 3, 0, 0, kafka.BrokerNotAvailable, false},
		{"replica not available on produce", 3, 0, 0, kafka.ReplicaNotAvailable, false},
		{"the unknown server error on produce", 3, 0, 0, kafka.Unknown, false},
		{"topic authorization failed on produce (an ACL rotation)", 3, 0, 0, kafka.TopicAuthorizationFailed, false},
		{"cluster authorization failed on produce", 3, 0, 0, kafka.ClusterAuthorizationFailed, false},
		{"topic authorization failed on the partition lookup", 0, 3, 0, kafka.TopicAuthorizationFailed, false},
		{"broker not available on the partition lookup", 0, 3, 0, kafka.BrokerNotAvailable, false},
		{"SASL authentication failed (a credential rotation)", 0, 0, 3, kafka.SASLAuthenticationFailed, false},
		{"an invalid record still goes to the dead-letter topic", 0, 0, 0, kafka.InvalidRecord, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := newFakeBroker(t)
			s := newSink(t, "", sink.Config{
				Brokers: []string{fb.addr()}, Record: record.Options{TopicTemplate: "events"}, DeadLetterTopic: "dlq",
				SASL: plain.Mechanism{Username: "relay", Password: "secret"}, Linger: -1, WriteTimeout: 5 * time.Second,
			})
			fb.script(tt.produce, tt.metadata, tt.auth, tt.code)
			if tt.deadLettered {
				fb.refuseID = "e0"
			}
			a := &acker{}
			const n = 3
			for i := range n {
				s.publish(t, newEvent(fmt.Sprintf("e%d", i), []byte("Order"), "order-1", "Changed", []byte(`{}`)), a)
			}
			eventually(t, 60*time.Second, "every event settled", func() bool { return a.n.Load() == n })
			s.mustClose(t)
			stored, left := fb.state()
			if left != 0 {
				t.Fatalf("%d scripted failures never happened: the test did not test", left)
			}
			// Order holds within a topic; the dead-letter topic is another topic.
			want := "events/e0,events/e1,events/e2"
			if tt.deadLettered {
				want = "events/e1,events/e2,dlq/e0"
				slices.SortStableFunc(stored, func(a, b string) int { return strings.Compare(b[:3], a[:3]) })
				if got := s.metric(t, "outbox_relay_events_dead_lettered_total"); got != 1 {
					t.Errorf("events_dead_lettered_total = %v, want 1", got)
				}
			} else {
				if got := s.metric(t, "outbox_relay_events_failed_total"); got != 0 {
					t.Errorf("events_failed_total = %v, want 0: %v is not about the record", got, tt.code)
				}
				if got := s.metric(t, "outbox_relay_kafka_retries_total"); got < 1 {
					t.Errorf("kafka_retries_total = %v, want retries", got)
				}
			}
			if _, _, _, halted := s.Halted(); halted {
				t.Error("the sink halted")
			}
			if got := strings.Join(stored, ","); got != want {
				t.Errorf("the broker stored %s, want %s", got, want)
			}
		})
	}
}

// Refusals of two partitions arrive out of publish order: b1 (topic B, key K) is retried after
// transient errors and refused last, a1 (topic A, published after b1 and b2) is refused at once.
// The halt must hold at b1, the earliest, so key K's b2 never reaches Kafka without b1.
func TestAHaltHoldsAtTheEarliestRefusedRecordWhateverOrderRefusalsArriveIn(t *testing.T) {
	fb := newFakeBroker(t)
	var mu sync.Mutex
	attemptsB1 := 0
	fb.mu.Lock()
	fb.plan = func(ids []string) int16 {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case slices.Contains(ids, "B/b1"):
			attemptsB1++
			if attemptsB1 <= 2 {
				return int16(kafka.NotEnoughReplicas) // transient: b1 is retried in place
			}
			return int16(kafka.InvalidRecord)
		case slices.Contains(ids, "A/a1"):
			return int16(kafka.InvalidRecord)
		}
		return 0
	}
	fb.mu.Unlock()
	s := newHaltingSink(t, fb)
	a := &acker{}
	s.publish(t, newEvent("b1", []byte("B"), "K", "X", []byte(`{}`)), a)
	time.Sleep(50 * time.Millisecond)
	s.publish(t, newEvent("b2", []byte("B"), "K", "X", []byte(`{}`)), a)
	s.publish(t, newEvent("a1", []byte("A"), "J", "X", []byte(`{}`)), a)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		refused := attemptsB1 > 2
		mu.Unlock()
		if refused || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // time for anything wrongly released to be sent
	stored, _ := fb.state()
	id, _, _, halted := s.Halted()
	if !halted || id != "b1" {
		t.Errorf("halted on %q (halted %v), want b1, the earliest refused event", id, halted)
	}
	if slices.Contains(stored, "B/b2") {
		t.Errorf("key K's b2 reached Kafka without b1: %v", stored)
	}
	if n := a.n.Load(); n != 0 {
		t.Errorf("%d events acknowledged, want none: each is the halted one or behind it", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.close(ctx)
}

// TestAHaltedSinkClosesWithoutWaitingForARecordBehindTheHalt: a record published after the one
// the sink halts on may already be on its way to another partition, and be retried there (under
// exactly-once the halt aborts its transaction, and the broker refuses the retry for ever). It is
// never acknowledged (the slot stays before the halted record), so nothing waits for it: Close
// returns at once, where it waited for its whole deadline (a halted relay's stop took its
// shutdown_timeout).
func TestAHaltedSinkClosesWithoutWaitingForARecordBehindTheHalt(t *testing.T) {
	fb := newFakeBroker(t)
	var b1Sent atomic.Bool
	fb.mu.Lock()
	fb.plan = func(ids []string) int16 {
		switch {
		case slices.Contains(ids, "B/b1"):
			b1Sent.Store(true)
			return int16(kafka.NotEnoughReplicas) // transient, for ever: retried in place
		case slices.Contains(ids, "A/a1") && b1Sent.Load():
			return int16(kafka.InvalidRecord) // refused for good: the halt, once b1 is out
		case slices.Contains(ids, "A/a1"):
			return int16(kafka.NotEnoughReplicas) // until then, a Publish of b1 is not held by the halt
		}
		return 0
	}
	fb.mu.Unlock()
	s := newHaltingSink(t, fb)
	a := &acker{}
	s.publish(t, newEvent("a1", []byte("A"), "J", "X", []byte(`{}`)), a)
	s.publish(t, newEvent("b1", []byte("B"), "K", "X", []byte(`{}`)), a)
	deadline := time.Now().Add(10 * time.Second)
	for _, _, _, halted := s.Halted(); !halted; _, _, _, halted = s.Halted() {
		if time.Now().After(deadline) {
			t.Fatal("the sink did not halt on a1 within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // b1 is retried meanwhile, or withheld
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_ = s.close(ctx)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close of the halted sink took %s: it waited for b1, which is behind the halt", took.Round(time.Millisecond))
	}
	if n := a.n.Load(); n != 0 {
		t.Errorf("%d events acknowledged, want none: a1 is the halted one and b1 is behind it", n)
	}
}

// newHaltingSink is a sink on fb that halts on a refused record, topics named by aggregate type,
// every record sent at once.
func newHaltingSink(t *testing.T, fb *fakeBroker) *testSink {
	return newSink(t, "", sink.Config{
		Brokers: []string{fb.addr()}, Record: record.Options{TopicTemplate: "{aggregate_type}"}, DeadLetterTopic: "dlq",
		Policy: sink.Halt, Linger: -1, WriteTimeout: 5 * time.Second,
	})
}
