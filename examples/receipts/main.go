// Command receipts is a version-aware consumer with an effect outside the database: for every
// OrderCreated event it counts the order in customer_totals (a database change) and e-mails a
// receipt (an external effect), each exactly once, in each order's version order.
//
// The inbox.Consumer does the bookkeeping. In one transaction per event it checks the order's
// aggregate_version against the version applied (new, duplicate, stale, or a gap), runs the
// handler, and records the e-mail as a pending operation. After that commit it sends the e-mail
// with an idempotency key derived from the event id and records the outcome; only then is the
// Kafka offset committed. Killed anywhere in between, the consumer gets the event again after its
// restart: the database change is recognised as done, and a pending e-mail is first looked up at
// the provider (Reconcile) rather than sent again.
//
// The mail provider here is a stand-in served by this process (MAIL_API unset); point MAIL_API at
// a real one that accepts an Idempotency-Key header.
//
//	make up && set -a && . .local/services.env && set +a
//	go run ./cmd/outbox-relay migrate
//	psql "$OUTBOX_PG_DSN" -c 'ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS aggregate_version bigint'
//	OUTBOX_COLUMNS_AGGREGATE_VERSION=aggregate_version go run ./cmd/outbox-relay run &
//	go run ./examples/producer -customer ada -total 42.50 -versioned
//	go run ./examples/receipts
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
)

type orderCreated struct {
	OrderID  string  `json:"order_id"`
	Customer string  `json:"customer"`
	Total    float64 `json:"total"`
}

func main() {
	if err := run(); err != nil && !errors.Is(err, context.Canceled) {
		log.Printf("receipts: %v", err)
		os.Exit(1)
	}
}

func run() error {
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
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS customer_totals (
		customer text PRIMARY KEY, orders bigint NOT NULL, total numeric NOT NULL)`); err != nil {
		return err
	}
	mailAPI := os.Getenv("MAIL_API")
	if mailAPI == "" {
		if mailAPI, err = startFakeMailProvider(); err != nil {
			return err
		}
	}
	consumer, err := newConsumer(ctx, pool, mailAPI)
	if err != nil {
		return err
	}
	// Receipts whose events will not come again (a crash after the offset commit of a consumer
	// that did not wait for Handle) are settled at every start.
	if n, err := consumer.ResumePending(ctx); err != nil {
		return err
	} else if n > 0 {
		log.Printf("settled %d receipts left pending by an earlier run", n)
	}
	reader := kafka.NewReader(kafka.ReaderConfig{
		Brokers: strings.Split(brokers, ","), GroupID: "receipts", Topic: "outbox.event.order",
		StartOffset: kafka.FirstOffset,
	})
	defer reader.Close()
	return consume(ctx, reader, consumer)
}

// newConsumer sets up the inbox's tables and the consumer that counts each order and e-mails its
// receipt.
func newConsumer(ctx context.Context, pool *pgxpool.Pool, mailAPI string) (*inbox.Consumer, error) {
	store, err := inbox.New(inbox.Config{Consumer: "receipts"})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx, pool); err != nil { // processed_events, versions, operations
		return nil, err
	}
	reg := inbox.NewRegistry().Handle("OrderCreated", 1, countOrder)
	return &inbox.Consumer{
		DB: pool, Store: store, Registry: reg,
		// One topic per aggregate type and key = order id: a gap means an event was lost on the
		// way, so ask for it again instead of waiting.
		OnGap: inbox.ReplayOnGap(func(_ context.Context, _ pgx.Tx, g inbox.GapInfo) error {
			log.Printf("versions missing before event %s; to fill the gap run: %s", g.ID, g.ReplayCommand())
			return nil
		}),
		Effects: map[string]inbox.Effect{"receipt": mailEffect(mailAPI)},
	}, nil
}

// countOrder handles OrderCreated: the order is counted in customer_totals and its receipt
// recorded, both in the event's transaction.
func countOrder(ctx context.Context, e *inbox.Event) error {
	var o orderCreated
	if err := json.Unmarshal(e.Payload, &o); err != nil {
		return fmt.Errorf("decode payload: %w", err)
	}
	if _, err := e.Tx.Exec(ctx, `INSERT INTO customer_totals (customer, orders, total) VALUES ($1, 1, $2)
			ON CONFLICT (customer) DO UPDATE SET orders = customer_totals.orders + 1,
				total = customer_totals.total + excluded.total`, o.Customer, o.Total); err != nil {
		return err
	}
	// Not sent here: recorded, and sent after this transaction commits.
	_, err := e.Intend(ctx, "receipt", o)
	return err
}

// consume handles the topic's events one by one, committing each offset only once the event is
// handled.
func consume(ctx context.Context, reader *kafka.Reader, consumer *inbox.Consumer) error {
	for {
		m, err := reader.FetchMessage(ctx)
		if err != nil {
			return err
		}
		outcome, err := consumer.Handle(ctx, m)
		if err != nil {
			// Not committed: redelivered after a restart (a gap under WaitOnGap, a schema version
			// nobody handles, a mail provider that is down).
			return fmt.Errorf("%s/%d@%d: %w", m.Topic, m.Partition, m.Offset, err)
		}
		log.Printf("order %s version %s: %s", m.Key, header(m, "aggregate_version"), outcome)
		if err := reader.CommitMessages(ctx, m); err != nil {
			return err
		}
	}
}

// mailEffect sends receipts through an HTTP mail API that deduplicates by Idempotency-Key and
// answers GET /messages/<key> for a message it has sent.
func mailEffect(api string) inbox.Effect {
	return inbox.Effect{
		Perform: func(ctx context.Context, op inbox.Operation) (string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/messages", strings.NewReader(string(op.Request)))
			if err != nil {
				return "", err
			}
			req.Header.Set("Idempotency-Key", op.Key)
			return call(req)
		},
		Reconcile: func(ctx context.Context, op inbox.Operation) (string, bool, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+"/messages/"+op.Key, nil)
			if err != nil {
				return "", false, err
			}
			id, err := call(req)
			if errors.Is(err, errNotFound) {
				return "", false, nil // never sent: Perform sends it
			}
			return id, err == nil, err
		},
	}
}

var errNotFound = errors.New("not found")

func call(req *http.Request) (string, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return "", errNotFound
	case resp.StatusCode >= 300:
		return "", fmt.Errorf("mail API: %s: %s", resp.Status, body)
	}
	return string(body), nil
}

// startFakeMailProvider serves a mail API that logs instead of sending, on a local port.
func startFakeMailProvider() (string, error) {
	var mu sync.Mutex
	sent := map[string]string{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /messages", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if _, ok := sent[key]; !ok {
			sent[key] = "msg-" + key[:8]
			log.Printf("mail: receipt %s sent: %s", sent[key], body)
		}
		fmt.Fprint(w, sent[key])
	})
	mux.HandleFunc("GET /messages/{key}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		id, ok := sent[r.PathValue("key")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, id)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go http.Serve(ln, mux) //nolint:errcheck // lives as long as the process
	return "http://" + ln.Addr().String(), nil
}

func header(m kafka.Message, name string) string {
	for _, h := range m.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}
