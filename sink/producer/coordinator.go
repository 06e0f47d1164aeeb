package producer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/endtxn"
)

// kafka-go's transport sends every transactional request (AddPartitionsToTxn, EndTxn) after a
// FindCoordinator of its own, since it does not cache the coordinator: two round trips where one
// does, several times per Kafka transaction. The requests below are the same messages (identical
// fields and versions) routed to a known broker instead, registered with kafka-go's protocol
// layer as type overrides (the mechanism its RawProduce uses). The coordinator is looked up once
// and again only after the broker says it moved or a request failed on the network.

const (
	addPartitionsOverride protocol.OverrideTypeKey = 0x4f52 // "OR"; kafka-go uses 0 (RawProduce)
	endTxnOverride        protocol.OverrideTypeKey = 0x4f53
)

func init() {
	// Protocol type registrations are process-wide in kafka-go (its own packages register in init).
	protocol.RegisterOverride(&addPartitionsRequest{}, &addpartitionstotxn.Response{}, addPartitionsOverride)
	protocol.RegisterOverride(&endTxnRequest{}, &endtxn.Response{}, endTxnOverride)
}

// addPartitionsRequest is addpartitionstotxn.Request sent to the broker coordinator.
type addPartitionsRequest struct {
	_ struct{} `kafka:"min=v3,max=v3,tag"`

	TransactionalID string                            `kafka:"min=v0,max=v2|min=v3,max=v3,compact"`
	ProducerID      int64                             `kafka:"min=v0,max=v3"`
	ProducerEpoch   int16                             `kafka:"min=v0,max=v3"`
	Topics          []addpartitionstotxn.RequestTopic `kafka:"min=v0,max=v3"`

	coordinator int32
}

func (r *addPartitionsRequest) ApiKey() protocol.ApiKey           { return protocol.AddPartitionsToTxn }
func (r *addPartitionsRequest) TypeKey() protocol.OverrideTypeKey { return addPartitionsOverride }
func (r *addPartitionsRequest) Broker(c protocol.Cluster) (protocol.Broker, error) {
	return coordinatorBroker(c, r.coordinator)
}

// endTxnRequest is endtxn.Request sent to the broker coordinator.
type endTxnRequest struct {
	_ struct{} `kafka:"min=v3,max=v3,tag"`

	TransactionalID string `kafka:"min=v0,max=v2|min=v3,max=v3,compact"`
	ProducerID      int64  `kafka:"min=v0,max=v3"`
	ProducerEpoch   int16  `kafka:"min=v0,max=v3"`
	Committed       bool   `kafka:"min=v0,max=v3"`

	coordinator int32
}

func (r *endTxnRequest) ApiKey() protocol.ApiKey           { return protocol.EndTxn }
func (r *endTxnRequest) TypeKey() protocol.OverrideTypeKey { return endTxnOverride }
func (r *endTxnRequest) Broker(c protocol.Cluster) (protocol.Broker, error) {
	return coordinatorBroker(c, r.coordinator)
}

var errCoordinatorUnknown = errors.New("the transaction coordinator is not among the known brokers")

func coordinatorBroker(c protocol.Cluster, id int32) (protocol.Broker, error) {
	b, ok := c.Brokers[id]
	if !ok {
		return protocol.Broker{}, errCoordinatorUnknown
	}
	return b, nil
}

// NewCoordinator returns the coordinator of transactional id id, looked up at the first request.
func NewCoordinator(client *kafka.Client, id string) *Coordinator {
	return &Coordinator{client: withTransport(client), id: id}
}

// Coordinator sends the transactional requests of one transactional id to its coordinator, which
// it looks up once and again only after it moved.
type Coordinator struct {
	client *kafka.Client
	id     string

	mu    sync.Mutex
	node  int32
	known bool
}

