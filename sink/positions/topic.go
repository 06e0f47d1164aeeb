package positions

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// topicConfig is what the relay creates a missing positions topic with. Compaction keeps
// the latest position per key; it can only clean closed segments, so segments roll hourly (and
// small): that keeps the topic, and the backward read of Read, short.
var topicConfig = []kafka.ConfigEntry{
	{ConfigName: "cleanup.policy", ConfigValue: "compact"},
	{ConfigName: "segment.ms", ConfigValue: "3600000"},
	{ConfigName: "segment.bytes", ConfigValue: "16777216"},
}

// Partition returns the partition of the positions topic that holds key (murmur2, as a
// Java producer would place it), creating the topic, compacted, when it is missing. created is
// true when this call created it (so it holds no position yet).
func Partition(ctx context.Context, client *kafka.Client, topic, key string, log *zap.Logger) (partition int, created bool, err error) {
	for attempt := 0; ; attempt++ {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 {
			t := md.Topics[0]
			switch {
			case t.Error == nil && len(t.Partitions) > 0:
				return int((producer.Murmur2([]byte(key)) & 0x7fffffff) % uint32(len(t.Partitions))), created, nil
			case t.Error == nil || errors.Is(t.Error, kafka.LeaderNotAvailable):
				err = kafka.LeaderNotAvailable // just created: no partitions yet
			case errors.Is(t.Error, kafka.UnknownTopicOrPartition):
				if created {
					err = t.Error // created, not yet known to the broker answering
					break
				}
				if cerr := createTopic(ctx, client, topic); cerr != nil {
					if ctx.Err() != nil || !retriableCreate(cerr) {
						return 0, false, cerr
					}
					err = cerr // a timeout, a controller moving, the network: try again
					break
				}
				log.Info("created the positions topic (compacted)", zap.String("topic", topic))
				created = true
				continue
			case errors.Is(t.Error, kafka.TopicAuthorizationFailed):
				return 0, false, fmt.Errorf("sink: the relay may not use positions topic %s: %w (grant its principal READ, WRITE and DESCRIBE on it, or set positions_topic)", topic, t.Error)
			default:
				err = t.Error
			}
		}
		if err == nil {
			err = errors.New("metadata does not list the topic")
		}
		if werr := producer.Wait(ctx, attempt, log, "positions topic not available yet; retrying", err); werr != nil {
			return 0, false, fmt.Errorf("sink: positions topic %s: %w", topic, werr)
		}
	}
}

// retriableCreate reports whether creating the positions topic may succeed if tried again: a
// refusal the broker calls temporary (a request timed out, the controller moved, a quota), or no
// answer at all (the connection, a timeout); any other refusal needs an operator.
func retriableCreate(err error) bool {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		return kerr.Temporary()
	}
	return true
}

func createTopic(ctx context.Context, client *kafka.Client, topic string) error {
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: -1, ConfigEntries: topicConfig,
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	switch {
	case err == nil, errors.Is(err, kafka.TopicAlreadyExists):
		return nil
	case errors.Is(err, kafka.TopicAuthorizationFailed), errors.Is(err, kafka.ClusterAuthorizationFailed):
		return fmt.Errorf("sink: positions topic %s does not exist and the relay may not create it: %w "+
			"(create it with cleanup.policy=compact, or set positions_topic to one that exists)", topic, err)
	}
	return fmt.Errorf("sink: positions topic %s does not exist and creating it failed: %w "+
		"(create it with cleanup.policy=compact, or set positions_topic to one that exists)", topic, err)
}

// CheckTopic refuses a positions topic that deletes records by time or size (one that
// existed before the relay, created by an operator or the brokers' auto-creation): a relay quiet
// for longer than its retention would find no position at its next start. It warns, without
// refusing, when one lost disk can lose the latest position: a single replica, or
// min.insync.replicas 1, which lets acks=all be answered by one replica. A principal that may not
// describe the topic's configuration, or a broker that does not answer, leaves it unchecked, with
// a warning: the check protects against a mistake, and must not refuse a relay that works.
func CheckTopic(ctx context.Context, client *kafka.Client, topic string, log *zap.Logger) error {
	var policy, minISR string
	for attempt := 0; ; attempt++ {
		res, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"cleanup.policy", "min.insync.replicas"},
		}}})
		if err == nil && len(res.Resources) != 1 {
			err = errors.New("describe configs: the answer does not hold the topic")
		}
		if err == nil {
			err = res.Resources[0].Error
		}
		if err == nil {
			for _, e := range res.Resources[0].ConfigEntries {
				switch e.ConfigName {
				case "cleanup.policy":
					policy = e.ConfigValue
				case "min.insync.replicas":
					minISR = e.ConfigValue
				}
			}
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("sink: positions topic %s: %w", topic, ctx.Err())
		}
		if producer.AuthFailed(err) || attempt >= 4 {
			log.Warn("cannot read the positions topic's configuration, so it is not checked; it must have cleanup.policy=compact "+
				"(grant the relay's principal DescribeConfigs on it to have it checked)", zap.String("topic", topic), zap.Error(err))
			return nil
		}
		if werr := producer.Wait(ctx, attempt, log, "retrying reading the positions topic's configuration", err); werr != nil {
			return fmt.Errorf("sink: positions topic %s: %w", topic, werr)
		}
	}
	if policy != "compact" {
		return fmt.Errorf("sink: positions topic %s has cleanup.policy %s: it deletes old records, so a relay that commits nothing for its retention "+
			"loses its position. Make it compacted: kafka-configs --bootstrap-server <broker> --alter --entity-type topics --entity-name %s "+
			"--add-config cleanup.policy=compact (or set positions_topic to a new name: the relay creates it compacted)", topic, policy, topic)
	}
	replicas := 0
	if md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}}); err == nil && len(md.Topics) == 1 {
		for _, p := range md.Topics[0].Partitions {
			if replicas == 0 || len(p.Replicas) < replicas {
				replicas = len(p.Replicas)
			}
		}
	}
	isr, _ := strconv.Atoi(minISR)
	switch {
	case replicas == 1:
		log.Warn("the positions topic has replication factor 1: losing that broker's disk loses every relay's position, and "+
			"exactly-once then stops at the next start until duplicates are accepted; give it at least 3 replicas "+
			"(kafka-reassign-partitions) where the cluster has them", zap.String("topic", topic), zap.Int("replication_factor", replicas))
	case replicas > 1 && isr > 0 && isr < 2:
		log.Warn("the positions topic has min.insync.replicas "+minISR+": a position acknowledged by one replica is lost with that "+
			"replica's disk; set min.insync.replicas=2 on it (kafka-configs --alter --add-config min.insync.replicas=2)",
			zap.String("topic", topic), zap.Int("replication_factor", replicas), zap.Int("min_insync_replicas", isr))
	}
	return nil
}
