package sink_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/scram"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestUnderExactlyOnceATopicTheRelayMayNotWriteDoesNotHoldUpTheOthers: a topic the relay's
// principal may describe but not write is refused by AddPartitionsToTxn. Retried in place (as a
// produce refused for it is under at-least-once), it held every partition of every Kafka
// transaction: nothing committed, so read_committed consumers of unrelated topics waited for ever,
// and a fence meanwhile went unnoticed (the coordinator checks ACLs before the producer's epoch).
// Its events now go to the failure policy, like any record its topic refuses for good: with
// dead-letter the other topics flow and readiness names the topic; with halt the relay stops at
// the first one, after committing everything before it.
//
// One broker of its own, with SCRAM users and an authorizer, serves both subtests.
func TestUnderExactlyOnceATopicTheRelayMayNotWriteDoesNotHoldUpTheOthers(t *testing.T) {
	t.Parallel()
	const user, password = "relay", "scram-relay-secret-7c1e"
	k := testenv.Kafka(t, devenv.KafkaOptions{SCRAMUsers: map[string]string{user: password}, Settings: map[string]string{
		"authorizer.class.name":          "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
		"super.users":                    "User:ANONYMOUS",
		"allow.everyone.if.no.acl.found": "true",
	}})
	mechanism, err := scram.Mechanism(scram.SHA512, user, password)
	if err != nil {
		t.Fatal(err)
	}
	setup := func(t *testing.T, describe bool) (cfg sink.Config, ok, denied string) {
		ok, denied = testenv.UniqueName(t, "ok"), testenv.UniqueName(t, "denied")
		cfg = sink.Config{
			Brokers: []string{k.SASLBrokers()}, SASL: mechanism, Record: record.Options{TopicTemplate: "{aggregate_type}"},
			DeadLetterTopic: testenv.UniqueName(t, "dlq"), WriteTimeout: 5 * time.Second,
			Transactions: &sink.Transactions{ID: testenv.UniqueName(t, "txn"), Interval: 50 * time.Millisecond,
				PositionsTopic: testenv.UniqueName(t, "pos")},
		}
		for _, topic := range []string{ok, denied, cfg.DeadLetterTopic} {
			if err := k.CreateTopic(context.Background(), topic, 2); err != nil {
				t.Fatal(err)
			}
		}
		// The principal may describe the denied topic (a consumer's ACLs, say), not write to it;
		// without describe, the metadata refuses the topic before AddPartitionsToTxn can.
		admin := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 30 * time.Second}
		acl := func(perm kafka.ACLPermissionType, op kafka.ACLOperationType) kafka.ACLEntry {
			return kafka.ACLEntry{ResourceType: kafka.ResourceTypeTopic, ResourceName: denied, ResourcePatternType: kafka.PatternTypeLiteral,
				Principal: "User:" + user, Host: "*", Operation: op, PermissionType: perm}
		}
		acls := []kafka.ACLEntry{acl(kafka.ACLPermissionTypeDeny, kafka.ACLOperationTypeWrite)}
		if describe {
			acls = append(acls, acl(kafka.ACLPermissionTypeAllow, kafka.ACLOperationTypeDescribe))
		}
		res, err := admin.CreateACLs(context.Background(), &kafka.CreateACLsRequest{ACLs: acls})
		if err == nil {
			err = errors.Join(res.Errors...)
		}
		if err != nil {
			t.Fatal(err)
		}
		return cfg, ok, denied
	}
	// publish sends n events, every fifth to the denied topic.
	publish := func(t *testing.T, s *testSink, stream *pgStream, a *acker, n int, ok, denied string) {
		for i := range n {
			ev := stream.next(fmt.Sprintf("k%d", i%3))
			ev.AggregateType = []byte(ok)
			if i%5 == 4 {
				ev.AggregateType = []byte(denied)
			}
			s.publish(t, ev, a)
		}
	}

	t.Run("dead-letter: the other topics flow, readiness names the topic, and a fence meanwhile is reported", func(t *testing.T) {
		cfg, ok, denied := setup(t, true)
		s := readySink(t, k.Brokers(), cfg)
		stream, a := newPGStream(4), &acker{}
		publish(t, s, stream, a, 20, ok, denied)
		eventually(t, 45*time.Second, fmt.Sprintf("every event acknowledged (the refused ones dead-lettered); %d of 20", a.n.Load()),
			func() bool { return a.n.Load() == 20 })
		if got := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(16), ok); len(got) != 16 {
			t.Errorf("a read_committed consumer of %s saw %d records, want 16", ok, len(got))
		}
		dead := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(4), cfg.DeadLetterTopic)
		for _, r := range dead {
			if r.Header("outbox.dlq.reason") != sink.ReasonNotAuthorized || r.Header("outbox.dlq.original_topic") != denied ||
				!strings.Contains(r.Header("outbox.dlq.error"), denied) {
				t.Errorf("dead letter %s: reason %q, topic %q, error %q", r.Header("id"), r.Header("outbox.dlq.reason"),
					r.Header("outbox.dlq.original_topic"), r.Header("outbox.dlq.error"))
			}
		}
		if len(dead) != 4 {
			t.Errorf("%d dead letters, want the 4 events of %s", len(dead), denied)
		} else {
			t.Logf("dead letter: %s", dead[0].Header("outbox.dlq.error"))
		}
		var why string
		eventually(t, 15*time.Second, "readiness names the refused topic", func() bool {
			w, stalled := s.Stalled()
			why = w
			return stalled && strings.Contains(w, denied)
		})
		t.Logf("readiness: %s", why)
		if logged := s.logs.FilterField(zap.String("topic", denied)).FilterLevelExact(zap.ErrorLevel).All(); len(logged) == 0 {
			t.Error("no ERROR line names the refused topic")
		} else {
			t.Logf("log: %s %v", logged[0].Message, logged[0].ContextMap()["error"])
		}

		// Another producer takes the transactional id; the next event is refused by its topic and
		// dead-lettered, and the dead letter's transaction meets the fence.
		other := readySink(t, k.Brokers(), cfg)
		other.mustClose(t)
		ev := stream.next("k0")
		ev.AggregateType = []byte(denied)
		s.publish(t, ev, a)
		select {
		case <-s.Failed():
		case <-time.After(30 * time.Second):
			t.Fatal("the fenced sink did not stop within 30s")
		}
		if !errors.Is(s.Err(), sink.ErrFenced) {
			t.Errorf("Err = %v, want ErrFenced", s.Err())
		}
	})

	t.Run("halt: the relay stops at the first refused event, with everything before it committed", func(t *testing.T) {
		cfg, ok, denied := setup(t, true)
		cfg.Policy = sink.Halt
		s := readySink(t, k.Brokers(), cfg)
		stream, a := newPGStream(4), &acker{}
		publish(t, s, stream, a, 4, ok, denied)
		eventually(t, 30*time.Second, "the first events acknowledged", func() bool { return a.n.Load() == 4 })
		// The refused event first (a Kafka transaction cut before it would commit, depending on
		// timing, events published after the first four), then events a halted sink holds back:
		// Publish blocks once the halt is known, until its context ends.
		refused := stream.next("k0")
		refused.AggregateType = []byte(denied)
		s.publish(t, refused, a)
		for i := range 3 {
			ev := stream.next(fmt.Sprintf("k%d", i))
			ev.AggregateType = []byte(ok)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = s.Publish(ctx, ev, a)
			cancel()
		}
		var reason string
		var herr error
		eventually(t, 30*time.Second, "the sink halted", func() bool {
			var halted bool
			_, reason, herr, halted = s.Halted()
			return halted
		})
		if reason != sink.ReasonNotAuthorized || herr == nil || !strings.Contains(herr.Error(), denied) {
			t.Errorf("halted for %q: %v; want %s naming %s", reason, herr, sink.ReasonNotAuthorized, denied)
		} else {
			t.Logf("halted: %v", herr)
		}
		if got := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(4), ok); len(got) != 4 || a.n.Load() != 4 {
			t.Errorf("a read_committed consumer saw %d records, %d acknowledged; want the 4 before the halted transaction", len(got), a.n.Load())
		}
	})

	t.Run("dead-letter: a topic the relay may not even describe does not hold the others up either", func(t *testing.T) {
		cfg, ok, denied := setup(t, false)
		s := readySink(t, k.Brokers(), cfg)
		stream, a := newPGStream(4), &acker{}
		publish(t, s, stream, a, 10, ok, denied)
		eventually(t, 45*time.Second, fmt.Sprintf("every event acknowledged (the refused ones dead-lettered); %d of 10", a.n.Load()),
			func() bool { return a.n.Load() == 10 })
		if got := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(8), ok); len(got) != 8 {
			t.Errorf("a read_committed consumer of %s saw %d records, want 8", ok, len(got))
		}
		dead := readCommitted(t, k.Brokers(), 30*time.Second, atLeast(2), cfg.DeadLetterTopic)
		if len(dead) != 2 || dead[0].Header("outbox.dlq.reason") != sink.ReasonNotAuthorized {
			t.Errorf("%d dead letters, want the 2 events of %s refused as %s", len(dead), denied, sink.ReasonNotAuthorized)
		}
		s.mustClose(t)
	})

	// The positions topic is not an event's topic: no transaction commits without its position, so
	// a refusal there ends the sink as a configuration error. As ErrAborted, the relay restarted,
	// aborted the same transaction again, and so on for ever, saying the events went to the
	// failure policy.
	t.Run("a positions topic the relay may read but not write ends the sink with the fix, not a restart", func(t *testing.T) {
		cfg, ok, _ := setup(t, true)
		admin := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 30 * time.Second}
		if err := k.CreateTopic(context.Background(), cfg.Transactions.PositionsTopic, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.AlterConfigs(context.Background(), &kafka.AlterConfigsRequest{Resources: []kafka.AlterConfigRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: cfg.Transactions.PositionsTopic,
			Configs: []kafka.AlterConfigRequestConfig{{Name: "cleanup.policy", Value: "compact"}}}}}); err != nil {
			t.Fatal(err)
		}
		var acls []kafka.ACLEntry
		for _, rule := range []struct {
			op   kafka.ACLOperationType
			perm kafka.ACLPermissionType
		}{{kafka.ACLOperationTypeWrite, kafka.ACLPermissionTypeDeny}, {kafka.ACLOperationTypeDescribe, kafka.ACLPermissionTypeAllow},
			{kafka.ACLOperationTypeRead, kafka.ACLPermissionTypeAllow}, {kafka.ACLOperationTypeDescribeConfigs, kafka.ACLPermissionTypeAllow}} {
			acls = append(acls, kafka.ACLEntry{ResourceType: kafka.ResourceTypeTopic, ResourceName: cfg.Transactions.PositionsTopic,
				ResourcePatternType: kafka.PatternTypeLiteral, Principal: "User:" + user, Host: "*", Operation: rule.op, PermissionType: rule.perm})
		}
		res, err := admin.CreateACLs(context.Background(), &kafka.CreateACLsRequest{ACLs: acls})
		if err == nil {
			err = errors.Join(res.Errors...)
		}
		if err != nil {
			t.Fatal(err)
		}
		s := readySink(t, k.Brokers(), cfg)
		stream, a := newPGStream(4), &acker{}
		ev := stream.next("k0")
		ev.AggregateType = []byte(ok)
		s.publish(t, ev, a)
		select {
		case <-s.Failed():
		case <-time.After(45 * time.Second):
			t.Fatalf("the sink did not stop within 45s; %d acknowledged", a.n.Load())
		}
		err = s.Err()
		if errors.Is(err, sink.ErrAborted) || !strings.Contains(err.Error(), "positions_topic "+cfg.Transactions.PositionsTopic) {
			t.Errorf("sink error %v: want a configuration error naming positions_topic, not ErrAborted (a restart that aborts again)", err)
		}
		if a.n.Load() != 0 {
			t.Errorf("%d events acknowledged without a committed position", a.n.Load())
		}
	})
}
