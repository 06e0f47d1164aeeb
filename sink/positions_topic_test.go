package sink_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestANewSinkRefusesAPositionsTopicThatEventsOrDeadLettersShare: the positions partition and an
// event's (or a dead letter's) partition of the same topic would be numbered twice from sequence 0
// by one producer id and epoch, and the broker would take one writer's batch for a duplicate of
// the other's. Where the sharing is known from the configuration, New refuses it.
func TestANewSinkRefusesAPositionsTopicThatEventsOrDeadLettersShare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		cfg       sink.Config
		wantError []string // empty: accepted
	}{
		{"the dead-letter topic", sink.Config{DeadLetterTopic: "relay.pos", Transactions: &sink.Transactions{ID: "t", PositionsTopic: "relay.pos"}},
			[]string{"relay.pos", "dead-letter topic", "positions topic"}},
		{"the default positions topic as the dead-letter topic", sink.Config{DeadLetterTopic: sink.DefaultPositionsTopic, Transactions: &sink.Transactions{ID: "t"}},
			[]string{sink.DefaultPositionsTopic, "dead-letter topic"}},
		{"a fixed topic template", sink.Config{Record: record.Options{TopicTemplate: "orders"}, Transactions: &sink.Transactions{ID: "t", PositionsTopic: "orders"}},
			[]string{"orders", "topic template"}},
		{"a fixed topic replacement", sink.Config{Record: record.Options{TopicRegex: ".*", TopicReplacement: "orders"}, Transactions: &sink.Transactions{ID: "t", PositionsTopic: "orders"}},
			[]string{"orders", "topic replacement"}},
		{"a template with placeholders is checked per event", sink.Config{Record: record.Options{TopicTemplate: "x.{aggregate_type}"}, Transactions: &sink.Transactions{ID: "t", PositionsTopic: "x.Order"}}, nil},
		{"a fixed template is not used with a topic regex", sink.Config{Record: record.Options{TopicTemplate: "orders", TopicRegex: "(?<routedByValue>.*)"}, Transactions: &sink.Transactions{ID: "t", PositionsTopic: "orders"}}, nil},
		{"at-least-once writes no positions", sink.Config{Record: record.Options{TopicTemplate: sink.DefaultPositionsTopic}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Brokers = []string{"localhost:1"}
			s, err := sink.New(tt.cfg, zap.NewNop(), metrics.New(prometheus.NewRegistry()))
			if s != nil {
				defer s.Close(context.Background())
			}
			if len(tt.wantError) == 0 {
				if err != nil {
					t.Fatalf("New = %v, want it accepted", err)
				}
				return
			}
			if err == nil {
				t.Fatal("New accepted it")
			}
			for _, w := range tt.wantError {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestAnEventRoutedToThePositionsTopicGoesToTheFailurePolicy: routing by template (or regex)
// produces a topic per aggregate type, so an event may be routed to the positions topic. Written
// there, it and the position would share the producer's sequence numbers from 0: one of the two
// is acknowledged as a duplicate without being written. The event is refused instead, with the
// reason, and the position is written.
func TestAnEventRoutedToThePositionsTopicGoesToTheFailurePolicy(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	cfg := txnConfig(t, k, 50*time.Millisecond, 100)
	ordinary := cfg.Record.TopicTemplate
	cfg.Record.TopicTemplate = "{aggregate_type}"
	s := readySink(t, k.Brokers(), cfg)
	stream := newPGStream(3)
	a := &acker{}
	for i := range 6 {
		ev := stream.next(fmt.Sprintf("k%d", i%2))
		ev.AggregateType = []byte(ordinary)
		if i == 4 {
			ev.AggregateType = []byte(cfg.Transactions.PositionsTopic)
		}
		s.publish(t, ev, a)
	}
	eventually(t, 60*time.Second, "every event acknowledged", func() bool { return a.n.Load() == 6 })
	s.mustClose(t)
	dead := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(1), cfg.DeadLetterTopic)
	if len(dead) != 1 || dead[0].Header("id") != "ev-00004" || dead[0].Header("outbox.dlq.reason") != sink.ReasonTopicNotAllowed ||
		!strings.Contains(dead[0].Header("outbox.dlq.error"), "positions topic") {
		for _, r := range dead {
			t.Logf("dead letter %s: %s (%s)", r.Header("id"), r.Header("outbox.dlq.reason"), r.Header("outbox.dlq.error"))
		}
		t.Fatalf("dead-letter topic holds %d records, want ev-00004 refused for the positions topic", len(dead))
	}
	t.Logf("dead letter: %s", dead[0].Header("outbox.dlq.error"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pos, ok, err := sink.ReadPosition(ctx, cfg)
	if err != nil || !ok || pos != stream.position() {
		t.Errorf("ReadPosition = %v %v %v, want %v", pos, ok, err, stream.position())
	}
	if got := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(5), ordinary); len(got) != 5 {
		t.Errorf("%d records on %s, want 5", len(got), ordinary)
	}
}

// TestAnExistingPositionsTopicIsCheckedAtStart: a positions topic created before the relay (by an
// operator, or by the brokers' auto-creation) may delete old records by time or size instead of
// keeping the latest per key: a quiet relay's position would then vanish and its next start would
// find none. The start refuses any cleanup.policy but compact, naming the topic, the policy and
// the fix, and warns (without refusing) about a replication that one lost disk defeats: this
// single-broker cluster has replication factor 1.
func TestAnExistingPositionsTopicIsCheckedAtStart(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	tests := []struct {
		name      string
		policy    string
		wantError bool
	}{
		{"delete", "delete", true},
		{"compact and delete", "compact,delete", true},
		{"compact", "compact", false},
	}
	for _, tt := range tests {
		t.Run("a positions topic with cleanup.policy "+tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := txnConfig(t, k, 50*time.Millisecond, 100)
			createTopic(t, k.Brokers(), cfg.Transactions.PositionsTopic, 1, kafka.ConfigEntry{ConfigName: "cleanup.policy", ConfigValue: tt.policy})
			s := newSink(t, k.Brokers(), cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			err := s.WaitReady(ctx)
			if !tt.wantError {
				if err != nil {
					t.Fatalf("WaitReady = %v, want the compacted topic accepted", err)
				}
				warned := s.logs.FilterMessageSnippet("positions topic").FilterField(zap.String("topic", cfg.Transactions.PositionsTopic)).FilterLevelExact(zap.WarnLevel).All()
				if len(warned) == 0 || !strings.Contains(warned[0].Message, "replication factor 1") {
					t.Errorf("no warning about the positions topic's replication factor 1: %v", warned)
				} else {
					t.Logf("warning: %s", warned[0].Message)
				}
				return
			}
			if err == nil {
				t.Fatal("WaitReady accepted it")
			}
			for _, w := range []string{cfg.Transactions.PositionsTopic, "cleanup.policy " + tt.policy, "kafka-configs", "--alter", "--add-config cleanup.policy=compact"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}
