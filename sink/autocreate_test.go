package sink_test

import (
	"context"
	"errors"

	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zapcore"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// TestSinkWithoutTopicAutoCreation runs against a dedicated broker that does not auto-create
// topics, where a topic the relay needs may simply be missing (one broker start serves both).
func TestSinkWithoutTopicAutoCreation(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t, devenv.KafkaOptions{Settings: map[string]string{"auto.create.topics.enable": "false"}})

	t.Run("a missing dead-letter topic does not keep Publish or Close waiting past their contexts", func(t *testing.T) {
		s := readySink(t, k.Brokers(), sink.Config{DeadLetterTopic: testenv.UniqueName(t, "missing_dlq")})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		done := make(chan error, 1)
		go func() {
			done <- s.Publish(ctx, newEvent("bad-topic", []byte("bad type!"), "order-1", "Odd", []byte(`{}`)), &acker{})
		}()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Publish = %v, want the context's error: the event was never handed over", err)
			}
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Errorf("Publish returned %v after its 2s context ended", elapsed)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Publish still waits for the dead-letter topic 28s after its context ended")
		}
		if _, _, _, halted := s.Halted(); halted {
			t.Error("the sink halted: a stop while the dead-letter topic is missing is not a failure")
		}
		if events, _ := s.InFlight(); events != 0 {
			t.Errorf("%d events in flight after Publish gave up on its only event", events)
		}

		// Close while a partition goroutine waits for the missing dead-letter topic: the topic takes
		// 2,000-byte records, so the broker refuses a 5 KB event that passes the relay's own limit,
		// and its dead-lettering waits. Close must give up at its deadline.
		topic := testenv.UniqueName(t, "small")
		createTopic(t, k.Brokers(), topic, 1, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "2000"})
		s2 := readySink(t, k.Brokers(), sink.Config{Record: record.Options{TopicTemplate: topic}, DeadLetterTopic: testenv.UniqueName(t, "missing_dlq")})
		s2.publish(t, newEvent("big", []byte("Order"), "order-2", "Big", []byte(`"`+strings.Repeat("b", 5000)+`"`)), &acker{})
		eventually(t, 30*time.Second, "the dead-lettering waits for the missing topic", func() bool {
			return s2.logs.FilterMessageSnippet("sending it to the dead-letter topic").Len() > 0
		})
		closeCtx, closeCancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer closeCancel()
		start = time.Now()
		closed := make(chan error, 1)
		go func() { closed <- s2.close(closeCtx) }()
		select {
		case err := <-closed:
			if err == nil {
				t.Error("Close reported nothing unacknowledged")
			}
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Errorf("Close returned %v after its 2s deadline", elapsed)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Close still waits 28s after its 2s deadline")
		}
	})

	t.Run("a missing topic is reported by log, metric and Stalled, and delivery resumes once it exists", func(t *testing.T) {
		aggType := testenv.UniqueName(t, "agg")
		topic := "outbox.event." + aggType
		s := readySink(t, k.Brokers(), sink.Config{DeadLetterTopic: testenv.UniqueName(t, "dlq")})
		a := &acker{}
		published := make(chan error, 1)
		go func() {
			published <- s.Publish(context.Background(), newEvent("waits", []byte(aggType), "order-1", "Fine", []byte(`{}`)), a)
		}()
		eventually(t, 30*time.Second, "an ERROR log naming the missing topic", func() bool {
			return s.logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("create it").
				FilterField(zapcoreString("topic", topic)).Len() > 0
		})
		if got := s.metric(t, "outbox_relay_topic_unavailable", "topic", topic); got != 1 {
			t.Errorf("topic_unavailable{topic=%q} = %v, want 1", topic, got)
		}
		if why, stalled := s.Stalled(); !stalled || !strings.Contains(why, topic) {
			t.Errorf("Stalled() = %q, %v; want it to name %s", why, stalled, topic)
		}
		if a.n.Load() != 0 {
			t.Fatal("acked although the topic does not exist")
		}
		if err := k.CreateTopic(context.Background(), topic, 2); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "the event acked once its topic exists", func() bool { return a.n.Load() == 1 })
		if err := <-published; err != nil {
			t.Fatalf("Publish: %v", err)
		}
		if got := s.metric(t, "outbox_relay_topic_unavailable", "topic", topic); got != 0 {
			t.Errorf("topic_unavailable{topic=%q} = %v after the topic appeared, want 0", topic, got)
		}
		if why, stalled := s.Stalled(); stalled {
			t.Errorf("Stalled() = %q after the topic appeared", why)
		}
		if got := s.metric(t, "outbox_relay_events_dead_lettered_total"); got != 0 {
			t.Errorf("events_dead_lettered_total = %v: a missing topic is waited for, never a failure", got)
		}
		s.mustClose(t)
		records := readBack(t, k.Brokers(), 30*time.Second, atLeast(1), topic)
		if len(records) != 1 || records[0].Header("id") != "waits" {
			t.Errorf("the topic holds %d records, want the one event", len(records))
		}
	})
}

func zapcoreString(key, value string) zapcore.Field {
	return zapcore.Field{Key: key, Type: zapcore.StringType, String: value}
}
