package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// replicated are the server.properties of a three-broker cluster: every topic, the internal ones
// too, on every broker, and a write acknowledged by two of them at least, as production runs
// Kafka. A broker-only node's heartbeat every 500 ms (devenv's) is node 1's too, and the
// controller fences a broker whose heartbeats stop for 4.5 s (broker.session.timeout.ms; 9 s by
// default): a killed broker's leaderships move sooner, and a broker frozen past it fences itself
// on waking (docs/guarantees.md, "Lost transaction markers").
var replicated = map[string]string{
	"default.replication.factor":                       "3",
	"min.insync.replicas":                              "2",
	"offsets.topic.replication.factor":                 "3",
	"transaction.state.log.replication.factor":         "3",
	"transaction.state.log.min.isr":                    "2",
	"share.coordinator.state.topic.replication.factor": "3",
	"share.coordinator.state.topic.min.isr":            "2",
	"unclean.leader.election.enable":                   "false",
	"broker.heartbeat.interval.ms":                     "500",
	"broker.session.timeout.ms":                        "4500",
}

// brokerHeapMB is a broker's JVM heap in a three-broker cluster: the chaos workload is small, and
// three JVMs share a machine with PostgreSQL and the relays.
const brokerHeapMB = 256

// brokerDir is node id's directory (and, with .log, its log's name) under Options.Dir.
func brokerDir(id int) string {
	if id == 1 {
		return "kafka"
	}
	return "kafka" + strconv.Itoa(id)
}

// startKafka starts node 1 and, with three brokers, then nodes 2 and 3 side by side; listeners
// are each broker's clients' listeners.
func (c *Cluster) startKafka(ctx context.Context, listeners [][]devenv.KafkaListener) error {
	start := time.Now()
	settings, heap := c.o.KafkaSettings, 0
	if c.o.Brokers > 1 {
		settings = maps.Clone(replicated)
		maps.Copy(settings, c.o.KafkaSettings)
		heap = brokerHeapMB
	}
	first, err := devenv.StartKafka(ctx, devenv.KafkaOptions{Dir: filepath.Join(c.dir, brokerDir(1)),
		PlaintextListeners: listeners[0], Settings: settings, HeapMB: heap})
	if err != nil {
		return err
	}
	c.kafka = first
	c.brokers = make([]*devenv.Kafka, c.o.Brokers)
	c.brokers[0] = first
	c.logf("kafka on %s started in %v (node 1)", first.Brokers(), time.Since(start).Round(time.Millisecond))
	var wg sync.WaitGroup
	errs := make([]error, c.o.Brokers)
	for i := 1; i < c.o.Brokers; i++ {
		wg.Go(func() {
			bstart := time.Now()
			k, err := first.StartBroker(ctx, devenv.KafkaOptions{Dir: filepath.Join(c.dir, brokerDir(i+1)), NodeID: i + 1,
				PlaintextListeners: listeners[i], Settings: settings, HeapMB: heap})
			if err != nil {
				errs[i] = fmt.Errorf("kafka node %d: %w", i+1, err)
				return
			}
			c.brokers[i] = k
			c.logf("kafka node %d on %s started in %v", i+1, k.Brokers(), time.Since(bstart).Round(time.Millisecond))
		})
	}
	wg.Wait()
	// A broker that did not start is no member of the cluster: Close stops the others.
	c.brokers = slices.DeleteFunc(c.brokers, func(k *devenv.Kafka) bool { return k == nil })
	return errors.Join(errs...)
}

// Nodes returns the brokers' node ids: 1, or 1, 2 and 3. Node 1 is the KRaft controller.
func (c *Cluster) Nodes() []int {
	ids := make([]int, len(c.brokers))
	for i, k := range c.brokers {
		ids[i] = k.NodeID()
	}
	return ids
}

// node returns broker id; an id not in Nodes is a bug of the caller.
func (c *Cluster) node(id int) *devenv.Kafka {
	if id < 1 || id > len(c.brokers) {
		panic(fmt.Sprintf("cluster: no Kafka node %d (nodes 1 to %d)", id, len(c.brokers)))
	}
	return c.brokers[id-1]
}

// StopNode stops broker id (SIGTERM: a controlled shutdown that first hands its leaderships to
// other replicas; SIGKILL after 30 s).
func (c *Cluster) StopNode(ctx context.Context, id int) error { return c.node(id).Stop(ctx) }

