// Command producer is the producer half of the outbox pattern: it creates an order and its
// OrderCreated event in one transaction, so the event exists exactly when the order does. The relay
// (outbox-relay run) then publishes the event to the topic outbox.event.order.
//
//	make up && set -a && . .local/services.env && set +a
//	go run ./cmd/outbox-relay migrate
//	go run ./examples/producer -customer ada -total 42.50 -tenant acme
//
// With -versioned, the event also carries the order's aggregate version, taken from a counter table
// in the same transaction (the outbox table needs an aggregate_version bigint column, and the
// relay columns.aggregate_version; see examples/receipts).
//
// With -messages the event is a transactional logical decoding message instead of an outbox row
// (the table-free outbox: nothing is stored, nothing to prune); run the relay with
// outbox_shape messages (or both) for it:
//
//	OUTBOX_OUTBOX_SHAPE=messages go run ./cmd/outbox-relay migrate
//	OUTBOX_OUTBOX_SHAPE=messages go run ./cmd/outbox-relay run &
//	go run ./examples/producer -messages -customer ada -total 42.50
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// OrderCreated is the event's payload: what consumers need, not the table row.
type OrderCreated struct {
	OrderID  string  `json:"order_id"`
	Customer string  `json:"customer"`
	Total    float64 `json:"total"`
}

func main() {
	customer := flag.String("customer", "ada", "customer name")
	total := flag.Float64("total", 42.5, "order total")
	tenant := flag.String("tenant", "", "tenant header (optional)")
	versioned := flag.Bool("versioned", false, "write the aggregate_version column, numbered by the outbox_aggregate_versions table")
	messages := flag.Bool("messages", false, "emit the event as a logical decoding message (outbox_shape messages) instead of an outbox row")
	flag.Parse()
	if *versioned && *messages {
		fmt.Fprintln(os.Stderr, "producer: -versioned numbers events through the outbox table's counter table; with -messages set outbox.Event.AggregateVersion yourself (the version your transaction gave the aggregate row)")
		os.Exit(2)
	}
	if err := run(*customer, *total, *tenant, *versioned, *messages); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

func run(customer string, total float64, tenant string, versioned, messages bool) error {
	dsn := os.Getenv("OUTBOX_PG_DSN")
	if dsn == "" {
		return fmt.Errorf("set OUTBOX_PG_DSN (make up writes it to .local/services.env)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id text PRIMARY KEY, customer text NOT NULL, total numeric NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	// A traceparent from the caller (here an environment variable; in a service, the incoming
	// request's) travels with the event as a header, so consumers can continue the trace.
	ctx = outbox.ContextWithTraceparent(ctx, os.Getenv("TRACEPARENT"))

	write := outbox.Write
	if versioned {
		cols := outbox.DefaultColumns
		cols.AggregateVersion = "aggregate_version"
		w, err := outbox.New(outbox.Config{Columns: cols, VersionTable: "outbox_aggregate_versions"})
		if err != nil {
			return err
		}
		if err := w.CreateVersionTable(ctx, pool); err != nil {
			return err
		}
		write = w.Write
	}

	orderID := fmt.Sprintf("o-%d", time.Now().UnixNano())
	var eventIDs []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3)", orderID, customer, total); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		ev := outbox.Event{
			AggregateType: "order",
			AggregateID:   orderID, // the Kafka key: one order's events stay in order
			EventType:     "OrderCreated",
			Payload:       OrderCreated{OrderID: orderID, Customer: customer, Total: total},
		}
		ev.SchemaVersion = 1
		if tenant != "" {
			ev.SetHeader(outbox.HeaderTenant, tenant)
		}
		if messages {
			// One WAL record, decoded at commit with the order's insert; no outbox row.
			eventIDs, err = outbox.Emit(ctx, tx, ev)
		} else {
			eventIDs, err = write(ctx, tx, ev)
		}
		return err
	})
	if err != nil {
		return err // nothing was written: neither the order nor its event
	}
	fmt.Printf("order %s created; event %s will be published to outbox.event.order\n", orderID, eventIDs[0])
	return nil
}
