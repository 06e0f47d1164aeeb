// Command consumer is the consumer half of the outbox pattern: it reads OrderCreated events with a
// kafka-go consumer group and keeps per-customer order totals, applying every event exactly once.
//
// It reads with isolation.level=read_committed, as consumers of a relay with delivery: exactly-once
// must (see docs/guarantees.md, "Exactly-once delivery").
//
// For each message it runs one database transaction that records the event id (inbox) and updates
// the totals, and commits the message's Kafka offset only after that transaction committed. A crash
// in between redelivers the message; the inbox then sees the id and skips it. A message that cannot
// be applied is retried and, if it still fails, the consumer exits without committing its offset:
// it is redelivered after the restart, never skipped.
//
// With OUTBOX_SCHEMA_REGISTRY_URLS set (a relay with value_encoding avro, protobuf or json-schema,
// or key_encoding avro), it
// reads each record's key and value back through the registry (inbox.Unframe), knowing nothing but
// the registry's URL.
//
//	make up && set -a && . .local/services.env && set +a
//	go run ./examples/consumer -group order-totals
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/schemaregistry"
	"github.com/outbox-relay/outbox-relay/schemas"
)

// orderCreated is the part of the producer's payload this consumer needs.
type orderCreated struct {
	OrderID  string  `json:"order_id"`
	Customer string  `json:"customer"`
	Total    float64 `json:"total"`
}

// Attempts at applying one message before giving up (and exiting, so it is redelivered).
const maxAttempts = 5

func main() {
	topic := flag.String("topic", "outbox.event.order", "topic to consume")
	group := flag.String("group", "order-totals", "consumer group, also the inbox consumer name")
	flag.Parse()
	if err := run(*topic, *group); err != nil && !errors.Is(err, context.Canceled) {
		log.Printf("consumer: %v", err)
		os.Exit(1)
	}
}

func run(topic, group string) error {
	dsn, brokers := os.Getenv("OUTBOX_PG_DSN"), os.Getenv("OUTBOX_KAFKA_BROKERS")
	if dsn == "" || brokers == "" {
		return fmt.Errorf("set OUTBOX_PG_DSN and OUTBOX_KAFKA_BROKERS (make up writes them to .local/services.env)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := prepare(ctx, pool, group)
	if err != nil {
		return err
	}

	reader := kafka.NewReader(kafka.ReaderConfig{
		Brokers:     strings.Split(brokers, ","),
		GroupID:     group,
		Topic:       topic,
		StartOffset: kafka.FirstOffset, // a new group starts at the beginning
		// CommitInterval 0: CommitMessages commits synchronously, so "committed" means committed.
		//
		// read_committed: with the relay's delivery: exactly-once, read no further than what Kafka
		// transactions committed. kafka-go stops there but still returns the records of aborted
		// transactions and the transactions' markers (skipped below), so the inbox stays necessary
		// with kafka-go (a Java, librdkafka or franz-go consumer with read_committed drops both).
		IsolationLevel: kafka.ReadCommitted,
	})
	defer reader.Close()
	framed, closeRegistry, err := registryDeserializer()
	if err != nil {
		return err
	}
	defer closeRegistry()
	log.Printf("consuming %s as group %s", topic, group)

	for {
		m, err := reader.FetchMessage(ctx) // FetchMessage, not ReadMessage: no automatic commit
		if err != nil {
			return err
		}
		if inbox.TransactionMarker(m) {
			// kafka-go returns the commit markers of Kafka transactions (delivery: exactly-once)
			// as messages: no event, only an offset to commit.
			if err := reader.CommitMessages(ctx, m); err != nil {
				return err
			}
			continue
		}
		if err := handle(ctx, reader, framed, store, pool, m); err != nil {
			return err
		}
	}
}

// handle applies one delivery (once: the inbox skips a redelivery) and commits its offset.
func handle(ctx context.Context, reader *kafka.Reader, framed inbox.Framed, store *inbox.Store, pool *pgxpool.Pool, m kafka.Message) error {
	var err error
	if framed != nil {
		// The registry encodings (avro, protobuf, json-schema): the key and value read back as the
		// aggregate id and the JSON payload, through the registry.
		if m, err = inbox.Unframe(ctx, framed, m); err != nil {
			return err // the registry cannot answer: its offset is not committed
		}
	}
	// ParseDelivery reads the relay's headers, and a CloudEvent (envelope: cloudevents) in
	// either content mode: the payload is then the event's data.
	d, err := inbox.ParseDelivery(m)
	if err != nil {
		return err // without an id a redelivery cannot be recognised: stop rather than guess
	}
	id := d.ID
	processed, err := applyWithRetry(ctx, store, pool, id, d.Payload)
	if err != nil {
		return fmt.Errorf("event %s at %s/%d@%d: %w (its offset is not committed; it is redelivered after a restart)",
			id, m.Topic, m.Partition, m.Offset, err)
	}
	if err := reader.CommitMessages(ctx, m); err != nil {
		return err // also safe: the next delivery of m is skipped by the inbox
	}
	if processed {
		log.Printf("applied event %s", id)
	} else {
		log.Printf("skipped event %s: applied before (a redelivery)", id)
	}
	return nil
}

// prepare makes the inbox's tables and the example's own.
func prepare(ctx context.Context, pool *pgxpool.Pool, group string) (*inbox.Store, error) {
	store, err := inbox.New(inbox.Config{Consumer: group})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS customer_totals (
		customer text PRIMARY KEY, orders bigint NOT NULL, total numeric NOT NULL)`); err != nil {
		return nil, err
	}
	return store, nil
}

// registryDeserializer reads registry-framed records back when OUTBOX_SCHEMA_REGISTRY_URLS is set
// (the relay's registry encodings); nil without it.
func registryDeserializer() (inbox.Framed, func(), error) {
	urls := os.Getenv("OUTBOX_SCHEMA_REGISTRY_URLS")
	if urls == "" {
		return nil, func() {}, nil
	}
	client, err := schemaregistry.New(schemaregistry.Options{URLs: strings.Split(urls, ",")})
	if err != nil {
		return nil, nil, err
	}
	return schemas.NewDeserializer(client, schemas.Formats()...), client.Close, nil // the schema's type picks the format
}

// applyWithRetry applies one event in its own transaction, retrying transient failures in place:
// a later message of the partition must not be committed while this one is not applied.
func applyWithRetry(ctx context.Context, store *inbox.Store, pool *pgxpool.Pool, id string, value []byte) (bool, error) {
	var ev orderCreated
	if err := json.Unmarshal(value, &ev); err != nil {
		return false, fmt.Errorf("decode payload: %w", err) // retrying cannot help
	}
	var err error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		var processed bool
		processed, err = store.Process(ctx, pool, id, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO customer_totals (customer, orders, total) VALUES ($1, 1, $2)
				ON CONFLICT (customer) DO UPDATE SET orders = customer_totals.orders + 1,
					total = customer_totals.total + excluded.total`, ev.Customer, ev.Total)
			return err
		})
		if err == nil {
			return processed, nil
		}
		log.Printf("event %s: attempt %d: %v", id, attempt, err)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(time.Duration(attempt) * 500 * time.Millisecond):
		}
	}
	return false, err
}