// KillNode SIGKILLs broker id: no controlled shutdown, its leaderships move once the controller
// misses its heartbeats (broker.session.timeout.ms, 9 s).
func (c *Cluster) KillNode(id int) error { return c.node(id).Kill() }

// StartNode starts the stopped or killed broker id on the same ports and data and waits until it
// is registered and its partitions have leaders.
func (c *Cluster) StartNode(ctx context.Context, id int) error { return c.node(id).Start(ctx) }

// PauseNode freezes broker id (SIGSTOP): connections are accepted, nothing answers.
func (c *Cluster) PauseNode(id int) error { return c.node(id).Pause() }

// ResumeNode continues a paused broker id (SIGCONT).
func (c *Cluster) ResumeNode(id int) error { return c.node(id).Resume() }

// NodeRunning reports whether broker id's process runs (also while paused).
func (c *Cluster) NodeRunning(id int) bool { return c.node(id).Running() }

// adminTimeout bounds one admin request and the wait for what it changed.
const adminTimeout = 30 * time.Second

func (c *Cluster) admin() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(strings.Split(c.Brokers(), ",")...), Timeout: adminTimeout}
}

// Leadership says what a broker leads at one moment, read from the metadata.
type Leadership struct {
	Node       int
	Leads      int // partitions it leads, of Partitions
	Partitions int // every partition, internal topics' too
	// Coordinator: it leads a partition of __transaction_state, so it coordinates transactions.
	Coordinator bool
}

func (l Leadership) String() string {
	s := fmt.Sprintf("node %d, leader of %d of %d partitions", l.Node, l.Leads, l.Partitions)
	if l.Coordinator {
		s += ", a transaction coordinator"
	}
	if l.Node == 1 {
		s += ", the controller"
	}
	return s
}

// LeadershipOf reads from the metadata what broker id leads now.
func (c *Cluster) LeadershipOf(ctx context.Context, id int) (Leadership, error) {
	l := Leadership{Node: id}
	md, err := c.admin().Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return l, fmt.Errorf("cluster: leaderships: metadata: %w", err)
	}
	for _, t := range md.Topics {
		for _, p := range t.Partitions {
			l.Partitions++
			if p.Leader.ID == id {
				l.Leads++
				l.Coordinator = l.Coordinator || t.Name == transactionState
			}
		}
	}
	return l, nil
}

// transactionState is Kafka's internal topic of transactions: the leader of the partition a
// transactional id hashes to is that id's transaction coordinator.
const transactionState = "__transaction_state"

// TransactionCoordinator returns the broker that coordinates transactionalID's transactions now.
func (c *Cluster) TransactionCoordinator(ctx context.Context, transactionalID string) (int, error) {
	resp, err := c.admin().FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: transactionalID,
		KeyType: kafka.CoordinatorKeyTypeTransaction})
	if err == nil {
		err = resp.Error
	}
	if err != nil {
		return 0, fmt.Errorf("cluster: transaction coordinator of %q: %w", transactionalID, err)
	}
	if resp.Coordinator == nil {
		return 0, fmt.Errorf("cluster: transaction coordinator of %q: none in the answer", transactionalID)
	}
	return resp.Coordinator.NodeID, nil
}

// LeaderMove is one partition's leadership moved by MoveLeaders.
type LeaderMove struct {
	Topic     string
	Partition int
	From, To  int
}

