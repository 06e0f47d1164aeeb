package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// startRelay runs the relay in this process on the database's outbox table until the test ends,
// and waits until it streams.
func startRelay(t *testing.T, dsn, brokers string, pool *pgxpool.Pool, configure ...func(*relay.Config)) (slot string) {
	t.Helper()
	slot = testenv.UniqueName(t, "slot")
	cols := decoder.DefaultColumns()
	cfg := relay.Config{
		Replication: replication.Config{
			DSN: dsn, Slot: slot, Publication: slot, Table: "outbox_events",
			Columns:    []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload, cols.Headers},
			CreateSlot: true, CreatePublication: true, StatusInterval: 200 * time.Millisecond,
		},
		Decoder:         decoder.Config{Table: "outbox_events", Columns: cols},
		Sink:            sink.Config{Brokers: []string{brokers}},
		ShutdownTimeout: 10 * time.Second,
	}
	for _, c := range configure {
		c(&cfg)
	}
	r, err := relay.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("relay did not stop within a minute")
		}
	})
	await.True(t, 60*time.Second, "the relay to stream", func() bool {
		var active bool
		err := pool.QueryRow(context.Background(), "SELECT active AND confirmed_flush_lsn IS NOT NULL FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		return err == nil && active
	})
	return slot
}

type depositEvent struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

