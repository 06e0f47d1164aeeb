package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(crashingConsumer()) // crash_test.go: this process is a consumer, not the tests
	}
	testenv.Main(m)
}

// newDB creates a database with the default ledger and a business table: accounts whose balance
// each event adds to, so an event applied twice shows.
func newDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return dsn, pool
}

const deposit = `INSERT INTO accounts VALUES ($1, $2)
	ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance`

// depositor applies "add amount to account".
func depositor(account string, amount int) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, deposit, account, amount)
		return err
	}
}

func balance(t *testing.T, pool *pgxpool.Pool, account string) int {
	t.Helper()
	var b int
	err := pool.QueryRow(context.Background(), "SELECT coalesce((SELECT balance FROM accounts WHERE id = $1), 0)", account).Scan(&b)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func count(t *testing.T, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestARedeliveredEventIsAppliedOnce(t *testing.T) {
	_, pool := newDB(t)
	store, err := inbox.New(inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var got []bool
	for range 3 {
		processed, err := store.Process(ctx, pool, "evt-1", depositor("acc", 10))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, processed)
	}
	if fmt.Sprint(got) != "[true false false]" || balance(t, pool, "acc") != 10 {
		t.Fatalf("processed = %v, balance = %d; want [true false false] and 10", got, balance(t, pool, "acc"))
	}
}

func TestAConcurrentDuplicateWaitsForTheFirstDeliveryAndAppliesOnlyIfItRolledBack(t *testing.T) {
	cases := []struct {
		name      string
		isolation pgx.TxIsoLevel
		commit    bool // how the first delivery's transaction ends
		// what the second delivery reports
		wantProcessed bool
		wantSQLState  string
	}{
		{"read committed, the first commits", pgx.ReadCommitted, true, false, ""},
		{"read committed, the first rolls back", pgx.ReadCommitted, false, true, ""},
		{"repeatable read, the first commits", pgx.RepeatableRead, true, false, "40001"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, pool := newDB(t)
			ctx := context.Background()
			opts := pgx.TxOptions{IsoLevel: c.isolation}
			first, err := pool.BeginTx(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(ctx)
			if processed, err := inbox.Handle(ctx, first, "evt-1", depositor("acc", 10)); err != nil || !processed {
				t.Fatalf("first delivery: processed=%v err=%v", processed, err)
			}

			// The second delivery, on its own connection, while the first is still open.
			second, err := pool.BeginTx(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer second.Rollback(ctx)
			var pid int
			if err := second.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			type result struct {
				processed bool
				err       error
			}
			done := make(chan result, 1)
			go func() {
				p, err := inbox.Handle(ctx, second, "evt-1", depositor("acc", 10))
				done <- result{p, err}
			}()
			waitUntilBlockedOnALock(t, pool, pid)

			if c.commit {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the second delivery did not finish after the first transaction ended")
			}
			var pgErr *pgconn.PgError
			switch {
			case c.wantSQLState != "":
				if !errors.As(r.err, &pgErr) || pgErr.Code != c.wantSQLState {
					t.Fatalf("second delivery: err = %v, want SQLSTATE %s", r.err, c.wantSQLState)
				}
			case r.err != nil || r.processed != c.wantProcessed:
				t.Fatalf("second delivery: processed=%v err=%v, want processed=%v", r.processed, r.err, c.wantProcessed)
			default:
				if err := second.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if b := balance(t, pool, "acc"); b != 10 {
				t.Fatalf("balance = %d, want 10 (the event applied exactly once)", b)
			}
		})
	}
}

// waitUntilBlockedOnALock waits until backend pid waits for a lock: the second delivery is really
// concurrent with the first, not merely after it.
func waitUntilBlockedOnALock(t *testing.T, pool *pgxpool.Pool, pid int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		err := pool.QueryRow(context.Background(),
			"SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("backend %d never waited for a lock", pid)
}

func TestConsumersRacingOverTheSameEventsApplyEachExactlyOnce(t *testing.T) {
	_, pool := newDB(t)
	ctx := context.Background()
	const consumers, events = 4, 60
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		processed int
		errs      []error
	)
	for c := range consumers {
		wg.Go(func() {
			// Each consumer gets every event, in its own order, on its own connection.
			order := rand.New(rand.NewPCG(uint64(c), 7)).Perm(events)
			conn, err := pool.Acquire(ctx)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			defer conn.Release()
			for _, e := range order {
				p, err := inbox.Process(ctx, conn, fmt.Sprintf("evt-%d", e), depositor(fmt.Sprintf("acc-%d", e%5), e+1))
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				if p {
					processed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, the first: %v", len(errs), errs[0])
	}
	want := 0
	for e := range events {
		want += e + 1
	}
	got := count(t, pool, "SELECT sum(balance) FROM accounts")
	if processed != events || got != want || count(t, pool, "SELECT count(*) FROM processed_events") != events {
		t.Fatalf("processed %d times with total balance %d; want %d and %d", processed, got, events, want)
	}
}

func TestAFailedHandlerRecordsNothingSoTheRedeliveryAppliesIt(t *testing.T) {
	_, pool := newDB(t)
	ctx := context.Background()
	boom := errors.New("downstream unavailable")
	// The handler makes its change and then fails: both the change and the id must go.
	_, err := inbox.Process(ctx, pool, "evt-1", func(ctx context.Context, tx pgx.Tx) error {
		if err := depositor("acc", 10)(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the handler's error", err)
	}
	if b, n := balance(t, pool, "acc"), count(t, pool, "SELECT count(*) FROM processed_events"); b != 0 || n != 0 {
		t.Fatalf("after the failure: balance %d and %d recorded ids, want 0 and 0", b, n)
	}
	processed, err := inbox.Process(ctx, pool, "evt-1", depositor("acc", 10))
	if err != nil || !processed || balance(t, pool, "acc") != 10 {
		t.Fatalf("redelivery: processed=%v err=%v balance=%d, want true, nil, 10", processed, err, balance(t, pool, "acc"))
	}
}

func TestDatabaseSQLConsumersSharingATableEachApplyAnEventOnce(t *testing.T) {
	dsn, pool := newDB(t)
	ctx := context.Background()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA "Billing"`); err != nil {
		t.Fatal(err)
	}
	var stores []*inbox.Store
	for _, name := range []string{"invoices", "ledger"} {
		s, err := inbox.New(inbox.Config{Table: "Billing.Processed Events", Consumer: name})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.MigrateSQL(ctx, db); err != nil { // twice: idempotent
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	for range 2 { // the second round is a redelivery
		for i, s := range stores {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.HandleSQL(ctx, tx, "evt-1", func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, deposit, fmt.Sprintf("acc-%d", i), 10)
				return err
			})
			if err != nil {
				tx.Rollback()
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if a, b := balance(t, pool, "acc-0"), balance(t, pool, "acc-1"); a != 10 || b != 10 {
		t.Fatalf("balances %d and %d, want 10 each: each consumer applies the event once", a, b)
	}
	if n := count(t, pool, `SELECT count(*) FROM "Billing"."Processed Events"`); n != 2 {
		t.Fatalf("%d ledger rows, want one per consumer", n)
	}
}

func TestMigrateIsSafeToRunConcurrently(t *testing.T) {
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { errs <- inbox.Migrate(ctx, pool) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM pg_indexes WHERE tablename = 'processed_events'"); n != 2 {
		t.Fatalf("%d indexes on processed_events, want the primary key and processed_at", n)
	}
}

func TestHandleRefusesAnEmptyEventID(t *testing.T) {
	_, pool := newDB(t)
	_, err := inbox.Process(context.Background(), pool, "", depositor("acc", 1))
	if !errors.Is(err, inbox.ErrNoEventID) {
		t.Fatalf("err = %v, want ErrNoEventID", err)
	}
}

func TestEventIDReadsTheIDHeader(t *testing.T) {
	msg := func(headers ...string) kafka.Message {
		m := kafka.Message{Topic: "outbox.event.order", Partition: 1, Offset: 7}
		for i := 0; i < len(headers); i += 2 {
			m.Headers = append(m.Headers, kafka.Header{Key: headers[i], Value: []byte(headers[i+1])})
		}
		return m
	}
	cases := []struct {
		name    string
		msg     kafka.Message
		want    string
		wantErr bool
	}{
		{"the relay's header", msg("event_type", "X", "id", "5f0c7c1e-7d1a-4c39-9a53-2b1f4c8e9d10"), "5f0c7c1e-7d1a-4c39-9a53-2b1f4c8e9d10", false},
		{"a JSON string from Kafka Connect's JsonConverter", msg("id", `"5f0c7c1e-7d1a-4c39-9a53-2b1f4c8e9d10"`), "5f0c7c1e-7d1a-4c39-9a53-2b1f4c8e9d10", false},
		{"the last of two id headers", msg("id", "a", "id", "b"), "b", false},
		{"no id header", msg("tenant", "acme"), "", true},
		{"an empty id header", msg("id", ""), "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := inbox.EventID(c.msg)
			if got != c.want || (err != nil) != c.wantErr {
				t.Fatalf("EventID = %q, %v; want %q, error %v", got, err, c.want, c.wantErr)
			}
		})
	}
}

func TestTransactionMarkerTellsKafkasMarkersFromEvents(t *testing.T) {
	cases := []struct {
		name string
		msg  kafka.Message
		want bool
	}{
		{"a commit marker as kafka-go returns it", kafka.Message{Key: []byte{0, 0, 0, 1}, Value: []byte{0, 0, 0, 0, 0, 3}}, true},
		{"an abort marker", kafka.Message{Key: []byte{0, 0, 0, 0}, Value: []byte{0, 0, 0, 0, 0, 0}}, true},
		{"an event with the id header", kafka.Message{Key: []byte("order-1"), Value: []byte(`{}`), Headers: []kafka.Header{{Key: "id", Value: []byte("e1")}}}, false},
		{"marker-shaped bytes with a header", kafka.Message{Key: []byte{0, 0, 0, 1}, Value: []byte{0, 0, 0, 0, 0, 0}, Headers: []kafka.Header{{Key: "id", Value: []byte("e1")}}}, false},
		{"an unknown control type", kafka.Message{Key: []byte{0, 0, 0, 7}, Value: []byte{0, 0, 0, 0, 0, 0}}, false},
		{"a record without headers and a longer value", kafka.Message{Key: []byte{0, 0, 0, 1}, Value: []byte(`{"a":1}`)}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := inbox.TransactionMarker(c.msg); got != c.want {
				t.Fatalf("TransactionMarker = %v, want %v", got, c.want)
			}
		})
	}
}