// MoveLeaders moves the leadership of every partition of the topics that pick accepts to another
// in-sync replica, as an operator's preferred-leader election does: the partition's replicas are
// reordered (the same replicas, so no data moves) to name the new leader first, and a preferred
// election is run. It returns once the metadata names every new leader (30 s at most), or with the
// moves done so far and the step that failed. Partitions with a single in-sync replica keep theirs.
func (c *Cluster) MoveLeaders(ctx context.Context, pick func(topic string) bool) ([]LeaderMove, error) {
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	client := c.admin()
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("cluster: move leaders: metadata: %w", err)
	}
	var moves []LeaderMove
	var assign []kafka.AlterPartitionReassignmentsRequestAssignment
	elect := map[string][]int{}
	for _, t := range md.Topics {
		if !pick(t.Name) {
			continue
		}
		for _, p := range t.Partitions {
			to := -1
			for _, r := range p.Isr { // the next in-sync replica after the leader, in replica order
				if r.ID != p.Leader.ID && (to < 0 || after(p.Replicas, p.Leader.ID, r.ID) < after(p.Replicas, p.Leader.ID, to)) {
					to = r.ID
				}
			}
			if to < 0 || p.Leader.ID < 0 {
				continue
			}
			order, err := reorder(p.Replicas, to, c.Nodes())
			if err != nil {
				return nil, fmt.Errorf("cluster: move leaders: %s/%d: %w", t.Name, p.ID, err)
			}
			moves = append(moves, LeaderMove{Topic: t.Name, Partition: p.ID, From: p.Leader.ID, To: to})
			assign = append(assign, kafka.AlterPartitionReassignmentsRequestAssignment{Topic: t.Name, PartitionID: p.ID, BrokerIDs: order})
			elect[t.Name] = append(elect[t.Name], p.ID)
		}
	}
	if len(moves) == 0 {
		return nil, errors.New("cluster: move leaders: no partition has another in-sync replica")
	}
	resp, err := client.AlterPartitionReassignments(ctx, &kafka.AlterPartitionReassignmentsRequest{Assignments: assign, Timeout: adminTimeout})
	if err == nil {
		err = resp.Error
		for _, r := range resp.PartitionResults {
			err = cmp.Or(err, r.Error)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: move leaders: reorder the replicas: %w", err)
	}
	for _, topic := range slices.Sorted(maps.Keys(elect)) {
		resp, err := client.ElectLeaders(ctx, &kafka.ElectLeadersRequest{Topic: topic, Partitions: elect[topic], Timeout: adminTimeout})
		if err == nil {
			err = resp.Error
			for _, r := range resp.PartitionResults {
				// Already led by the preferred replica: an election of the controller's own came first.
				if !errors.Is(r.Error, kafka.ElectionNotNeeded) {
					err = cmp.Or(err, r.Error)
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("cluster: move leaders: elect the preferred leaders of %s: %w", topic, err)
		}
	}
	var pending []LeaderMove
	err = poll(ctx, 100*time.Millisecond, func(ctx context.Context) (bool, error) {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{})
		if err != nil {
			return false, err
		}
		led := map[string]int{}
		for _, t := range md.Topics {
			for _, p := range t.Partitions {
				led[t.Name+"/"+strconv.Itoa(p.ID)] = p.Leader.ID
			}
		}
		pending = slices.DeleteFunc(slices.Clone(moves), func(m LeaderMove) bool {
			return led[m.Topic+"/"+strconv.Itoa(m.Partition)] == m.To
		})
		return len(pending) == 0, nil
	})
	if err != nil {
		return moves, fmt.Errorf("cluster: move leaders: %d of %d partitions not led by their new leader (%v): %w", len(pending), len(moves), pending, err)
	}
	return moves, nil
}

// reorder lists the replicas with to first. kafka-go's metadata names a replica on a broker that
// is down with id 0 (it finds no such broker to describe), and Kafka refuses an assignment that
// names broker 0: such a replica is the one node of the cluster the list lacks.
func reorder(replicas []kafka.Broker, to int, nodes []int) ([]int, error) {
	order := []int{to}
	unknown := 0
	for _, r := range replicas {
		switch {
		case r.ID == 0:
			unknown++
		case r.ID != to:
			order = append(order, r.ID)
		}
	}
	for _, id := range nodes {
		if unknown > 0 && !slices.Contains(order, id) {
			order = append(order, id)
			unknown--
		}
	}
	if unknown > 0 || len(order) != len(replicas) {
		return nil, fmt.Errorf("cannot tell the replicas %v apart: %d of them on brokers the metadata does not name", replicaIDs(replicas), unknown)
	}
	return order, nil
}

func replicaIDs(rs []kafka.Broker) []int {
	ids := make([]int, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

// after is how far replica id comes after leader in the cyclic order of replicas.
func after(replicas []kafka.Broker, leader, id int) int {
	li := slices.IndexFunc(replicas, func(b kafka.Broker) bool { return b.ID == leader })
	ii := slices.IndexFunc(replicas, func(b kafka.Broker) bool { return b.ID == id })
	return (ii - li + len(replicas)) % len(replicas)
}
