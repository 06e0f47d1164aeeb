package redrive

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// An event whose partition a column chose (extra_fields placement partition) and whose timestamp
// is its own (columns.timestamp), dead-lettered because its topic's max.message.bytes was too
// small, goes back where the relay would have put it: into the partition the column named, next to
// its aggregate's other events, with its own timestamp. The key's partition would put it in
// another partition than the aggregate's other events, after them in no order a consumer can see.
func TestARedrivenEventGoesToThePartitionItsColumnChoseWithItsTimestamp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := testenv.SharedKafka(t)
	dlq, topic := testenv.UniqueName(t, "dlq"), testenv.UniqueName(t, "orders")
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers())}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 3, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: "2000"}},
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := k.CreateTopic(ctx, dlq, 1); err != nil {
		t.Fatal(err)
	}
	// A key whose own partition is not the one the column names.
	const named = 2
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("o-%d", i); (&kafka.Murmur2Balancer{Consistent: true}).Balance(kafka.Message{Key: []byte(k)}, 0, 1, 2) != named {
			key = k
		}
	}
	occurred := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

	s, err := sink.New(sink.Config{Brokers: []string{k.Brokers()}, DeadLetterTopic: dlq,
		Record: record.Options{TopicTemplate: topic, ExtraHeaders: []string{"part"}, ExtraPlacement: []record.Placement{record.PlacePartition}}}, zaptest.NewLogger(t), metrics.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	var acks sink.AckGroup
	acks.Add()
	if err := s.Publish(ctx, &decoder.Event{ID: []byte("e-1"), AggregateType: []byte("order"), AggregateID: []byte(key),
		Payload: []byte(`"` + strings.Repeat("x", 3000) + `"`), Extra: [][]byte{[]byte(fmt.Sprint(named))}, Time: occurred,
		Tx: decoder.TxInfo{CommitLSN: 0x1000, CommitTime: time.Now()}}, &acks); err != nil {
		t.Fatal(err)
	}
	if err := acks.Wait(ctx); err != nil {
		t.Fatal(err)
	}

	// The cause fixed, the dead letter goes back.
	if _, err := client.IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{Resources: []kafka.IncrementalAlterConfigsRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic,
		Configs: []kafka.IncrementalAlterConfigsRequestConfig{{Name: "max.message.bytes", Value: "1048588", ConfigOperation: kafka.ConfigOperationSet}},
	}}}); err != nil {
		t.Fatal(err)
	}
	rd, err := Run(ctx, Config{Brokers: []string{k.Brokers()}, DeadLetterTopic: dlq, Partition: -1, FromOffset: -1, ToOffset: -1,
		BuiltinHeaders: record.BuiltinHeaders})
	if err != nil || rd.Redriven != 1 {
		t.Fatalf("redrive = %+v, %v; want the dead letter redriven", rd, err)
	}
	recs, err := harness.Reread(ctx, k.Brokers(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("%d records on %s, want 1", len(recs), topic)
	}
	if r := recs[0]; r.Partition != named || !r.Time.Equal(occurred) {
		t.Fatalf("the redriven record is in partition %d, stamped %v; want partition %d (the column's), stamped %v", r.Partition, r.Time.UTC(), named, occurred)
	}
}
