package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/cluster"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// The fault kinds of a three-broker cluster (Options.Brokers 3), in the group "broker" with
// broker-stop and broker-pause: with one broker they are not drawn.
const (
	kindBrokerKill      = "broker-kill"      // SIGKILL a broker that is not the controller, restart it after d
	kindLeaderChange    = "leader-change"    // every partition's leadership moves to another in-sync replica
	kindCoordinatorMove = "coordinator-move" // the transaction coordinator's broker killed (or, node 1, its leadership elected away)
	kindISRShrink       = "isr-shrink"       // nodes 2 and 3 stopped for d: one in-sync replica, below min.insync.replicas
)

// threeBrokerKinds need a replicated cluster: other replicas to elect, an ISR to shrink.
var threeBrokerKinds = []string{kindBrokerKill, kindLeaderChange, kindCoordinatorMove, kindISRShrink}

// ThreeBrokerKinds lists the kinds that need Options.Brokers 3.
func ThreeBrokerKinds() []string { return slices.Clone(threeBrokerKinds) }

// brokerKinds returns kinds without those that need three brokers when brokers is 1.
func brokerKinds(kinds []string, brokers int) []string {
	if brokers >= 3 {
		return kinds
	}
	return slices.DeleteFunc(slices.Clone(kinds), func(k string) bool { return slices.Contains(threeBrokerKinds, k) })
}

// brokerNode draws the broker a broker-stop, broker-pause or broker-kill of a cluster of nodes
// brokers targets, in the plan: any broker for a stop or a pause, whether it leads anything or not
// (brokerFault records which); not node 1 for a kill: it is the cluster's only KRaft controller,
// and with it dead no leader is elected, which tests nothing a stop does not. 0 for the other
// kinds, whose target is read when they are applied.
func brokerNode(kind string, nodes int, rng *rand.Rand) int {
	switch {
	case kind != kindBrokerStop && kind != kindBrokerPause && kind != kindBrokerKill:
		return 0
	case nodes <= 1:
		return 1
	case kind == kindBrokerKill:
		return 2 + rng.IntN(nodes-1)
	}
	return 1 + rng.IntN(nodes)
}

// brokerDuration draws how long a broker kill, a coordinator's kill or an ISR shrink lasts until
// the restart; the short schedule keeps them short, as six broker kinds share the group.
func brokerDuration(short bool, between func(lo, hi time.Duration) time.Duration) time.Duration {
	if short {
		return between(time.Second, 5*time.Second)
	}
	return between(2*time.Second, 20*time.Second)
}

// internalTopic reports whether Kafka owns topic (the relay's positions topic is the relay's).
func internalTopic(topic string) bool {
	switch topic {
	case "__consumer_offsets", "__transaction_state", "__share_group_state", "__cluster_metadata":
		return true
	}
	return false
}

// coordinatorKey is the transactional id whose coordinator coordinator-move targets: the cluster
// has a single __transaction_state partition (devenv), so it coordinates every relay's id.
const coordinatorKey = "outbox-relay"

// brokerFault applies the broker faults and records their target: which node, and what it led at
// that moment (rec.Detail), with three brokers.
func (n *nemesis) brokerFault(ctx context.Context, f *fault, rec *history.Fault, heal func(func(context.Context) error)) error {
	c := n.run.cluster
	three := len(c.Nodes()) > 1
	target := func(node int) {
		if !three {
			return
		}
		rec.Target = fmt.Sprintf("broker-%d", node)
		if l, err := c.LeadershipOf(ctx, node); err == nil {
			rec.Detail = l.String()
		} else {
			rec.Detail = fmt.Sprintf("node %d (leaderships unknown: %v)", node, err)
		}
	}
	restart := func(node int) func(context.Context) error {
		return func(hctx context.Context) error { return c.StartNode(hctx, node) }
	}
	node := brokerOf(f)
	if node > len(c.Nodes()) {
		return fmt.Errorf("%w: the plan names broker %d of a cluster of %d", errSkipped, node, len(c.Nodes()))
	}
	switch f.kind {
	case kindBrokerStop:
		target(node)
		if err := c.StopNode(ctx, node); err != nil {
			heal(restart(node))
			return err
		}
		sleep(ctx, f.d)
		heal(restart(node))
	case kindBrokerPause:
		target(node)
		if err := c.PauseNode(node); err != nil {
			return err
		}
		sleep(ctx, f.d)
		heal(func(context.Context) error { return c.ResumeNode(node) })
	case kindBrokerKill:
		target(node)
		if err := c.KillNode(node); err != nil {
			return err
		}
		sleep(ctx, f.d)
		heal(restart(node))
	case kindLeaderChange:
		moves, err := c.MoveLeaders(ctx, func(topic string) bool { return !internalTopic(topic) })
		if len(moves) > 0 {
			rec.Detail = fmt.Sprintf("%d partitions' leaders moved, e.g. %s/%d from node %d to %d",
				len(moves), moves[0].Topic, moves[0].Partition, moves[0].From, moves[0].To)
		}
		return err
	case kindCoordinatorMove:
		coord, err := c.TransactionCoordinator(ctx, coordinatorKey)
		if err != nil {
			return fmt.Errorf("%w: %v", errSkipped, err)
		}
		target(coord)
		if coord == 1 {
			// The controller's node is not killed (see brokerNode): the coordinator moves by an
			// election of another leader of its __transaction_state partition.
			moves, err := c.MoveLeaders(ctx, func(topic string) bool { return topic == "__transaction_state" })
			if err != nil {
				return err
			}
			rec.Detail += fmt.Sprintf("; moved by election to node %d", moves[0].To)
			return nil
		}
		if err := c.KillNode(coord); err != nil {
			return err
		}
		sleep(ctx, f.d)
		if to, err := c.TransactionCoordinator(ctx, coordinatorKey); err == nil {
			rec.Detail += fmt.Sprintf("; killed, node %d coordinates before the restart", to)
		}
		heal(restart(coord))
	case kindISRShrink:
		// The controller's node stays: with it, the controller shrinks every partition's ISR to
		// node 1 (or leaves a partition without a leader: no unclean election), and an acks=all
		// write or a transaction's marker waits until a second replica is back.
		others := slices.DeleteFunc(c.Nodes(), func(id int) bool { return id == 1 })
		rec.Detail = fmt.Sprintf("nodes %s stopped: one in-sync replica, below min.insync.replicas 2", joinInts(others))
		if err := eachNode(others, func(id int) error { return c.StopNode(ctx, id) }); err != nil {
			heal(func(hctx context.Context) error {
				return eachNode(others, func(id int) error { return startIfStopped(hctx, c, id) })
			})
			return err
		}
		sleep(ctx, f.d)
		heal(func(hctx context.Context) error {
			return eachNode(others, func(id int) error { return c.StartNode(hctx, id) })
		})
	}
	return nil
}

// brokerOf is the node a broker-stop, -pause or -kill targets: the plan's Pick (1 in a plan
// drawn before there were more brokers).
func brokerOf(f *fault) int { return max(f.pick, 1) }

func startIfStopped(ctx context.Context, c *cluster.Cluster, id int) error {
	if c.NodeRunning(id) {
		return nil
	}
	return c.StartNode(ctx, id)
}

// eachNode runs fn for every node side by side (a broker's start is a JVM's) and joins the errors.
func eachNode(nodes []int, fn func(id int) error) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, id := range nodes {
		wg.Go(func() { errs[i] = fn(id) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func joinInts(ids []int) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, " and ")
}
