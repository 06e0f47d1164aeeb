package main

// `outbox-relay replay` where it meets the router's placements and exactly-once delivery: the
// command builds its sink from the relay's configuration, so everything that configuration turns
// on reaches the replay too.

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replay"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// replayFixture is an outbox table with one row, with a header column, an envelope column and a
// partition column, and its topic.
type replayFixture struct {
	dsn, brokers, aggType, topic, id string
}

func newReplayFixture(t *testing.T, ctx context.Context, partitions int) replayFixture {
	t.Helper()
	k := testenv.SharedKafka(t)
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER TABLE outbox_events ADD COLUMN tenant text, ADD COLUMN region text, ADD COLUMN part int"); err != nil {
		t.Fatal(err)
	}
	aggType := testenv.UniqueName(t, "order")
	f := replayFixture{dsn: dsn, brokers: k.Brokers(), aggType: aggType, topic: harness.TopicFor(aggType)}
	if err := k.CreateTopic(ctx, f.topic, partitions); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tenant, region, part)
		VALUES ($1, 'o-1', 'OrderPlaced', '{"n":1}', 'acme', 'eu', $2) RETURNING id::text`, aggType, partitions-1).Scan(&f.id); err != nil {
		t.Fatal(err)
	}
	return f
}

// connect opens a connection to the fixture's database for the test's own statements.
func (f replayFixture) connect(t *testing.T, ctx context.Context) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func (f replayFixture) run(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = runReplay(ctx, append([]string{"--pg-dsn=" + f.dsn, "--kafka-brokers=" + f.brokers, "--event-id=" + f.id}, args...), &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestAReplayWithExtraFieldsPlacesThemAsTheRelayDoesAndAddsItsHeader(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newReplayFixture(t, ctx, 3)
	out, errOut, err := f.run(t, ctx, "--extra-headers=tenant", "--extra-fields=region:envelope,part:partition")
	if err != nil {
		t.Fatalf("replay with extra_headers and extra_fields: %v\n%s%s", err, out, errOut)
	}
	recs, err := harness.Reread(ctx, f.brokers, f.topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("%d records on %s, want 1", len(recs), f.topic)
	}
	r := recs[0]
	var value map[string]any
	if err := json.Unmarshal(r.Value, &value); err != nil {
		t.Fatalf("value %s: %v", r.Value, err)
	}
	if r.Header(replay.Header) != "true" || r.Header("tenant") != "acme" || value["region"] != "eu" || r.Partition != 2 {
		t.Fatalf("replayed record: partition %d, headers %v, value %s; want partition 2 (the part column), headers outbox.replay=true and tenant=acme, region in the envelope",
			r.Partition, r.Headers, r.Value)
	}
}

func TestAReplayNextToAnExactlyOnceRelayNeitherFencesItNorMovesItsPosition(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newReplayFixture(t, ctx, 1)
	txnID := testenv.UniqueName(t, "txn")
	positions := testenv.UniqueName(t, "positions")

	// The relay: a transactional sink that has committed a position.
	relayCfg := sink.Config{Brokers: []string{f.brokers}, Record: record.Options{TopicTemplate: f.topic},
		Transactions: &sink.Transactions{ID: txnID, PositionsTopic: positions}}
	relay, err := sink.New(relayCfg, zaptest.NewLogger(t), metrics.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close(context.Background())
	if err := relay.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	publish := func(lsn pglogrepl.LSN) {
		t.Helper()
		var acks sink.AckGroup
		acks.Add()
		ev := &decoder.Event{ID: []byte(lsn.String()), AggregateType: []byte("order"), AggregateID: []byte("o-1"), Payload: []byte("{}"),
			Tx: decoder.TxInfo{CommitLSN: lsn, CommitTime: time.Now()}}
		if err := relay.Publish(ctx, ev, &acks); err != nil {
			t.Fatalf("relay publish at %s: %v", lsn, err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		if err := acks.Wait(wctx); err != nil {
			t.Fatalf("relay's event at %s not committed (sink error: %v): %v", lsn, relay.Err(), err)
		}
	}
	publish(0x1000)

	for _, c := range []struct{ name, txnFlag string }{
		{"with the relay's transactional id", "--transactional-id=" + txnID},
		{"with the default transactional id", ""},
	} {
		args := []string{"--delivery=exactly-once", "--positions-topic=" + positions}
		if c.txnFlag != "" {
			args = append(args, c.txnFlag)
		}
		if out, errOut, err := f.run(t, ctx, args...); err != nil {
			t.Errorf("replay %s: %v\n%s%s", c.name, err, out, errOut)
		}
	}

	// The relay's position is its own, and it goes on committing.
	pos, found, err := sink.ReadPosition(ctx, relayCfg)
	if err != nil || !found || pos != (sink.Position{CommitLSN: 0x1000, Events: 1}) {
		t.Errorf("after the replays ReadPosition = %+v, %v, %v; want the relay's own {0/1000 1}", pos, found, err)
	}
	publish(0x2000)
	if err := relay.Err(); err != nil {
		t.Fatalf("the relay's sink failed after the replays: %v", err)
	}
	pos, found, err = sink.ReadPosition(ctx, relayCfg)
	if err != nil || !found || pos != (sink.Position{CommitLSN: 0x2000, Events: 1}) {
		t.Fatalf("ReadPosition = %+v, %v, %v; want the relay's own {0/2000 1}", pos, found, err)
	}
}

func TestAReplayReadsTimestampsWhateverTheDatabasesDateStyle(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newReplayFixture(t, ctx, 1)
	conn := f.connect(t, ctx)
	occurred := time.Date(2026, 11, 30, 12, 0, 0, 250e6, time.UTC)
	if _, err := conn.Exec(ctx, "ALTER TABLE outbox_events ADD COLUMN occurred_at timestamptz"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "UPDATE outbox_events SET occurred_at = $1", occurred); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{conn.Config().Database}.Sanitize()+" SET DateStyle = 'SQL, DMY'"); err != nil {
		t.Fatal(err)
	}
	if out, errOut, err := f.run(t, ctx, "--columns.timestamp=occurred_at"); err != nil {
		t.Fatalf("replay: %v\n%s%s", err, out, errOut)
	}
	recs, err := harness.Reread(ctx, f.brokers, f.topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || !recs[0].Time.Equal(occurred) {
		t.Fatalf("records %+v; want one stamped %v (columns.timestamp)", recs, occurred)
	}
}

func TestAReplayOfAMessagesOnlyOutboxIsRefusedNamingOutboxShape(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err := runReplay(ctx, []string{"--pg-dsn=postgres://relay@127.0.0.1:1/db", "--kafka-brokers=127.0.0.1:1",
		"--outbox-shape=messages", "--event-id=e-1"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "outbox_shape") || ctx.Err() != nil {
		t.Fatalf("replay with outbox_shape messages: %v (%s); want at once an error naming outbox_shape", err, errOut.String())
	}
}

// TestAReplayOfATableWithoutTheCreationTimeColumnNamesTheKey: Debezium's outbox table has no
// creation time column; the replay says which key names it instead of failing with SQL.
func TestAReplayOfATableWithoutTheCreationTimeColumnNamesTheKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newReplayFixture(t, ctx, 1)
	_, _, err := f.run(t, ctx, "--columns.created-at=occurred")
	if err == nil || !strings.Contains(err.Error(), "columns.created_at") || !strings.Contains(err.Error(), `"occurred"`) {
		t.Fatalf("replay without the creation time column: %v; want an error naming columns.created_at and the column", err)
	}
	recs, rerr := harness.Reread(ctx, f.brokers, f.topic)
	if rerr != nil || len(recs) != 0 {
		t.Fatalf("%d records published (%v), want none", len(recs), rerr)
	}
}

// TestAReplayOfATableWithoutSeqKeepsTheAggregatesVersionOrder: without the insertion sequence
// column the rows' creation times order a replay, and they can disagree with the aggregate's
// versions (equal times within a transaction, or clocks): a consumer checking versions would see
// a gap. With columns.aggregate_version configured, each aggregate's events go in version order.
func TestAReplayOfATableWithoutSeqKeepsTheAggregatesVersionOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newReplayFixture(t, ctx, 1)
	conn := f.connect(t, ctx)
	aggType := f.aggType
	// Versions 1..4 of o-2 whose creation times disagree with them (1 and 2 in one transaction,
	// 4 a second before 3), and an event without a version created between 2 and 4: it goes after
	// the versions created before it.
	if _, err := conn.Exec(ctx, "ALTER TABLE outbox_events DROP COLUMN seq, ADD COLUMN aggregate_version bigint"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, aggregate_version, created_at)
		SELECT $1, 'o-2', 'OrderChanged', jsonb_build_object('v', v), v, now() - interval '1 minute' + d * interval '1 second'
		FROM (VALUES (2, 0), (1, 0), (3, 2), (4, 1)) e(v, d)`, aggType); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
		VALUES ($1, 'o-2', 'OrderNoted', '{}', now() - interval '1 minute' + interval '500 milliseconds')`, aggType); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := runReplay(ctx, []string{"--pg-dsn=" + f.dsn, "--kafka-brokers=" + f.brokers, "--columns.aggregate-version=aggregate_version",
		"--aggregate-type=" + aggType, "--aggregate-id=o-2"}, &out, &errOut)
	if err != nil {
		t.Fatalf("replay: %v (%s)", err, errOut.String())
	}
	var recs []harness.Record
	deadline := time.Now().Add(30 * time.Second)
	for len(recs) < 5 && time.Now().Before(deadline) {
		if recs, err = harness.Reread(ctx, f.brokers, f.topic); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var versions []string
	for _, r := range recs {
		versions = append(versions, r.Header("aggregate_version"))
	}
	if strings.Join(versions, ",") != "1,2,,3,4" {
		t.Fatalf("replayed versions in partition order %q, want 1, 2, none, 3, 4", versions)
	}
}

// TestAReplayOfATableWithoutSeqAndATextVersionColumnUsesTheCreationTime: only numbers order
// versions; a text version column (allowed: the stream reads it as it is) must not make the replay's
// query fail, it leaves the creation time order.
func TestAReplayOfATableWithoutSeqAndATextVersionColumnUsesTheCreationTime(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newReplayFixture(t, ctx, 1)
	conn := f.connect(t, ctx)
	if _, err := conn.Exec(ctx, "ALTER TABLE outbox_events DROP COLUMN seq, ADD COLUMN aggregate_version text"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "UPDATE outbox_events SET aggregate_version = '10' WHERE id::text = $1", f.id); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := f.run(t, ctx, "--columns.aggregate-version=aggregate_version")
	if err != nil {
		t.Fatalf("replay: %v (%s)", err, errOut)
	}
	recs, err := harness.Reread(ctx, f.brokers, f.topic)
	if err != nil || len(recs) != 1 || recs[0].Header("aggregate_version") != "10" {
		t.Fatalf("records %v (%v), want the event with aggregate_version 10", recs, err)
	}
}
