package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
)

// msg is a record as the relay publishes it: id, event type, aggregate type and version headers,
// the aggregate id as key. version 0 leaves the version header out; schema 0 the schema header.
func msg(id, aggregateID string, version int64, schema int, value string) kafka.Message {
	m := kafka.Message{Topic: "outbox.event.account", Key: []byte(aggregateID), Value: []byte(value), Headers: []kafka.Header{
		{Key: "id", Value: []byte(id)},
		{Key: "event_type", Value: []byte("Deposited")},
		{Key: "aggregate_type", Value: []byte("account")},
	}}
	if version > 0 {
		m.Headers = append(m.Headers, kafka.Header{Key: "aggregate_version", Value: []byte(strconv.FormatInt(version, 10))})
	}
	if schema > 0 {
		m.Headers = append(m.Headers, kafka.Header{Key: "schema_version", Value: []byte(strconv.Itoa(schema))})
	}
	return m
}

// journal is the business table of these tests: every applied event appends a row, so an event
// applied twice or out of order shows.
const journalDDL = `CREATE TABLE journal (n bigserial PRIMARY KEY, consumer text, aggregate_id text, version bigint, event_id text, amount bigint)`

// journaling is a registry whose Deposited v1 handler appends to the journal; amount is the payload.
func journaling(consumer string) *inbox.Registry {
	return inbox.NewRegistry().Handle("Deposited", 1, func(ctx context.Context, e *inbox.Event) error {
		amount, err := strconv.Atoi(string(e.Payload))
		if err != nil {
			return err
		}
		_, err = e.Tx.Exec(ctx, "INSERT INTO journal (consumer, aggregate_id, version, event_id, amount) VALUES ($1, $2, $3, $4, $5)",
			consumer, e.AggregateID, e.Version, e.ID, amount)
		return err
	})
}

func newVersionDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	_, pool := newDB(t)
	if _, err := pool.Exec(context.Background(), journalDDL); err != nil {
		t.Fatal(err)
	}
	return pool
}

