package main_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// The proofs that aggregate versions, replay and redrive let a consumer trust what it receives:
// the relay binary publishes, a version-aware inbox.Consumer applies, and the failures the
// outbox pattern's literature asks about are made to happen.

// versioned is one test's outbox with an aggregate_version column, its topic, a producer that
// takes versions from a counter table, and a consumer that journals what it applies.
type versioned struct {
	t       *testing.T
	e       *e2e
	db      *testDB
	k       interface{ Brokers() string }
	env     []string
	args    []string // `run` and its flags
	aggType string
	topic   string
	dlq     string
	writer  *outbox.Writer
	cons    *inbox.Consumer
	next    map[int]int64 // per partition, the offset the consumer reads next
	// drop, when set, is the test double between Kafka and the consumer: records it returns true
	// for are never handed to the consumer.
	drop func(inbox.Delivery) bool
}

func newVersioned(t *testing.T, topicConfig ...kafka.ConfigEntry) *versioned {
	t.Helper()
	ctx := context.Background()
	pg, k := testenv.SharedPostgres(t), testenv.SharedKafka(t)
	v := &versioned{t: t, e: newE2E(t, pgPassword), db: newDatabase(t, pg), k: k, next: map[int]int64{}}
	slot := testenv.UniqueName(t, "slot")
	v.aggType = testenv.UniqueName(t, "acct")
	v.topic = harness.TopicFor(v.aggType)
	v.dlq = testenv.UniqueName(t, "dlq")
	v.env = relayEnv("OUTBOX_PG_DSN="+v.db.dsn, "OUTBOX_KAFKA_BROKERS="+k.Brokers(), "OUTBOX_COLUMNS_AGGREGATE_VERSION=aggregate_version",
		"OUTBOX_DEAD_LETTER_TOPIC="+v.dlq)
	v.args = []string{"run", "--slot=" + slot, "--publication=" + slot, "--shutdown-timeout=" + shutdownTimeout.String()}
	v.e.mustRun("migrate", v.env, "migrate", "--publication="+slot)
	v.db.exec(t, "ALTER TABLE outbox_events ADD COLUMN aggregate_version bigint")
	v.db.exec(t, `CREATE TABLE journal (n bigserial PRIMARY KEY, aggregate_id text, version bigint, event_id text, replayed bool)`)

	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 30 * time.Second}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: v.topic, NumPartitions: 2, ReplicationFactor: 1, ConfigEntries: topicConfig},
		{Topic: v.dlq, NumPartitions: 1, ReplicationFactor: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for topic, err := range resp.Errors {
		if err != nil {
			t.Fatalf("create topic %s: %v", topic, err)
		}
	}

	cols := outbox.DefaultColumns
	cols.AggregateVersion = "aggregate_version"
	if v.writer, err = outbox.New(outbox.Config{Columns: cols, VersionTable: "aggregate_versions"}); err != nil {
		t.Fatal(err)
	}
	if err := v.writer.CreateVersionTable(ctx, v.db.pool); err != nil {
		t.Fatal(err)
	}
	store, err := inbox.New(inbox.Config{Consumer: "journal"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, v.db.pool); err != nil {
		t.Fatal(err)
	}
	reg := inbox.NewRegistry().Handle("Changed", 1, func(ctx context.Context, e *inbox.Event) error {
		_, err := e.Tx.Exec(ctx, "INSERT INTO journal (aggregate_id, version, event_id, replayed) VALUES ($1, $2, $3, $4)",
			e.AggregateID, e.Version, e.ID, e.Replay)
		return err
	})
	v.cons = &inbox.Consumer{DB: v.db.pool, Store: store, Registry: reg}
	return v
}

// write commits one transaction per aggregate id given, each with one event.
func (v *versioned) write(aggregateIDs ...string) {
	v.t.Helper()
	for _, id := range aggregateIDs {
		err := pgx.BeginFunc(context.Background(), v.db.pool, func(tx pgx.Tx) error {
			_, err := v.writer.Write(context.Background(), tx, outbox.Event{AggregateType: v.aggType, AggregateID: id,
				EventType: "Changed", Payload: map[string]string{"id": id}, Headers: map[string]string{"tenant": "acme"}})
			return err
		})
		if err != nil {
			v.t.Fatal(err)
		}
	}
}

// records waits until topic holds at least n records and returns them, in offset order per
// partition.
func (v *versioned) records(topic string, n int) []harness.Record {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deliverTimeout)
	defer cancel()
	for {
		recs, err := harness.Reread(ctx, v.k.Brokers(), topic)
		if err == nil && len(recs) >= n {
			sort.Slice(recs, func(i, j int) bool {
				return recs[i].Partition < recs[j].Partition || recs[i].Partition == recs[j].Partition && recs[i].Offset < recs[j].Offset
			})
			return recs
		}
		if ctx.Err() != nil {
			v.t.Fatalf("%s holds %d records after %s, want %d (last error: %v)", topic, len(recs), deliverTimeout, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// consume hands the consumer every record of the topic it has not read yet, once the topic holds
// n records in all, and returns the outcomes as "aggregate/version:outcome" in the order handled.
func (v *versioned) consume(n int) []string {
	v.t.Helper()
	var out []string
	for _, r := range v.records(v.topic, n) {
		if r.Offset < v.next[r.Partition] {
			continue
		}
		v.next[r.Partition] = r.Offset + 1
		m := kafka.Message{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value}
		for k, val := range r.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: k, Value: []byte(val)})
		}
		d, err := inbox.ParseDelivery(m)
		if err != nil {
			v.t.Fatal(err)
		}
		if v.drop != nil && v.drop(d) {
			continue
		}
		o, err := v.cons.HandleDelivery(context.Background(), d)
		if err != nil && !errors.Is(err, inbox.ErrGap) {
			v.t.Fatalf("%s/%d: %v", d.AggregateID, d.Version, err)
		}
		out = append(out, fmt.Sprintf("%s/%d:%s", d.AggregateID, d.Version, o))
	}
	return out
}

// journal returns one aggregate's applied versions in the order they were applied.
func (v *versioned) journal(aggregateID string) []int64 {
	v.t.Helper()
	rows, err := v.db.pool.Query(context.Background(), "SELECT version FROM journal WHERE aggregate_id = $1 ORDER BY n", aggregateID)
	if err != nil {
		v.t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		v.t.Fatal(err)
	}
	return got
}

func upTo(n int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i + 1)
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// A relay killed after Kafka acknowledged its events but before the slot was confirmed past them
// publishes them again from the slot after its restart. The consumer already applied them: each
// comes again, is classified duplicate, and nothing is applied twice.
func TestRelayKilledAfterKafkaAckedBeforeTheSlotWasConfirmedGivesDuplicatesTheConsumerAppliesOnce(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	// A long status interval holds confirmation back (it trails the publication checks, which run
	// every half interval): the events are acknowledged by Kafka and the slot stays before them.
	relay := v.e.relay("relay #1", v.env, append(v.args, "--status-interval=10m")...)
	slot := v.args[1][len("--slot="):]
	waitSlotActive(t, v.db.pool, slot, relay)
	ctx := context.Background()
	before, err := harness.CurrentLSN(ctx, v.db.pool)
	if err != nil {
		t.Fatal(err)
	}
	v.write("a", "b", "a", "a", "b")
	first := v.consume(5)
	if got, want := sorted(first), []string{"a/1:new", "a/2:new", "a/3:new", "b/1:new", "b/2:new"}; !slices.Equal(got, want) {
		t.Fatalf("first delivery: %v, want %v", got, want)
	}
	relay.signal(t, syscall.SIGKILL) // no final status update
	if _, ok := relay.wait(10 * time.Second); !ok {
		t.Fatal("relay #1 did not die")
	}
	// The premise: Kafka has every event, the slot none of them.
	confirmed, err := harness.ConfirmedFlushLSN(ctx, v.db.pool, slot)
	if err != nil {
		t.Fatal(err)
	}
	if confirmed > before {
		t.Fatalf("the slot was confirmed at %X, past %X where the events start: the kill came too late to prove anything", confirmed, before)
	}

	relay = v.e.relay("relay #2", v.env, append(v.args, "--status-interval=200ms")...)
	waitSlotActive(t, v.db.pool, slot, relay)
	again := v.consume(10)
	if got, want := sorted(again), []string{"a/1:duplicate", "a/2:duplicate", "a/3:duplicate", "b/1:duplicate", "b/2:duplicate"}; !slices.Equal(got, want) {
		t.Fatalf("after the restart: %v, want every event again, each a duplicate (is the slot confirmed too early?)", got)
	}
	for id, n := range map[string]int64{"a": 3, "b": 2} {
		if got := v.journal(id); !slices.Equal(got, upTo(n)) {
			t.Errorf("journal of %s = %v, want %v: each version applied once, in order", id, got, upTo(n))
		}
	}
	stopRelay(t, relay)
}

// An event lost between the relay and the consumer (a test double drops it) shows as a gap at the
// next version of its aggregate; the consumer asks for a replay, `outbox-relay replay` publishes
// the missing version and the ones after it, and they are applied in order. A week-old event
// replayed much later is a duplicate and changes nothing.
func TestALostEventIsAGapThatTheReplayFillsInOrderAndAWeekOldReplayIsADuplicate(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	var requests []string
	v.cons.OnGap = inbox.ReplayOnGap(func(_ context.Context, _ pgx.Tx, g inbox.GapInfo) error {
		requests = append(requests, g.ReplayCommand())
		return nil
	})
	relay := v.e.relay("relay", v.env, append(v.args, "--status-interval=200ms")...)
	waitSlotActive(t, v.db.pool, v.args[1][len("--slot="):], relay)
	defer stopRelay(t, relay)
	v.write("a", "a", "b", "a", "a", "a", "b")

	t.Run("the dropped event is reported as a gap at the next version", func(t *testing.T) {
		v.drop = func(d inbox.Delivery) bool { return d.AggregateID == "a" && d.Version == 3 }
		got := v.consume(7)
		v.drop = nil
		want := []string{"a/1:new", "a/2:new", "a/4:gap", "a/5:gap", "b/1:new", "b/2:new"}
		if !slices.Equal(sorted(got), want) {
			t.Fatalf("outcomes %v, want %v", sorted(got), want)
		}
		if len(requests) == 0 || !strings.HasSuffix(requests[0], fmt.Sprintf(`--aggregate-type %q --aggregate-id "a" --from-version 3`, v.aggType)) {
			t.Fatalf("replay requests %q, want one from version 3", requests)
		}
	})
	t.Run("the replay publishes versions 3 and on, and the consumer applies them in order", func(t *testing.T) {
		p := v.e.mustRun("replay", v.env, "replay", "--aggregate-type="+v.aggType, "--aggregate-id=a", "--from-version=3")
		if out := p.stdout.String(); !strings.Contains(out, "replayed 3 events") || !strings.Contains(out, "3 acknowledged by Kafka, 0 dead-lettered") {
			t.Fatalf("replay said %q", out)
		}
		got := v.consume(10)
		if want := []string{"a/3:new", "a/4:new", "a/5:new"}; !slices.Equal(got, want) {
			t.Fatalf("outcomes %v, want %v", got, want)
		}
		if got := v.journal("a"); !slices.Equal(got, upTo(5)) {
			t.Fatalf("journal of a = %v, want 1..5: nothing applied out of order", got)
		}
		var replayed int
		if err := v.db.pool.QueryRow(context.Background(), "SELECT count(*) FROM journal WHERE replayed").Scan(&replayed); err != nil || replayed != 3 {
			t.Fatalf("%d journal rows from replayed records (%v), want 3 (outbox.replay=true)", replayed, err)
		}
	})
	t.Run("a replay without one clear selection is a usage error, before anything is contacted", func(t *testing.T) {
		for _, args := range [][]string{
			{},
			{"--event-id=x", "--since=1h"},
			{"--aggregate-type=" + v.aggType},
			{"--aggregate-type=" + v.aggType, "--aggregate-id=a", "--from-version=5", "--to-version=2"},
		} {
			p := v.e.relay("bad replay", relayEnv("OUTBOX_PG_DSN=postgres://nobody@127.0.0.1:1/x", "OUTBOX_KAFKA_BROKERS=127.0.0.1:1"),
				append([]string{"replay"}, args...)...)
			if code, ok := p.wait(time.Minute); !ok || code != 2 || !strings.Contains(p.stderr.String(), "outbox-relay replay: ") {
				t.Fatalf("replay %v: exit status %d (exited %v), want 2 with the reason; stderr:\n%s", args, code, ok, p.stderr.String())
			}
		}
	})
	t.Run("a week-old event replayed later is a duplicate and changes nothing", func(t *testing.T) {
		v.db.exec(t, "UPDATE outbox_events SET created_at = now() - interval '7 days' WHERE aggregate_id = 'b' AND aggregate_version = 1")
		p := v.e.mustRun("replay", v.env, "replay", "--since=192h", "--until=144h")
		if out := p.stdout.String(); !strings.Contains(out, "replayed 1 events") {
			t.Fatalf("replay said %q", out)
		}
		if got := v.consume(11); !slices.Equal(got, []string{"b/1:duplicate"}) {
			t.Fatalf("outcomes %v, want b/1 a duplicate", got)
		}
		if got := v.journal("b"); !slices.Equal(got, upTo(2)) {
			t.Fatalf("journal of b = %v, want 1..2", got)
		}
	})
}

// A topic whose size limit is too small for some events: the relay dead-letters them. Once the
// limit is raised, `outbox-relay redrive` sends them to the original topic, with their key, id and
// headers; a second run sends nothing.
func TestRedriveAfterFixingATooSmallTopicLimitDeliversTheDeadLettersOnce(t *testing.T) {
	t.Parallel()
	v := newVersioned(t, kafka.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: "2048"})
	relay := v.e.relay("relay", v.env, append(v.args, "--status-interval=200ms")...)
	waitSlotActive(t, v.db.pool, v.args[1][len("--slot="):], relay)
	defer stopRelay(t, relay)
	v.write("a")
	// Version 2 is larger than the topic allows.
	err := pgx.BeginFunc(context.Background(), v.db.pool, func(tx pgx.Tx) error {
		_, err := v.writer.Write(context.Background(), tx, outbox.Event{AggregateType: v.aggType, AggregateID: "a", EventType: "Changed",
			Payload: map[string]string{"blob": strings.Repeat("x", 4096)}, Headers: map[string]string{"tenant": "acme"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	v.write("a")
	dead := v.records(v.dlq, 1)
	if len(dead) != 1 || dead[0].Header("aggregate_version") != "2" || dead[0].Header("outbox.dlq.reason") != "message_too_large" {
		t.Fatalf("dead letters %v, want version 2, too large", dead)
	}
	v.records(v.topic, 2)

	// Before the fix: the dead letter still fails, is reported, and stays to be tried again.
	p := v.e.relay("redrive before the fix", v.env, "redrive")
	if code, ok := p.wait(time.Minute); !ok || code != 3 {
		t.Fatalf("redrive before the fix: exit status %d (exited %v), want 3; stderr:\n%s", code, ok, lastLines(p.stderr.String(), 10))
	}
	if out := p.stdout.String(); !strings.Contains(out, "0 redriven to their original topics, 0 redriven by an earlier run, 1 still failing") ||
		!strings.Contains(out, "still failing: 0@0 event "+dead[0].Header("id")) || !strings.Contains(strings.ToLower(out), "too large") {
		t.Fatalf("redrive before the fix said %q", out)
	}

	client := &kafka.Client{Addr: kafka.TCP(v.k.Brokers()), Timeout: 30 * time.Second}
	resp, err := client.AlterConfigs(context.Background(), &kafka.AlterConfigsRequest{Resources: []kafka.AlterConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: v.topic,
		Configs: []kafka.AlterConfigRequestConfig{{Name: "max.message.bytes", Value: strconv.Itoa(1 << 20)}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for r, err := range resp.Errors {
		if err != nil {
			t.Fatalf("alter %s: %v", r.Name, err)
		}
	}

	for run, want := range []string{"1 redriven to their original topics, 0 redriven by an earlier run, 0 still failing",
		"0 redriven to their original topics, 1 redriven by an earlier run, 0 still failing"} {
		p := v.e.mustRun(fmt.Sprintf("redrive #%d", run+1), v.env, "redrive")
		if out := p.stdout.String(); !strings.Contains(out, want) {
			t.Fatalf("redrive #%d said %q, want %q", run+1, out, want)
		}
	}
	recs := v.records(v.topic, 3)
	var back []harness.Record
	for _, r := range recs {
		if r.Header("id") == dead[0].Header("id") {
			back = append(back, r)
		}
	}
	if len(back) != 1 {
		t.Fatalf("the dead letter is %d times on %s, want once", len(back), v.topic)
	}
	r := back[0]
	if string(r.Key) != "a" || r.Header("tenant") != "acme" || r.Header("aggregate_version") != "2" || r.Header("outbox.redrive") != "true" ||
		string(r.Value) != string(dead[0].Value) || r.Header("outbox.dlq.reason") != "" {
		t.Fatalf("redriven record: key %q, headers %v; want the original key, id and headers, marked outbox.redrive", r.Key, r.Headers)
	}
	if len(recs) != 3 {
		t.Fatalf("%s holds %d records, want 3", v.topic, len(recs))
	}
}