// get returns the coordinator's broker id, asking for it when it is not known.
func (c *Coordinator) get(ctx context.Context) (int32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known {
		return c.node, nil
	}
	res, err := c.client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: c.id, KeyType: kafka.CoordinatorKeyTypeTransaction})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return 0, fmt.Errorf("find the transaction coordinator: %w", err)
	}
	c.node, c.known = int32(res.Coordinator.NodeID), true
	return c.node, nil
}

// forget drops the cached coordinator after err, when err says it may have moved: the broker
// said so, or the request did not get an answer.
func (c *Coordinator) forget(err error) {
	var kerr kafka.Error
	if errors.As(err, &kerr) && kerr != kafka.NotCoordinatorForGroup && kerr != kafka.GroupCoordinatorNotAvailable {
		return
	}
	c.mu.Lock()
	c.known = false
	c.mu.Unlock()
}

// AddPartitions sends AddPartitionsToTxn to the coordinator once.
func (c *Coordinator) AddPartitions(ctx context.Context, ps State, tps map[TopicPartition]bool) error {
	node, err := c.get(ctx)
	if err != nil {
		return err
	}
	req := &addPartitionsRequest{TransactionalID: c.id, ProducerID: ps.ID, ProducerEpoch: ps.Epoch, coordinator: node}
	byTopic := make(map[string]int)
	for tp := range tps {
		i, ok := byTopic[tp.Topic]
		if !ok {
			i = len(req.Topics)
			byTopic[tp.Topic] = i
			req.Topics = append(req.Topics, addpartitionstotxn.RequestTopic{Name: tp.Topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, int32(tp.Partition))
	}
	m, err := c.client.Transport.RoundTrip(ctx, c.client.Addr, req)
	if err == nil {
		err = addResult(m.(*addpartitionstotxn.Response))
	}
	if err != nil {
		c.forget(err)
	}
	return err
}

// EndTxn sends EndTxn to the coordinator once.
func (c *Coordinator) EndTxn(ctx context.Context, ps State, commit bool) error {
	node, err := c.get(ctx)
	if err != nil {
		return err
	}
	m, err := c.client.Transport.RoundTrip(ctx, c.client.Addr, &endTxnRequest{
		TransactionalID: c.id, ProducerID: ps.ID, ProducerEpoch: ps.Epoch, Committed: commit, coordinator: node,
	})
	if err == nil {
		if code := m.(*endtxn.Response).ErrorCode; code != 0 {
			err = kafka.Error(code)
		}
	}
	if err != nil {
		c.forget(err)
	}
	return err
}

// TopicsRefusedError is an AddPartitionsToTxn answer refusing topics the relay may not write
// (TOPIC_AUTHORIZATION_FAILED); the broker attempted none of the request's other partitions.
type TopicsRefusedError struct{ Topics map[string]bool }

func (e *TopicsRefusedError) Error() string {
	names := make([]string, 0, len(e.Topics))
	for t := range e.Topics {
		names = append(names, t)
	}
	sort.Strings(names)
	return fmt.Sprintf("%v (topics %s)", kafka.TopicAuthorizationFailed, strings.Join(names, ", "))
}

func (e *TopicsRefusedError) Unwrap() error { return kafka.TopicAuthorizationFailed }

// addResult is the error of an AddPartitionsToTxn answer: the topics refused for authorization,
// or the first error, OPERATION_NOT_ATTEMPTED (the others were not tried because of it) last.
func addResult(res *addpartitionstotxn.Response) error {
	var notAttempted, first error
	var refused map[string]bool
	for _, t := range res.Results {
		for _, p := range t.Results {
			if p.ErrorCode == 0 {
				continue
			}
			err := kafka.Error(p.ErrorCode)
			switch {
			case err == kafka.TopicAuthorizationFailed:
				if refused == nil {
					refused = make(map[string]bool)
				}
				refused[t.Name] = true
			case err == ErrOperationNotAttempted:
				notAttempted = err
			case first == nil:
				first = err
			}
		}
	}
	switch {
	case first != nil:
		return first
	case refused != nil:
		return &TopicsRefusedError{Topics: refused}
	}
	return notAttempted
}