// The whole pattern: a producer writes events with the outbox package in its transactions, the
// relay publishes them, and a consumer group applies them through the inbox, committing offsets
// only after its database transaction. The consumer stops once without committing what it applied,
// so Kafka redelivers; the balances must still count every event exactly once.
func TestProducerRelayAndInboxConsumerApplyEveryEventExactlyOnceDespiteRedelivery(t *testing.T) {
	dsn, pool := newDB(t)
	kafkaSvc := testenv.SharedKafka(t)
	brokers := kafkaSvc.Brokers()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Created up front: the relay waits and retries when a topic is still being auto-created, which
	// only slows the test down.
	aggType := testenv.UniqueName(t, "account")
	if err := kafkaSvc.CreateTopic(ctx, harness.TopicFor(aggType), 3); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	startRelay(t, dsn, brokers, pool)

	// Producer: 40 transactions of 3 deposits over 4 accounts.
	const txs, perTx = 40, 3
	want := map[string]int{}
	for i := range txs {
		events := make([]outbox.Event, perTx)
		for j := range events {
			d := depositEvent{Account: fmt.Sprintf("acc-%d", (i+j)%4), Amount: i*perTx + j + 1}
			want[d.Account] += d.Amount
			events[j] = outbox.Event{AggregateType: aggType, AggregateID: d.Account, EventType: "Deposited", Payload: d}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Write(ctx, tx, events...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Everything is in Kafka (and the topic exists, which a group reader needs at its start).
	all := harness.NewConsumer(brokers, harness.TopicFor(aggType))
	defer all.Close()
	rctx, rcancel := context.WithTimeout(ctx, 90*time.Second)
	defer rcancel()
	if err := all.ReadUntil(rctx, 0, func(recs []harness.Record) bool { return len(recs) >= txs*perTx }); err != nil {
		t.Fatal(err)
	}

	store, err := inbox.New(inbox.Config{Consumer: "balances"})
	if err != nil {
		t.Fatal(err)
	}
	group := testenv.UniqueName(t, "group")
	newReader := func() *kafka.Reader {
		return kafka.NewReader(kafka.ReaderConfig{
			Brokers: []string{brokers}, GroupID: group, Topic: harness.TopicFor(aggType),
			StartOffset: kafka.FirstOffset, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 200 * time.Millisecond,
			HeartbeatInterval: time.Second, SessionTimeout: 10 * time.Second, RebalanceTimeout: 10 * time.Second,
		})
	}
	// consume applies up to n messages; it commits the offsets of the first `commit` of them only.
	skipped, fetched := 0, 0
	consume := func(r *kafka.Reader, n, commit int, done func() bool) {
		t.Helper()
		for i := 0; i < n && !done(); i++ {
			fetched++
			m, err := r.FetchMessage(ctx)
			if err != nil {
				t.Fatalf("fetch: %v", err)
			}
			id, err := inbox.EventID(m)
			if err != nil {
				t.Fatal(err)
			}
			var d depositEvent
			if err := json.Unmarshal(m.Value, &d); err != nil {
				t.Fatalf("payload %q: %v", m.Value, err)
			}
			processed, err := store.Process(ctx, pool, id, depositor(d.Account, d.Amount))
			if err != nil {
				t.Fatal(err)
			}
			if !processed {
				skipped++
			}
			if i < commit {
				if err := r.CommitMessages(ctx, m); err != nil {
					t.Fatalf("commit: %v", err)
				}
			}
		}
	}
	never := func() bool { return false }

	// First run: apply 50 events but commit only 20, then stop as a crash after the database
	// commit and before the offset commit would.
	r := newReader()
	consume(r, 50, 20, never)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if skipped != 0 {
		t.Fatalf("%d events skipped before any redelivery", skipped)
	}

	// Second run, same group: the 30 uncommitted messages come again, with the rest. Partitions
	// are read side by side, so a partition's redeliveries may come after every new event of the
	// others: read every message not committed before, not only until the ledger is complete.
	r = newReader()
	defer r.Close()
	ledger := func() int { return count(t, pool, "SELECT count(*) FROM processed_events WHERE consumer = 'balances'") }
	fetched = 0
	uncommitted := txs*perTx - 20
	consume(r, 10*txs*perTx, 10*txs*perTx, func() bool { return fetched >= uncommitted && ledger() == txs*perTx })

	for account, amount := range want {
		if got := balance(t, pool, account); got != amount {
			t.Errorf("%s balance = %d, want %d", account, got, amount)
		}
	}
	if skipped < 30 {
		t.Errorf("%d redelivered events were skipped, want at least the 30 whose offsets were not committed", skipped)
	}
}

// With the relay's delivery: exactly-once, a kafka-go consumer reads with read_committed, yet
// kafka-go hands it each Kafka transaction's commit marker as a message (and would hand it the
// records of aborted transactions). TransactionMarker tells the markers; the inbox does the rest.
func TestAKafkaGoConsumerOfAnExactlyOnceRelaySkipsTransactionMarkersAndAppliesEveryEventOnce(t *testing.T) {
	dsn, pool := newDB(t)
	kafkaSvc := testenv.SharedKafka(t)
	brokers := kafkaSvc.Brokers()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	aggType := testenv.UniqueName(t, "account")
	if err := kafkaSvc.CreateTopic(ctx, harness.TopicFor(aggType), 2); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	startRelay(t, dsn, brokers, pool, func(c *relay.Config) {
		c.Sink.Transactions = &sink.Transactions{ID: testenv.UniqueName(t, "txn"), PositionsTopic: testenv.UniqueName(t, "positions")}
	})

	const events = 30
	want := map[string]int{}
	for i := range events {
		d := depositEvent{Account: fmt.Sprintf("acc-%d", i%3), Amount: i + 1}
		want[d.Account] += d.Amount
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: aggType, AggregateID: d.Account, EventType: "Deposited", Payload: d})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // several Kafka transactions, so several markers
	}

	store, err := inbox.New(inbox.Config{Consumer: "balances"})
	if err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: []string{brokers}, GroupID: testenv.UniqueName(t, "group"), Topic: harness.TopicFor(aggType),
		StartOffset: kafka.FirstOffset, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 200 * time.Millisecond,
		HeartbeatInterval: time.Second, SessionTimeout: 10 * time.Second, RebalanceTimeout: 10 * time.Second,
		IsolationLevel: kafka.ReadCommitted,
	})
	defer r.Close()
	markers := 0
	for count(t, pool, "SELECT count(*) FROM processed_events WHERE consumer = 'balances'") < events {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		if inbox.TransactionMarker(m) {
			markers++
		} else {
			id, err := inbox.EventID(m)
			if err != nil {
				t.Fatalf("a message that is neither an event nor a marker: %v (key %q, value %q)", err, m.Key, m.Value)
			}
			var d depositEvent
			if err := json.Unmarshal(m.Value, &d); err != nil {
				t.Fatalf("payload %q: %v", m.Value, err)
			}
			if _, err := store.Process(ctx, pool, id, depositor(d.Account, d.Amount)); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}
	if markers == 0 {
		t.Error("kafka-go returned no transaction marker: the test did not see what it is about")
	}
	for account, amount := range want {
		if got := balance(t, pool, account); got != amount {
			t.Errorf("%s balance = %d, want %d", account, got, amount)
		}
	}
	t.Logf("%d events applied, %d transaction markers skipped", events, markers)
}
