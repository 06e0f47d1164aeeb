package producer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// twoBrokers is a fake cluster of two brokers (node ids 1 and 2) speaking just enough of the
// Kafka protocol (kafka-go's protocol package) for the marker check: topic "t" has partitions 0
// and 2 led by node 1, 1 and 3 by node 2, and 4 without a leader. Each node answers ListOffsets
// with its answer function; a nil answer drops the connection (a broker that goes away
// mid-request). A fake isolates what the real-broker markers test cannot arrange: one broker of
// two answering, another omitting a partition or answering an error for it.
type twoBrokers struct {
	lns [2]net.Listener

	mu     sync.Mutex
	answer [2]func(partition int32) (offset int64, code int16, omit bool)
	asked  [2][]listoffsets.RequestPartition // partitions asked of each node
	iso    [2][]int8                         // isolation level of each ListOffsets
	replic [2][]int32                        // replica id of each ListOffsets
}

func newTwoBrokers(t *testing.T) *twoBrokers {
	t.Helper()
	b := &twoBrokers{}
	var wg sync.WaitGroup
	var conns sync.Map
	for i := range b.lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		b.lns[i] = ln
	}
	for i, ln := range b.lns {
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				conns.Store(c, true)
				wg.Go(func() { b.serve(i, c); conns.Delete(c) })
			}
		})
	}
	t.Cleanup(func() {
		for _, ln := range b.lns {
			ln.Close()
		}
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	return b
}

func (b *twoBrokers) set(node int, answer func(partition int32) (int64, int16, bool)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.answer[node-1] = answer
}

func (b *twoBrokers) serve(i int, c net.Conn) {
	defer c.Close()
	var brokers []metadata.ResponseBroker
	for j, ln := range b.lns {
		host, portText, _ := net.SplitHostPort(ln.Addr().String())
		var port int32
		fmt.Sscan(portText, &port)
		brokers = append(brokers, metadata.ResponseBroker{NodeID: int32(j + 1), Host: host, Port: port})
	}
	for {
		version, correlation, _, msg, err := protocol.ReadRequest(c)
		if err != nil {
			return
		}
		var res protocol.Message
		switch req := msg.(type) {
		case *apiversions.Request:
			var keys []apiversions.ApiKeyResponse
			for k, v := range map[protocol.ApiKey]int16{protocol.ApiVersions: 2, protocol.Metadata: 8, protocol.ListOffsets: 5} {
				keys = append(keys, apiversions.ApiKeyResponse{ApiKey: int16(k), MinVersion: k.MinVersion(), MaxVersion: v})
			}
			res = &apiversions.Response{ApiKeys: keys}
		case *metadata.Request:
			var parts []metadata.ResponsePartition
			for p, leader := range []int32{1, 2, 1, 2, -1} {
				parts = append(parts, metadata.ResponsePartition{PartitionIndex: int32(p), LeaderID: leader, ReplicaNodes: []int32{1, 2}, IsrNodes: []int32{1, 2}})
			}
			res = &metadata.Response{Brokers: brokers, ControllerID: 1, Topics: []metadata.ResponseTopic{{Name: "t", Partitions: parts}}}
		case *listoffsets.Request:
			b.mu.Lock()
			answer := b.answer[i]
			b.iso[i] = append(b.iso[i], req.IsolationLevel)
			b.replic[i] = append(b.replic[i], req.ReplicaID)
			r := &listoffsets.Response{}
			for _, topic := range req.Topics {
				rt := listoffsets.ResponseTopic{Topic: topic.Topic}
				for _, p := range topic.Partitions {
					b.asked[i] = append(b.asked[i], p)
					if answer == nil {
						continue
					}
					offset, code, omit := answer(p.Partition)
					if !omit {
						rt.Partitions = append(rt.Partitions, listoffsets.ResponsePartition{Partition: p.Partition, ErrorCode: code, Offset: offset, Timestamp: -1, LeaderEpoch: -1})
					}
				}
				r.Topics = append(r.Topics, rt)
			}
			b.mu.Unlock()
			if answer == nil {
				return // the broker goes away without answering
			}
			res = r
		default:
			return
		}
		if err := protocol.WriteResponse(c, version, correlation, res); err != nil {
			return
		}
	}
}

func (b *twoBrokers) committer(t *testing.T) *Committer {
	t.Helper()
	transport := &kafka.Transport{MetadataTTL: time.Minute}
	t.Cleanup(transport.CloseIdleConnections)
	client := &kafka.Client{Addr: kafka.TCP(b.lns[0].Addr().String()), Timeout: 2 * time.Second, Transport: transport}
	return &Committer{client: client, id: "fake", timeout: 2 * time.Second, log: zaptest.NewLogger(t)}
}

// tps are the five partitions of the fake's topic.
var fakeTPs = []TopicPartition{{"t", 0}, {"t", 1}, {"t", 2}, {"t", 3}, {"t", 4}}

func TestTheMarkerCheckTakesOnlyWhatEachLeaderAnsweredWithoutAnError(t *testing.T) {
	notLeader := int16(kafka.NotLeaderForPartition)
	unknown := int16(kafka.UnknownTopicOrPartition)
	tests := []struct {
		name       string
		node1      func(int32) (int64, int16, bool)
		node2      func(int32) (int64, int16, bool)
		wantStable map[TopicPartition]int64
		wantErrs   map[TopicPartition]error
	}{
		{
			name: "every leader answers: each partition's stable offset, the leaderless one its error",
			node1: func(p int32) (int64, int16, bool) {
				return map[int32]int64{0: 10, 2: 12}[p], map[int32]int16{4: notLeader}[p], false
			},
			node2:      func(p int32) (int64, int16, bool) { return map[int32]int64{1: 11, 3: 13}[p], 0, false },
			wantStable: map[TopicPartition]int64{{"t", 0}: 10, {"t", 1}: 11, {"t", 2}: 12, {"t", 3}: 13},
			wantErrs:   map[TopicPartition]error{{"t", 4}: kafka.NotLeaderForPartition},
		},
		{
			name:       "a leader goes away without answering: its partitions are in neither, the other's answer stands",
			node1:      func(p int32) (int64, int16, bool) { return 10 + int64(p), map[int32]int16{4: notLeader}[p], false },
			node2:      nil,
			wantStable: map[TopicPartition]int64{{"t", 0}: 10, {"t", 2}: 12},
			wantErrs:   map[TopicPartition]error{{"t", 4}: kafka.NotLeaderForPartition},
		},
		{
			name:       "a partition missing from its leader's answer is in neither",
			node1:      func(p int32) (int64, int16, bool) { return 10 + int64(p), 0, p == 2 || p == 4 },
			node2:      func(p int32) (int64, int16, bool) { return 10 + int64(p), 0, p == 3 },
			wantStable: map[TopicPartition]int64{{"t", 0}: 10, {"t", 1}: 11},
			wantErrs:   map[TopicPartition]error{},
		},
		{
			name: "a partition answering an error has no stable offset, whatever offset comes with it",
			node1: func(p int32) (int64, int16, bool) {
				return 99, map[int32]int16{0: notLeader, 2: 0, 4: unknown}[p], false
			},
			node2:      func(p int32) (int64, int16, bool) { return 99, map[int32]int16{1: unknown, 3: notLeader}[p], false },
			wantStable: map[TopicPartition]int64{{"t", 2}: 99},
			wantErrs: map[TopicPartition]error{{"t", 0}: kafka.NotLeaderForPartition, {"t", 1}: kafka.UnknownTopicOrPartition,
				{"t", 3}: kafka.NotLeaderForPartition, {"t", 4}: kafka.UnknownTopicOrPartition},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTwoBrokers(t)
			b.set(1, tt.node1)
			b.set(2, tt.node2)
			tm := b.committer(t)
			stable, errs, _ := tm.stableOffsets(t.Context(), fakeTPs)
			if fmt.Sprint(stable) != fmt.Sprint(tt.wantStable) {
				t.Errorf("stable offsets %v, want %v", stable, tt.wantStable)
			}
			if len(errs) != len(tt.wantErrs) {
				t.Errorf("errors %v, want %v", errs, tt.wantErrs)
			}
			for tp, want := range tt.wantErrs {
				if !errors.Is(errs[tp], want) {
					t.Errorf("%v: error %v, want %v", tp, errs[tp], want)
				}
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			// Node 1 is also the bootstrap broker that gets the leaderless partition: one request
			// for the partitions it leads, one for the one without a leader.
			for node, want := range map[int][2]int{1: {2, 3}, 2: {1, 2}} {
				if got := len(b.iso[node-1]); got != want[0] {
					t.Errorf("node %d got %d ListOffsets, want %d (one per leader, one for the leaderless)", node, got, want[0])
				}
				if got := len(b.asked[node-1]); got != want[1] {
					t.Errorf("node %d was asked %d partitions (%v), want %d", node, got, b.asked[node-1], want[1])
				}
				for i, iso := range b.iso[node-1] {
					if iso != 1 || b.replic[node-1][i] != -1 {
						t.Errorf("node %d: a ListOffsets with isolation %d, replica %d; want read_committed (1) from a consumer (-1)", node, iso, b.replic[node-1][i])
					}
				}
			}
		})
	}
}

func TestAMarkerCheckThatABrokerDoesNotAnswerIsNeverTakenForLanded(t *testing.T) {
	b := newTwoBrokers(t)
	// Node 1 says its partitions are decided well past the transaction; node 2 drops every
	// ListOffsets, so its partition's marker is unproven however long the check runs.
	b.set(1, func(int32) (int64, int16, bool) { return 100, 0, false })
	b.set(2, nil)
	tm := b.committer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	spans := map[TopicPartition]Span{{"t", 0}: {5, 6}, {"t", 1}: {5, 6}}
	_, err := tm.landed(ctx, spans, true, TopicPartition{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("landed: %v, want it still waiting for t/1 when its context ends", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.asked[1]) < 2 {
		t.Errorf("node 2 was asked %d times, want the check to go on asking it", len(b.asked[1]))
	}
}

func TestTheFirstMarkerCheckLearnsOnlyFromTheMarkersOwnLatency(t *testing.T) {
	initial := firstCheckInitial
	tests := []struct {
		name  string
		first func() (offset int64, omit bool) // t/0's first answer; later ones say it is decided
		want  time.Duration
	}{
		{"every marker landed at the first check: the wait shortens", func() (int64, bool) { return 100, false }, initial - initial/64},
		{"the marker still on its way at the first check: the wait lengthens", func() (int64, bool) { return 5, false }, initial + initial/4},
		// Another producer's older open transaction holds the partition: how long it stays open
		// says nothing about how long this one's markers take.
		{"behind another producer's open transaction at the first check: the wait stays", func() (int64, bool) { return 3, false }, initial},
		{"no answer for the partition at the first check: the wait stays", func() (int64, bool) { return 0, true }, initial},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTwoBrokers(t)
			calls := 0
			b.set(1, func(int32) (int64, int16, bool) {
				calls++
				if calls == 1 {
					offset, omit := tt.first()
					return offset, 0, omit
				}
				return 100, 0, false
			})
			tm := b.committer(t)
			if _, err := tm.landed(t.Context(), map[TopicPartition]Span{{"t", 0}: {5, 6}}, true, TopicPartition{}); err != nil {
				t.Fatal(err)
			}
			if got := tm.firstCheck.get(); got != tt.want {
				t.Errorf("the next transaction's first check waits %v, want %v", got, tt.want)
			}
		})
	}
}

func TestWaitingForAMarkerNamesWhatTheBrokersAnswered(t *testing.T) {
	tests := []struct {
		name  string
		node1 func(int32) (int64, int16, bool)
		want  string
	}{
		{"a partition answering an error: the warning names it", func(int32) (int64, int16, bool) { return -1, int16(kafka.KafkaStorageError), false }, "t/0: [56] Kafka Storage Error"},
		{"no broker answering: the warning names why", nil, "t/0: list offsets:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTwoBrokers(t)
			b.set(1, tt.node1)
			tm := b.committer(t)
			core, logs := observer.New(zap.WarnLevel)
			tm.log, tm.waitWarn = zap.New(core), 50*time.Millisecond
			ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
			defer cancel()
			if _, err := tm.landed(ctx, map[TopicPartition]Span{{"t", 0}: {5, 6}}, true, TopicPartition{}); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("landed: %v, want it waiting until its context ends", err)
			}
			var named []string
			for _, e := range logs.FilterMessageSnippet("waiting for the marker").All() {
				for _, f := range e.Context {
					if f.Key == "errors" {
						named = append(named, fmt.Sprint(f.Interface))
					}
				}
			}
			if len(named) == 0 || !strings.Contains(named[len(named)-1], tt.want) {
				t.Errorf("the waiting warnings name %q, want the last to name %q", named, tt.want)
			}
		})
	}
}
