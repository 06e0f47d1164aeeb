package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The test binary doubles as the crashing consumer: TestMain runs crashingConsumer instead of the
// tests when this variable is set.
const crashChildEnv = "INBOX_CRASH_CHILD"

// Where the child kills itself (SIGKILL, nothing runs after it), at the first event.
const (
	killBeforeEffect = "before-effect" // the database transaction committed, the charge not sent
	killAfterEffect  = "after-effect"  // the charge went through, its outcome not recorded
	killBeforeCommit = "before-commit" // everything done but the Kafka offset commit
)

// crashingConsumer is a consumer process: a kafka-go group reader, an inbox.Consumer whose
// handler journals the event and records a charge, the charge sent to the provider over HTTP. It
// kills itself at CRASH_POINT, or, without one, exits 0 once every event is applied and settled.
func crashingConsumer() int {
	ctx := context.Background()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 1 }
	point, providerURL := os.Getenv("CRASH_POINT"), os.Getenv("CRASH_PROVIDER")
	want, _ := strconv.Atoi(os.Getenv("CRASH_EVENTS"))
	kill := func(at string) {
		if point == at {
			fmt.Println("killing myself", at)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns
		}
	}
	pool, err := pgxpool.New(ctx, os.Getenv("CRASH_DSN"))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	store, err := inbox.New(inbox.Config{Consumer: "billing"})
	if err != nil {
		return fail(err)
	}
	charge := inbox.Effect{
		Perform: func(ctx context.Context, op inbox.Operation) (string, error) {
			kill(killBeforeEffect)
			resp, err := http.Post(providerURL+"/charges?key="+url.QueryEscape(op.Key), "application/json", strings.NewReader(string(op.Request)))
			if err != nil {
				return "", err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			kill(killAfterEffect)
			return string(body), nil
		},
		Reconcile: func(ctx context.Context, op inbox.Operation) (string, bool, error) {
			resp, err := http.Get(providerURL + "/charges?key=" + url.QueryEscape(op.Key))
			if err != nil {
				return "", false, err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fmt.Println("reconciled", op.EventID, resp.StatusCode)
			return string(body), resp.StatusCode == http.StatusOK, nil
		},
	}
	reg := inbox.NewRegistry().Handle("Deposited", 1, func(ctx context.Context, e *inbox.Event) error {
		if _, err := e.Tx.Exec(ctx, "INSERT INTO journal (consumer, aggregate_id, version, event_id, amount) VALUES ('billing', $1, $2, $3, $4)",
			e.AggregateID, e.Version, e.ID, len(e.Payload)); err != nil {
			return err
		}
		_, err := e.Intend(ctx, "charge", map[string]string{"account": e.AggregateID})
		return err
	})
	c := &inbox.Consumer{DB: pool, Store: store, Registry: reg, Effects: map[string]inbox.Effect{"charge": charge}}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: []string{os.Getenv("CRASH_BROKERS")}, GroupID: os.Getenv("CRASH_GROUP"), Topic: os.Getenv("CRASH_TOPIC"),
		StartOffset: kafka.FirstOffset, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond,
		HeartbeatInterval: 500 * time.Millisecond, SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second,
	})
	defer r.Close()
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return fail(err)
		}
		o, err := c.Handle(ctx, m)
		if err != nil {
			return fail(err)
		}
		fmt.Println("handled", string(m.Headers[0].Value), o)
		kill(killBeforeCommit)
		if err := r.CommitMessages(ctx, m); err != nil {
			return fail(err)
		}
		var applied, pending int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM journal), (SELECT count(*) FROM inbox_operations WHERE state = 'pending')`).Scan(&applied, &pending); err != nil {
			return fail(err)
		}
		if applied == want && pending == 0 {
			return 0
		}
	}
}

// chargeProvider is the payment provider: it charges every request it gets (so a second charge
// shows) and answers lookups by idempotency key.
type chargeProvider struct {
	mu      sync.Mutex
	charges map[string]int
}

func (p *chargeProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.Method {
	case http.MethodPost:
		p.charges[key]++
		fmt.Fprintf(w, "ch_%s", key[:8])
	case http.MethodGet:
		if p.charges[key] == 0 {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "ch_%s", key[:8])
	}
}

// A consumer process killed at each point around its external effect and its offset commit: the
// restarted consumer gets the first event again and neither charges it twice nor applies it twice.
func TestAConsumerKilledAroundItsEffectNeverRepeatsItAfterRedelivery(t *testing.T) {
	k := testenv.SharedKafka(t)
	for _, point := range []string{killBeforeEffect, killAfterEffect, killBeforeCommit} {
		t.Run("killed "+point, func(t *testing.T) {
			t.Parallel()
			pool := newVersionDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			dsn := pool.Config().ConnString()
			store, _ := inbox.New(inbox.Config{Consumer: "billing"})
			if err := store.Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			topic := testenv.UniqueName(t, "charges")
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			const events = 3
			w := &kafka.Writer{Addr: kafka.TCP(k.Brokers()), RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
			defer w.Close()
			for v := 1; v <= events; v++ {
				m := msg(fmt.Sprintf("e%d", v), "acc-1", int64(v), 0, `{"cents":100}`)
				m.Topic = topic
				if err := w.WriteMessages(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			prov := &chargeProvider{charges: map[string]int{}}
			srv := httptest.NewServer(prov)
			defer srv.Close()

			child := func(point string) (string, error) {
				cmd := exec.CommandContext(ctx, os.Args[0])
				cmd.Env = append(os.Environ(), crashChildEnv+"=1", "CRASH_POINT="+point, "CRASH_PROVIDER="+srv.URL,
					"CRASH_EVENTS="+strconv.Itoa(events), "CRASH_DSN="+dsn, "CRASH_BROKERS="+k.Brokers(),
					"CRASH_GROUP="+topic, "CRASH_TOPIC="+topic, "GORACE=atexit_sleep_ms=0")
				out, err := cmd.CombinedOutput()
				return string(out), err
			}
			out, err := child(point)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL || !strings.Contains(out, "killing myself "+point) {
				t.Fatalf("first consumer: %v, want it killed %s; output:\n%s", err, point, out)
			}
			start := time.Now()
			out, err = child("")
			if err != nil {
				t.Fatalf("second consumer: %v; output:\n%s", err, out)
			}
			t.Logf("the restarted consumer finished in %s:\n%s", time.Since(start).Round(time.Millisecond), out)
			if !strings.Contains(out, "handled e1 duplicate") {
				t.Errorf("the first event was not redelivered and seen as a duplicate")
			}
			if point == killAfterEffect && !strings.Contains(out, "reconciled e1 200") {
				t.Errorf("the pending charge of the first event was not reconciled with the provider")
			}
			for v := 1; v <= events; v++ {
				key := inbox.IdempotencyKey("billing", fmt.Sprintf("e%d", v), "charge")
				if n := prov.charges[key]; n != 1 {
					t.Errorf("event e%d charged %d times, want once", v, n)
				}
			}
			if n := count(t, pool, "SELECT count(DISTINCT event_id) FROM journal WHERE event_id IN ('e1','e2','e3')"); n != events || count(t, pool, "SELECT count(*) FROM journal") != events {
				t.Errorf("journal holds %d rows for %d events, want each once", count(t, pool, "SELECT count(*) FROM journal"), n)
			}
			if n := count(t, pool, "SELECT count(*) FROM inbox_operations WHERE state = 'done'"); n != events {
				t.Errorf("%d operations done, want %d", n, events)
			}
		})
	}
}
