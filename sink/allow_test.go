package sink_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestARowCannotChooseATopicOutsideTheAllowlist is a row writer's attack: an aggregate type that
// names another topic (Kafka Connect's configuration topic, a schema registry's, the relay's own)
// under a bare {aggregate_type} template or a topic regex that does not match it. Each is refused
// by the failure policy with its own reason, and nothing reaches, or creates, that topic.
func TestARowCannotChooseATopicOutsideTheAllowlist(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	base := testenv.UniqueName(t, "allow")
	dlq := base + "_dlq"
	outside := base + "_connect-configs" // a topic the relay's principal could write
	internal := "_" + base + "_schemas"
	routes := []struct {
		name string
		rec  record.Options
	}{
		{"a bare aggregate type template", record.Options{TopicTemplate: "{aggregate_type}", TopicAllow: []string{base + ".*"}}},
		{"a topic regex that does not match", record.Options{TopicRegex: `(?<routedByValue>order)`, TopicReplacement: base + ".${routedByValue}"}},
	}
	for _, rt := range routes {
		t.Run(rt.name+" dead-letters the crafted rows and counts them", func(t *testing.T) {
			s := readySink(t, k.Brokers(), sink.Config{Record: rt.rec, DeadLetterTopic: dlq})
			crafted := []string{outside, internal, dlq}
			ackers := make([]*acker, len(crafted))
			for i, typ := range crafted {
				ackers[i] = &acker{}
				s.publish(t, newEvent(rt.name+"-"+typ, []byte(typ), "victim", "Evil", []byte(`{"name":"x","config":{}}`)), ackers[i])
			}
			s.mustClose(t)
			for i, typ := range crafted {
				if n := ackers[i].n.Load(); n != 1 {
					t.Errorf("the row routed to %s was settled %d times, want once (by the dead-letter topic)", typ, n)
				}
			}
			if got := s.metric(t, "outbox_relay_events_failed_total", "reason", sink.ReasonTopicNotAllowed); got != float64(len(crafted)) {
				t.Errorf("events_failed_total{reason=%s} = %v, want %d", sink.ReasonTopicNotAllowed, got, len(crafted))
			}
		})
	}
	dead := readBack(t, k.Brokers(), 30*time.Second, atLeast(6), dlq)
	if len(dead) != 6 {
		t.Errorf("%d records on the dead-letter topic, want 6", len(dead))
	}
	for _, r := range dead {
		if got := r.Header(sink.HeaderDLQReason); got != sink.ReasonTopicNotAllowed {
			t.Errorf("dead letter %s has reason %q, want %s", r.Header("id"), got, sink.ReasonTopicNotAllowed)
		}
	}
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second}
	md, err := client.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{outside, internal}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range md.Topics {
		if !errors.Is(tp.Error, kafka.UnknownTopicOrPartition) {
			t.Errorf("topic %s exists (error %v): a row reached a topic outside the allowlist", tp.Name, tp.Error)
		}
	}

	t.Run("under halt a refused route halts the sink with its reason", func(t *testing.T) {
		s := readySink(t, k.Brokers(), sink.Config{Policy: sink.Halt, DeadLetterTopic: dlq, Record: routes[1].rec})
		bad := &acker{}
		s.publish(t, newEvent("halted-one", []byte(outside), "victim", "Evil", []byte(`{}`)), bad)
		id, reason, err, halted := s.Halted()
		if !halted || id != "halted-one" || reason != sink.ReasonTopicNotAllowed || !errors.Is(err, record.ErrTopicNotAllowed) {
			t.Fatalf("Halted() = %q, %q, %v, %v; want halted-one, %s, ErrTopicNotAllowed, true", id, reason, err, halted, sink.ReasonTopicNotAllowed)
		}
		if bad.n.Load() != 0 {
			t.Fatal("the refused event was acknowledged under halt")
		}
	})
}

// TestTheSinkAsksForNoEventTopicWithoutAutoCreation runs on a broker that creates topics on
// request: without the opt-in, an aggregate type a row invents creates no topic; the event waits,
// loudly, for an operator to create it (and then goes out).
func TestTheSinkAsksForNoEventTopicWithoutAutoCreation(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	typ := testenv.UniqueName(t, "invented")
	topic := "outbox.event." + typ
	s := readySink(t, k.Brokers(), sink.Config{NoAutoCreateTopics: true, DeadLetterTopic: testenv.UniqueName(t, "dlq")})
	a := &acker{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	published := make(chan error, 1)
	go func() {
		published <- s.Publish(ctx, newEvent("invented-1", []byte(typ), "a-1", "New", []byte(`{}`)), a)
	}()
	eventually(t, 30*time.Second, "the sink reports the missing topic", func() bool {
		_, stalled := s.Stalled()
		return stalled
	})
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second}
	md, err := client.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Topics) != 1 || !errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) {
		t.Fatalf("topic %s exists: the sink asked the broker to create it", topic)
	}
	if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-published; err != nil {
		t.Fatalf("Publish once the topic exists: %v", err)
	}
	eventually(t, 30*time.Second, "the event goes out once the topic exists", func() bool { return a.n.Load() == 1 })
	s.mustClose(t)
}

// TestARowCannotWriteRedrivesLedger: redrive records each dead letter it sent back in the
// dead-letter topic's ledger (dead_letter_topic + ".redriven") and skips what the ledger names. A
// template whose prefix covers the dead-letter topic's name (outbox.{aggregate_type} beside the
// default outbox.dead-letter) must not let a row write an entry there, hiding a victim's dead
// letter from every later redrive.
func TestARowCannotWriteRedrivesLedger(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	base := testenv.UniqueName(t, "ledger")
	dlq := base + ".dead-letter"
	s := readySink(t, k.Brokers(), sink.Config{Record: record.Options{TopicTemplate: base + ".{aggregate_type}"}, DeadLetterTopic: dlq})
	a := &acker{}
	s.publish(t, newEvent("forged-ledger-entry", []byte("dead-letter"+sink.RedriveLedgerSuffix), "0/0", "Evil", []byte(`{"event_id":"victim"}`)), a)
	s.mustClose(t)
	if got := s.metric(t, "outbox_relay_events_failed_total", "reason", sink.ReasonTopicNotAllowed); got != 1 || a.n.Load() != 1 {
		t.Errorf("events_failed_total{reason=%s} = %v and the row settled %d times, want 1 and once: the row reached redrive's ledger",
			sink.ReasonTopicNotAllowed, got, a.n.Load())
	}
}
