// Command demo shows the transactional outbox end to end (make demo runs it next to a relay): it
// writes orders and their outbox events in one transaction each, then reads the events back from
// Kafka as the relay publishes them.
//
// It needs OUTBOX_PG_DSN and OUTBOX_KAFKA_BROKERS (make up writes them to .local/services.env), a
// migrated outbox table (outbox-relay migrate) and a running relay (outbox-relay run). Runs are
// independent: order ids are new each time, and only the records of this run's events are printed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

const (
	topic = "outbox.event.order"
	// readTimeout bounds the wait for every event to come back from Kafka.
	readTimeout = 60 * time.Second
	// slotTimeout bounds the wait for the relay to stream: events committed before its slot exists
	// are not in the slot.
	slotTimeout = 60 * time.Second
)

type order struct {
	ID       string      `json:"id"`
	Customer string      `json:"customer"`
	Total    json.Number `json:"total"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	dsn, brokers := os.Getenv("OUTBOX_PG_DSN"), os.Getenv("OUTBOX_KAFKA_BROKERS")
	if dsn == "" || brokers == "" {
		return errors.New("set OUTBOX_PG_DSN and OUTBOX_KAFKA_BROKERS (make up writes them to .local/services.env)")
	}
	slot := os.Getenv("OUTBOX_SLOT")
	if slot == "" {
		slot = "outbox_relay"
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)

	if err := waitForRelay(ctx, conn, slot); err != nil {
		return err
	}
	ids, err := writeOrders(ctx, conn)
	if err != nil {
		return err
	}
	return readBack(ctx, strings.Split(brokers, ","), ids)
}

// waitForRelay waits until a process streams the relay's slot.
func waitForRelay(ctx context.Context, conn *pgx.Conn, slot string) error {
	deadline := time.Now().Add(slotTimeout)
	for {
		var active bool
		err := conn.QueryRow(ctx, "SELECT active AND confirmed_flush_lsn IS NOT NULL FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		if err == nil && active {
			fmt.Printf("relay is streaming slot %s\n", slot)
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read slot %s: %w", slot, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relay did not start streaming slot %s within %s: is outbox-relay run running?", slot, slotTimeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// writeOrders commits five orders, each with its OrderCreated event, and an OrderShipped event for
// the first; it returns the event ids.
func writeOrders(ctx context.Context, conn *pgx.Conn) (map[string]bool, error) {
	_, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id       text    PRIMARY KEY,
		customer text    NOT NULL,
		total    numeric NOT NULL)`)
	if err != nil {
		return nil, fmt.Errorf("create table orders: %w", err)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	run := hex.EncodeToString(b[:]) // new order ids on every run
	customers := []string{"Ada", "Grace", "Linus", "Barbara", "Ken"}
	totals := []string{"19.99", "5.00", "120.50", "42.00", "7.25"}
	ids := make(map[string]bool)
	const insertEvent = `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', $1, $2, $3, '{"tenant": "acme"}') RETURNING id::text`

	var first order
	for i, customer := range customers {
		o := order{ID: fmt.Sprintf("ord-%s-%d", run, i+1), Customer: customer, Total: json.Number(totals[i])}
		if i == 0 {
			first = o
		}
		payload, _ := json.Marshal(o)
		// The order and its event commit together or not at all: that is the outbox pattern.
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3)", o.ID, o.Customer, string(o.Total)); err != nil {
				return err
			}
			var id string
			if err := tx.QueryRow(ctx, insertEvent, o.ID, "OrderCreated", payload).Scan(&id); err != nil {
				return err
			}
			ids[id] = true
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("write order %s: %w", o.ID, err)
		}
		fmt.Printf("committed order %s (%s, %s) with its OrderCreated event\n", o.ID, o.Customer, o.Total)
	}
	shipped, _ := json.Marshal(map[string]string{"order_id": first.ID, "carrier": "DHL", "tracking": "JD0146" + strings.ToUpper(run)})
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var id string
		if err := tx.QueryRow(ctx, insertEvent, first.ID, "OrderShipped", shipped).Scan(&id); err != nil {
			return err
		}
		ids[id] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("write OrderShipped for %s: %w", first.ID, err)
	}
	fmt.Printf("committed OrderShipped for order %s\n", first.ID)
	return ids, nil
}

// readBack reads the topic from its beginning, printing this run's records as they arrive, until
// every event in ids has been seen.
func readBack(ctx context.Context, brokers []string, ids map[string]bool) error {
	fmt.Printf("\nreading %s from the beginning (%d events to see, at most %s)\n\n", topic, len(ids), readTimeout)
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	records := make(chan kafka.Message)
	readers := make(map[int]*kafka.Reader)
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	seen, skipped := make(map[string]bool), 0
	poll := time.NewTicker(500 * time.Millisecond)
	defer poll.Stop()
	var lastErr error
	for len(seen) < len(ids) {
		// The relay creates the topic with its first record; pick up partitions as they appear.
		if err := addReaders(ctx, brokers, readers, records); err != nil {
			lastErr = err
		}
		select {
		case m := <-records:
			id := header(m, "id")
			if !ids[id] || seen[id] {
				skipped++ // an earlier run's event, or a duplicate delivery
				continue
			}
			seen[id] = true
			printRecord(m)
		case <-poll.C:
		case <-ctx.Done():
			detail := ""
			if lastErr != nil {
				detail = fmt.Sprintf(" (last Kafka error: %v)", lastErr)
			}
			return fmt.Errorf("timed out after %s: saw %d of the %d events on %s%s; is the relay running? see its log",
				readTimeout, len(seen), len(ids), topic, detail)
		}
	}
	fmt.Printf("saw all %d events", len(ids))
	if skipped > 0 {
		fmt.Printf(" (and skipped %d records of earlier runs or redeliveries)", skipped)
	}
	fmt.Println()
	return nil
}

// addReaders starts a reader, from the first offset, for each partition of the topic not read yet.
func addReaders(ctx context.Context, brokers []string, readers map[int]*kafka.Reader, out chan<- kafka.Message) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return err
	}
	for _, t := range md.Topics {
		if t.Error != nil {
			return t.Error // not created yet
		}
		for _, p := range t.Partitions {
			if readers[p.ID] != nil {
				continue
			}
			// read_committed, as consumers of a relay with delivery: exactly-once must.
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p.ID,
				MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 200 * time.Millisecond, IsolationLevel: kafka.ReadCommitted})
			if err := r.SetOffset(kafka.FirstOffset); err != nil {
				r.Close()
				return err
			}
			readers[p.ID] = r
			go func() {
				for {
					m, err := r.ReadMessage(ctx)
					if err != nil {
						return // ctx ended or the reader was closed
					}
					select {
					case out <- m:
					case <-ctx.Done():
						return
					}
				}
			}()
		}
	}
	return nil
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func printRecord(m kafka.Message) {
	hs := make([]string, 0, len(m.Headers))
	for _, h := range m.Headers {
		hs = append(hs, h.Key+"="+string(h.Value))
	}
	fmt.Printf("%s  partition=%d  offset=%d  key=%s\n  headers: %s\n  value:   %s\n\n",
		m.Topic, m.Partition, m.Offset, m.Key, strings.Join(hs, " "), m.Value)
}