func newConsumer(t *testing.T, pool *pgxpool.Pool, name string) *inbox.Consumer {
	t.Helper()
	store, err := inbox.New(inbox.Config{Consumer: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return &inbox.Consumer{DB: pool, Store: store, Registry: journaling(name)}
}

// journalOf returns "version:event" of one aggregate's journal rows in the order they were applied.
func journalOf(t *testing.T, pool *pgxpool.Pool, aggregateID string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT version || ':' || event_id FROM journal WHERE aggregate_id = $1 ORDER BY n", aggregateID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDeliveriesAreClassifiedByAggregateVersionAgainstWhatWasApplied(t *testing.T) {
	type step struct {
		m       kafka.Message
		want    inbox.Outcome
		wantErr error
	}
	cases := []struct {
		name    string
		steps   []step
		journal []string
	}{
		{"the next versions are applied, a redelivery is a duplicate", []step{
			{msg("e1", "a", 1, 0, "10"), inbox.Applied, nil},
			{msg("e2", "a", 2, 0, "20"), inbox.Applied, nil},
			{msg("e2", "a", 2, 0, "20"), inbox.Duplicate, nil},
			{msg("e1", "a", 1, 0, "10"), inbox.Duplicate, nil},
		}, []string{"1:e1", "2:e2"}},
		{"a version after a missing one waits, and is applied once the missing one came", []step{
			{msg("e1", "a", 1, 0, "10"), inbox.Applied, nil},
			{msg("e3", "a", 3, 0, "30"), inbox.Gap, inbox.ErrGap},
			{msg("e2", "a", 2, 0, "20"), inbox.Applied, nil},
			{msg("e3", "a", 3, 0, "30"), inbox.Applied, nil},
		}, []string{"1:e1", "2:e2", "3:e3"}},
		{"a first event that is not version 1 is a gap: the consumer did not see the aggregate's start", []step{
			{msg("e5", "a", 5, 0, "50"), inbox.Gap, inbox.ErrGap},
		}, nil},
		{"an older version with another id is stale, not applied", []step{
			{msg("e1", "a", 1, 0, "10"), inbox.Applied, nil},
			{msg("e2", "a", 2, 0, "20"), inbox.Applied, nil},
			{msg("other", "a", 1, 0, "99"), inbox.Stale, nil},
		}, []string{"1:e1", "2:e2"}},
		{"events without a version are told apart by id only", []step{
			{msg("u1", "a", 0, 0, "1"), inbox.Applied, nil},
			{msg("u1", "a", 0, 0, "1"), inbox.Duplicate, nil},
			{msg("u2", "a", 0, 0, "2"), inbox.Applied, nil},
		}, []string{"0:u1", "0:u2"}},
		{"an event applied by id before versions were tracked moves the version on", []step{
			{msg("e1", "a", 0, 0, "10"), inbox.Applied, nil},
			{msg("e1", "a", 1, 0, "10"), inbox.Duplicate, nil},
			{msg("e2", "a", 2, 0, "20"), inbox.Applied, nil},
		}, []string{"0:e1", "2:e2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := newVersionDB(t)
			cons := newConsumer(t, pool, "c")
			for i, s := range c.steps {
				got, err := cons.Handle(context.Background(), s.m)
				if !errors.Is(err, s.wantErr) || (s.wantErr == nil && err != nil) || got != s.want {
					t.Fatalf("step %d: Handle = %v, %v; want %v, %v", i, got, err, s.want, s.wantErr)
				}
			}
			if got := journalOf(t, pool, "a"); !slices.Equal(got, c.journal) {
				t.Fatalf("journal = %v, want %v", got, c.journal)
			}
		})
	}
}

func TestAGapErrorSaysWhatIsMissingAndHowToAskForIt(t *testing.T) {
	pool := newVersionDB(t)
	cons := newConsumer(t, pool, "c")
	ctx := context.Background()
	if _, err := cons.Handle(ctx, msg("e1", "a", 1, 0, "1")); err != nil {
		t.Fatal(err)
	}
	_, err := cons.Handle(ctx, msg("e4", "a", 4, 0, "4"))
	for _, want := range []string{"version 4", "versions 2..3 are missing", "must not be committed",
		`outbox-relay replay --aggregate-type "account" --aggregate-id "a" --from-version 2`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v does not say %q", err, want)
		}
	}
	if cons.Count(inbox.Gap) != 1 || cons.Count(inbox.Applied) != 1 {
		t.Fatalf("counts: gap %d, applied %d; want 1 and 1", cons.Count(inbox.Gap), cons.Count(inbox.Applied))
	}
}

func TestGapPoliciesReloadTheStateOrSkipForAReplay(t *testing.T) {
	t.Run("reload: the state is loaded up to a version, the event after it applies and older ones are stale", func(t *testing.T) {
		pool := newVersionDB(t)
		cons := newConsumer(t, pool, "c")
		cons.OnGap = inbox.ReloadOnGap(func(ctx context.Context, tx pgx.Tx, g inbox.GapInfo) (int64, error) {
			_, err := tx.Exec(ctx, "INSERT INTO journal (consumer, aggregate_id, version, event_id, amount) VALUES ('c', $1, 4, 'reload', 0)", g.AggregateID)
			return 4, err
		})
		ctx := context.Background()
		for _, s := range []struct {
			m    kafka.Message
			want inbox.Outcome
		}{
			{msg("e1", "a", 1, 0, "1"), inbox.Applied},
			{msg("e5", "a", 5, 0, "5"), inbox.Applied}, // reloaded to 4, then 5 is next
			{msg("e3", "a", 3, 0, "3"), inbox.Stale},   // the reload covered it
		} {
			if got, err := cons.Handle(ctx, s.m); err != nil || got != s.want {
				t.Fatalf("%s: Handle = %v, %v; want %v", s.m.Headers[0].Value, got, err, s.want)
			}
		}
		if got, want := journalOf(t, pool, "a"), []string{"1:e1", "4:reload", "5:e5"}; !slices.Equal(got, want) {
			t.Fatalf("journal = %v, want %v", got, want)
		}
	})
	t.Run("replay: the request is recorded, the event skipped unrecorded, and applied when the replay brings it again", func(t *testing.T) {
		pool := newVersionDB(t)
		if _, err := pool.Exec(context.Background(), "CREATE TABLE replay_requests (command text)"); err != nil {
			t.Fatal(err)
		}
		cons := newConsumer(t, pool, "c")
		cons.OnGap = inbox.ReplayOnGap(func(ctx context.Context, tx pgx.Tx, g inbox.GapInfo) error {
			_, err := tx.Exec(ctx, "INSERT INTO replay_requests VALUES ($1)", g.ReplayCommand())
			return err
		})
		ctx := context.Background()
		for _, s := range []struct {
			m    kafka.Message
			want inbox.Outcome
		}{
			{msg("e1", "a", 1, 0, "1"), inbox.Applied},
			{msg("e3", "a", 3, 0, "3"), inbox.Gap}, // e2 was lost
			// The replay from version 2: everything from there, in order.
			{msg("e2", "a", 2, 0, "2"), inbox.Applied},
			{msg("e3", "a", 3, 0, "3"), inbox.Applied},
		} {
			if got, err := cons.Handle(ctx, s.m); err != nil || got != s.want {
				t.Fatalf("Handle = %v, %v; want %v", got, err, s.want)
			}
		}
		if got, want := journalOf(t, pool, "a"), []string{"1:e1", "2:e2", "3:e3"}; !slices.Equal(got, want) {
			t.Fatalf("journal = %v, want %v", got, want)
		}
		if n := count(t, pool, "SELECT count(*) FROM replay_requests WHERE command LIKE '%--from-version 2'"); n != 1 {
			t.Fatalf("%d replay requests from version 2, want 1", n)
		}
	})
}

// Two consumer instances get every delivery of one aggregate, each in order but at their own pace
// (a rebalance in which both own the partition for a while, taken to the extreme). Each version
// must be applied exactly once and in order; a consumer that gets ahead waits (WaitOnGap) and
// retries.
func TestTwoConsumersRacingOnOneAggregateApplyEachVersionOnceInOrder(t *testing.T) {
	pool := newVersionDB(t)
	store, err := inbox.New(inbox.Config{Consumer: "race"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	const versions = 40
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	// Both start each version together, so they collide on every one: one applies it while the
	// other waits for its row lock (or, ahead of it, finds a gap).
	barrier := make([]sync.WaitGroup, versions+1)
	for i := range barrier {
		barrier[i].Add(2)
	}
	outcomes := make([]map[inbox.Outcome]int, 2)
	errs := make(chan error, 2)
	for c := range 2 {
		outcomes[c] = map[inbox.Outcome]int{}
		cons := &inbox.Consumer{DB: pool, Store: store, Registry: journaling("race")}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := int64(1); v <= versions; v++ {
				m := msg(fmt.Sprintf("e%d", v), "a", v, 0, strconv.FormatInt(v, 10))
				barrier[v].Done()
				barrier[v].Wait()
				for {
					o, err := cons.Handle(ctx, m)
					if errors.Is(err, inbox.ErrGap) {
						time.Sleep(time.Millisecond) // the other consumer is applying the version before
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					outcomes[c][o]++
					break
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := make([]string, versions)
	for i := range want {
		want[i] = fmt.Sprintf("%d:e%d", i+1, i+1)
	}
	if got := journalOf(t, pool, "a"); !slices.Equal(got, want) {
		t.Fatalf("journal = %v, want each version once in order", got)
	}
	if a, d := outcomes[0][inbox.Applied]+outcomes[1][inbox.Applied], outcomes[0][inbox.Duplicate]+outcomes[1][inbox.Duplicate]; a != versions || d != versions {
		t.Fatalf("applied %d, duplicates %d (consumer 0 %v, 1 %v); want %d each", a, d, outcomes[0], outcomes[1], versions)
	}
	t.Logf("consumer 0: %v; consumer 1: %v", outcomes[0], outcomes[1])
	if outcomes[0][inbox.Applied] == 0 || outcomes[1][inbox.Applied] == 0 {
		t.Fatalf("one consumer applied everything (%v, %v): the race was not run", outcomes[0], outcomes[1])
	}
}

func TestSchemaVersionsGoThroughUpcastersAndAnUnknownOneIsAnErrorThatAppliesNothing(t *testing.T) {
	pool := newVersionDB(t)
	store, err := inbox.New(inbox.Config{Consumer: "schemas"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	// Version 3 is the handler's: {"cents": n}. Version 1 was a bare number of euros, version 2
	// {"euros": n}.
	reg := inbox.NewRegistry().
		Handle("Deposited", 3, func(ctx context.Context, e *inbox.Event) error {
			var cents int
			if _, err := fmt.Sscanf(string(e.Payload), `{"cents":%d}`, &cents); err != nil {
				return fmt.Errorf("payload %s: %w", e.Payload, err)
			}
			_, err := e.Tx.Exec(ctx, "INSERT INTO journal (consumer, aggregate_id, version, event_id, amount) VALUES ('s', $1, $2, $3, $4)",
				e.AggregateID, e.SchemaVersion, e.ID, cents)
			return err
		}).
		Upcast("Deposited", 1, func(p []byte) ([]byte, error) { return []byte(`{"euros":` + string(p) + `}`), nil }).
		Upcast("Deposited", 2, func(p []byte) ([]byte, error) {
			var euros int
			if _, err := fmt.Sscanf(string(p), `{"euros":%d}`, &euros); err != nil {
				return nil, err
			}
			return []byte(fmt.Sprintf(`{"cents":%d}`, euros*100)), nil
		})
	cons := &inbox.Consumer{DB: pool, Store: store, Registry: reg}
	ctx := context.Background()
	for _, m := range []kafka.Message{
		msg("no-header", "a", 1, 0, "1"), // no schema_version header: version 1
		msg("v2", "a", 2, 2, `{"euros":2}`),
		msg("v3", "a", 3, 3, `{"cents":300}`),
	} {
		if o, err := cons.Handle(ctx, m); err != nil || o != inbox.Applied {
			t.Fatalf("Handle = %v, %v", o, err)
		}
	}
	var amounts string
	if err := pool.QueryRow(ctx, "SELECT string_agg(amount::text || '@v' || version, ' ' ORDER BY n) FROM journal").Scan(&amounts); err != nil {
		t.Fatal(err)
	}
	if amounts != "100@v3 200@v3 300@v3" {
		t.Fatalf("journal = %q, want every payload upcast to version 3's cents", amounts)
	}

	// Version 4: nobody handles it. Nothing is recorded, so after a deploy that knows it, the
	// redelivery applies it.
	_, err = cons.Handle(ctx, msg("v4", "a", 4, 4, `{"cents":1,"currency":"EUR"}`))
	for _, want := range []string{`"Deposited"`, "schema version 4", "handles versions [3] and upcasts from [1, 2]", "offset must not be committed"} {
		if !errors.Is(err, inbox.ErrUnhandled) || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v: want ErrUnhandled saying %q", err, want)
		}
	}
	if v, err := store.AppliedVersion(ctx, pool, "account", "a"); err != nil || v != 3 {
		t.Fatalf("applied version = %d, %v; want 3 (nothing of the unhandled event committed)", v, err)
	}
	if n := count(t, pool, "SELECT count(*) FROM processed_events WHERE event_id = 'v4'"); n != 0 {
		t.Fatal("the unhandled event's id was recorded")
	}
}

// provider is a payment provider that honours nothing by itself: it counts every call, so a
// second charge shows. Reconcile asks it by idempotency key.
type provider struct {
	mu      sync.Mutex
	charges map[string]int // by idempotency key
	// failAfter makes the next Perform charge and then fail, as a consumer that dies before
	// recording the outcome would; failBefore makes it fail without charging.
	failAfter, failBefore bool
}

func (p *provider) effect() inbox.Effect {
	return inbox.Effect{
		Perform: func(ctx context.Context, op inbox.Operation) (string, error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.failBefore {
				p.failBefore = false
				return "", errors.New("connection reset before the request was sent")
			}
			p.charges[op.Key]++
			if p.failAfter {
				p.failAfter = false
				return "", errors.New("connection reset after the request was sent")
			}
			return "charge-" + op.Key[:8], nil
		},
		Reconcile: func(ctx context.Context, op inbox.Operation) (string, bool, error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.charges[op.Key] > 0 {
				return "charge-" + op.Key[:8], true, nil
			}
			return "", false, nil
		},
	}
}

func TestAnEffectIsPerformedOnceAcrossFailuresAroundIt(t *testing.T) {
	cases := []struct {
		name                  string
		failBefore, failAfter bool
		// how the failed Handle is followed up: a redelivery, or ResumePending at a restart
		resume bool
	}{
		{"no failure", false, false, false},
		{"the effect fails before reaching the provider: the redelivery performs it", true, false, false},
		{"the effect happens but its outcome is not recorded: the redelivery reconciles, no second charge", false, true, false},
		{"the effect happens but its outcome is not recorded: a restart reconciles, no second charge", false, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := newVersionDB(t)
			prov := &provider{charges: map[string]int{}, failBefore: c.failBefore, failAfter: c.failAfter}
			store, err := inbox.New(inbox.Config{Consumer: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := store.Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			reg := inbox.NewRegistry().Handle("Deposited", 1, func(ctx context.Context, e *inbox.Event) error {
				if _, err := e.Tx.Exec(ctx, "INSERT INTO journal (consumer, aggregate_id, version, event_id, amount) VALUES ('billing', $1, $2, $3, 1)",
					e.AggregateID, e.Version, e.ID); err != nil {
					return err
				}
				_, err := e.Intend(ctx, "charge", map[string]any{"account": e.AggregateID, "amount": string(e.Payload)})
				return err
			})
			cons := &inbox.Consumer{DB: pool, Store: store, Registry: reg, Effects: map[string]inbox.Effect{"charge": prov.effect()}}
			m := msg("e1", "a", 1, 0, "10")
			o, err := cons.Handle(ctx, m)
			failed := c.failBefore || c.failAfter
			if (err != nil) != failed || o != inbox.Applied {
				t.Fatalf("first Handle = %v, %v; want applied, failed %v", o, err, failed)
			}
			if failed {
				if c.resume {
					// A new process: the message is not redelivered (say its offset was committed).
					cons = &inbox.Consumer{DB: pool, Store: store, Registry: reg, Effects: map[string]inbox.Effect{"charge": prov.effect()}}
					if n, err := cons.ResumePending(ctx); err != nil || n != 1 {
						t.Fatalf("ResumePending = %d, %v; want 1 settled", n, err)
					}
				} else if o, err := cons.Handle(ctx, m); err != nil || o != inbox.Duplicate {
					t.Fatalf("redelivery: Handle = %v, %v; want duplicate", o, err)
				}
			}
			key := inbox.IdempotencyKey("billing", "e1", "charge")
			if prov.charges[key] != 1 || len(prov.charges) != 1 {
				t.Fatalf("charges = %v, want one, under key %s", prov.charges, key)
			}
			var state, outcome string
			if err := pool.QueryRow(ctx, "SELECT state, outcome FROM inbox_operations WHERE idempotency_key = $1", key).Scan(&state, &outcome); err != nil {
				t.Fatal(err)
			}
			if state != "done" || outcome != "charge-"+key[:8] {
				t.Fatalf("operation state %q, outcome %q; want done with the provider's outcome", state, outcome)
			}
			if got := journalOf(t, pool, "a"); !slices.Equal(got, []string{"1:e1"}) {
				t.Fatalf("journal = %v, want the database change once", got)
			}
			// Later redeliveries find nothing pending and charge nothing.
			if o, err := cons.Handle(ctx, m); err != nil || o != inbox.Duplicate || prov.charges[key] != 1 {
				t.Fatalf("late redelivery: %v, %v, charges %v", o, err, prov.charges)
			}
		})
	}
}
