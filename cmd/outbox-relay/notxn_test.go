package main

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/findcoordinator"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// noTxnBroker speaks just enough of the Kafka protocol (kafka-go's protocol package) to be a broker
// on which transactions never work: one that does not offer them at all (offerTxn false: an old
// broker, or a proxy that filters the APIs), or one whose transaction coordinator never becomes
// available (initCode COORDINATOR_NOT_AVAILABLE, what a single broker answers when the transaction
// state topic asks for more replicas than there are brokers). A fake isolates this one corner; the
// real-broker tests prove the rest.
type noTxnBroker struct {
	ln       net.Listener
	offerTxn bool
	initCode kafka.Error
}

func newNoTxnBroker(t *testing.T, offerTxn bool, initCode kafka.Error) *noTxnBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &noTxnBroker{ln: ln, offerTxn: offerTxn, initCode: initCode}
	var wg sync.WaitGroup
	var conns sync.Map
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			wg.Go(func() { b.serve(c); conns.Delete(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	return b
}

func (b *noTxnBroker) serve(c net.Conn) {
	defer c.Close()
	host, portText, _ := net.SplitHostPort(b.ln.Addr().String())
	var port int32
	fmt.Sscan(portText, &port)
	for {
		version, correlation, _, msg, err := protocol.ReadRequest(c)
		if err != nil {
			return
		}
		var res protocol.Message
		switch req := msg.(type) {
		case *apiversions.Request:
			offered := map[protocol.ApiKey]int16{protocol.ApiVersions: 2, protocol.Metadata: 8, protocol.Produce: 8}
			if b.offerTxn {
				offered[protocol.FindCoordinator] = 1
				offered[protocol.InitProducerId] = 3
				offered[protocol.AddPartitionsToTxn] = 1
				offered[protocol.EndTxn] = 1
			}
			var keys []apiversions.ApiKeyResponse
			for k, v := range offered {
				keys = append(keys, apiversions.ApiKeyResponse{ApiKey: int16(k), MinVersion: k.MinVersion(), MaxVersion: v})
			}
			res = &apiversions.Response{ApiKeys: keys}
		case *findcoordinator.Request:
			res = &findcoordinator.Response{NodeID: 1, Host: host, Port: port}
		case *initproducerid.Request:
			res = &initproducerid.Response{ErrorCode: int16(b.initCode), ProducerID: -1, ProducerEpoch: -1}
		case *metadata.Request:
			r := &metadata.Response{Brokers: []metadata.ResponseBroker{{NodeID: 1, Host: host, Port: port}}, ControllerID: 1}
			for _, topic := range req.TopicNames {
				r.Topics = append(r.Topics, metadata.ResponseTopic{Name: topic,
					Partitions: []metadata.ResponsePartition{{PartitionIndex: 0, LeaderID: 1, ReplicaNodes: []int32{1}, IsrNodes: []int32{1}}}})
			}
			res = r
		default:
			return // nothing else is needed before the relay gives up or waits
		}
		if err := protocol.WriteResponse(c, version, correlation, res); err != nil {
			return
		}
	}
}

func TestExactlyOnceWithoutTransactionsOnTheBrokerIsAClearErrorNeverAFallback(t *testing.T) {
	t.Parallel()
	pg := testenv.SharedPostgres(t)

	t.Run("a broker that does not offer transactions ends the relay with the fix", func(t *testing.T) {
		t.Parallel()
		b := newNoTxnBroker(t, false, 0)
		f := newHAFixture(t, pg, b.ln.Addr().String(), 1)
		code, out := relayproc.Run(t, relayproc.Options{Env: f.eosRunEnv("relay-notxn", nil)}, 2*time.Minute)
		if code != 1 {
			t.Fatalf("exit status %d, want 1:\n%s", code, out)
		}
		last := lastLine(out)
		for _, want := range []string{"exactly-once delivery needs transactions", "TransactionalId"} {
			if !strings.Contains(last, want) {
				t.Errorf("last line lacks %q: %s", want, last)
			}
		}
		t.Logf("fatal line: %s", last)
	})

	t.Run("a transaction coordinator that never becomes available is an error naming the broker settings, and nothing is published", func(t *testing.T) {
		t.Parallel()
		b := newNoTxnBroker(t, true, kafka.GroupCoordinatorNotAvailable)
		f := newHAFixture(t, pg, b.ln.Addr().String(), 1)
		r := f.start("relay-nocoord", eosEnv(nil))
		l := r.waitLog(t, 2*time.Minute, "error", "Kafka has not given the relay a transactional producer")
		msg, _ := l["msg"].(string)
		for _, want := range []string{"COORDINATOR_NOT_AVAILABLE", "transaction.state.log.replication.factor", "never falls back to at-least-once"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error lacks %q: %s", want, msg)
			}
		}
		if strings.Contains(r.Output(), `"msg":"streaming"`) {
			t.Errorf("the relay streamed without a transactional producer:\n%s", r.Output())
		}
		r.stop(t)
	})
}
