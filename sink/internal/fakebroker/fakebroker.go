// Package fakebroker is a Kafka broker for tests of the sink and its producer: it speaks just
// enough of the protocol to answer with the error codes a real broker returns only in rare
// moments, and logs what it was sent. Tests only.
package fakebroker

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/findcoordinator"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"

	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Broker speaks just enough of the Kafka protocol (ApiVersions, Metadata, Produce and SASL
// PLAIN), encoded with kafka-go's protocol package, to answer with an error code a real broker
// returns only in rare moments (a restart, a credential rotation). It isolates the classification
// of those codes; the real-broker tests prove the rest. Every topic has one partition on it.
type Broker struct {
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
	batches    []Batch
}

// Batch is what a produce request's batch said about its producer.
type Batch struct {
	Topic      string
	Partition  int32
	ProducerID int64
	Epoch      int16
	Seq        int32
	IDs        []string
	Code       int16 // the answer
}

func (b Batch) String() string {
	return fmt.Sprintf("%v pid %d epoch %d seq %d -> %d", b.IDs, b.ProducerID, b.Epoch, b.Seq, b.Code)
}

func (fb *Broker) Requests() [][]string {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return slices.Clone(fb.requests)
}

func (fb *Broker) Batches() []Batch {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return append([]Batch(nil), fb.batches...)
}

func New(t testing.TB) *Broker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fb := &Broker{ln: ln}
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

func (fb *Broker) Addr() string { return fb.ln.Addr().String() }

// Script makes the next n requests of one kind fail with code.
func (fb *Broker) Script(produce, metadata, auth int, code kafka.Error) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.failProduce, fb.failMetadata, fb.failAuth, fb.code = produce, metadata, auth, int16(code)
}

func (fb *Broker) State() (stored []string, pendingFailures int) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return append([]string(nil), fb.stored...), fb.failProduce + fb.failMetadata + fb.failAuth
}

// take returns the code for this request kind: the scripted error while any are left, else 0.
func (fb *Broker) take(left *int) int16 {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if *left > 0 {
		*left--
		return fb.code
	}
	return 0
}

func (fb *Broker) serve(c net.Conn) {
	defer c.Close()
	host, portText, _ := net.SplitHostPort(fb.Addr())
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
			res = fb.metadata(req, host, port)
		case *produce.Request:
			res = fb.produce(req)
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

// SetIdempotent makes the broker offer InitProducerId, or not (offered), and answer it with
// initCode; producer ids go from 1000 on, epoch 0.
func (fb *Broker) SetIdempotent(offered bool, initCode kafka.Error) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.idempotent, fb.initCode = offered, int16(initCode)
}

// SetPlan answers each partition's batch of a produce request, given its records' "topic/id"s,
// with plan's error code, or with the scripted answer where plan returns 0. It is called with the
// broker's lock held.
func (fb *Broker) SetPlan(plan func(ids []string) int16) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.plan = plan
}

// RefuseID makes every produce request that holds the record id of topic events fail with the
// scripted code (Script).
func (fb *Broker) RefuseID(id string) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.refuseID = id
}

// Producers is how many InitProducerId requests the broker answered.
func (fb *Broker) Producers() int {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return fb.producers
}

// metadata answers a metadata request: every topic has one partition, led by this broker, unless
// a metadata failure is scripted.
func (fb *Broker) metadata(req *metadata.Request, host string, port int32) *metadata.Response {
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
	return r
}

// produce answers each partition of a produce request on its own, as scripted, and logs what it
// held.
func (fb *Broker) produce(req *produce.Request) *produce.Response {
	code := fb.take(&fb.failProduce)
	r := &produce.Response{}
	var inRequest []string
	var stored []string
	var batches []Batch
	fb.mu.Lock()
	for _, t := range req.Topics {
		rt := produce.ResponseTopic{Topic: t.Topic}
		for _, p := range t.Partitions {
			inRequest = append(inRequest, fmt.Sprintf("%s/%d", t.Topic, p.Partition))
			b := Batch{Topic: t.Topic, Partition: p.Partition}
			if stream, ok := p.RecordSet.Records.(*protocol.RecordStream); ok && len(stream.Records) > 0 {
				if rb, ok := stream.Records[0].(*protocol.RecordBatch); ok {
					b.ProducerID, b.Epoch, b.Seq = rb.ProducerID, rb.ProducerEpoch, rb.BaseSequence
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
						b.IDs = append(b.IDs, string(h.Value))
					}
				}
			}
			// Like a real broker, it answers each partition on its own.
			b.Code = code
			if fb.plan != nil {
				if c := fb.plan(ids); c != 0 {
					b.Code = c
				}
			}
			if fb.refuseID != "" && slices.Contains(ids, "events/"+fb.refuseID) {
				b.Code = fb.code
			}
			if b.Code == 0 {
				stored = append(stored, ids...)
			}
			rt.Partitions = append(rt.Partitions, produce.ResponsePartition{Partition: p.Partition, ErrorCode: b.Code})
			batches = append(batches, b)
		}
		r.Topics = append(r.Topics, rt)
	}
	fb.produced++
	fb.stored = append(fb.stored, stored...)
	fb.batches = append(fb.batches, batches...)
	fb.requests = append(fb.requests, inRequest)
	fb.mu.Unlock()
	return r
}
