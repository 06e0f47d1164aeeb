package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestExactlyOnceConfirmsNothingOfAKafkaTransactionBeforeItCommits: with exactly-once delivery the
// slot may be confirmed past a PostgreSQL transaction only once the Kafka transaction holding its
// events has committed. Kafka transactions here last 4 s, and meanwhile other tables write WAL
// (keepalives report a WAL end far ahead) and heartbeats arrive: neither may move the slot past
// the open Kafka transaction.
func TestExactlyOnceConfirmsNothingOfAKafkaTransactionBeforeItCommits(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	f := newFixture(t, testenv.SharedPostgres(t), k.Brokers(), 1)
	ctx := context.Background()
	if _, err := f.outbox.Pool().Exec(ctx, "CREATE TABLE other (id bigserial PRIMARY KEY, note text)"); err != nil {
		t.Fatal(err)
	}
	cfg := f.config()
	cfg.Sink.Transactions = &sink.Transactions{ID: f.slot, Interval: 4 * time.Second, Linger: 4 * time.Second, PositionsTopic: testenv.UniqueName(t, "positions")}
	cfg.HeartbeatInterval = 100 * time.Millisecond
	stop := f.start(cfg)
	position := func() pglogrepl.LSN {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		pos, _, err := sink.ReadPosition(rctx, cfg.Sink)
		if err != nil {
			t.Fatal(err)
		}
		return pos.CommitLSN
	}

	// Warm: topics exist, a transaction committed.
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "warm"}); err != nil {
		t.Fatal(err)
	}
	await.True(t, time.Minute, "the first Kafka transaction to commit", func() bool { return position() > 0 })

	// The marker transaction's commit record starts at commit, which PostgreSQL does not report:
	// it lies between before (the insert position inside the transaction) and after (the insert
	// position once it committed), and other WAL lands between them: heartbeats, which the relay
	// decodes, sends and may confirm ahead of the marker, and other databases' writes. The slot may
	// be confirmed up to commit (a restart from there decodes the transaction again), not past it.
	// The marker is the last outbox event, so the position its Kafka transaction writes is commit
	// exactly: the checks are recorded and judged once it is known, and it is checked to lie
	// between before and after.
	var before, after pglogrepl.LSN
	func() {
		tx, err := f.outbox.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		record, err := f.outbox.WriteIn(ctx, tx, harness.Spec{AggregateType: f.types[0], AggregateID: "marker"})
		if err != nil {
			t.Fatal(err)
		}
		before = walInsertLSN(t, tx)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		record()
		after = walInsertLSN(t, f.outbox.Pool())
	}()
	type check struct{ confirmed, position pglogrepl.LSN }
	var checks []check
	commit := pglogrepl.LSN(0) // the marker's commit position, once its Kafka transaction committed
	deadline := time.Now().Add(time.Minute)
	for {
		f.outbox.Pool().Exec(ctx, "INSERT INTO other (note) SELECT repeat('x', 200) FROM generate_series(1, 50)")
		// The slot first, then Kafka: a position read after the slot that has not reached the
		// marker's commit says Kafka had not committed it when the slot was read either.
		c := check{confirmed: pglogrepl.LSN(f.confirmedLSN())}
		c.position = position()
		checks = append(checks, c)
		if commit == 0 && c.position >= before {
			commit = c.position
			if commit >= after {
				t.Fatalf("the position %s the marker's Kafka transaction wrote is not the marker's commit record, which starts in [%s, %s)", commit, before, after)
			}
		}
		if commit != 0 && c.confirmed > commit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot was not confirmed past the transaction within a minute (confirmed %s, position %s, marker's commit at or after %s)", c.confirmed, c.position, before)
		}
		time.Sleep(200 * time.Millisecond)
	}
	open := 0 // checks that found the Kafka transaction still open
	for _, c := range checks {
		if c.position >= commit {
			break
		}
		if c.confirmed > commit {
			t.Fatalf("confirmed_flush_lsn %s passed the transaction's commit record at %s while its Kafka transaction had not committed", c.confirmed, commit)
		}
		open++
	}
	t.Logf("the slot moved past the transaction's commit record at %s once its Kafka transaction committed, after %d checks that found it open", commit, open)
	if open < 3 {
		t.Errorf("only %d checks while the Kafka transaction was open: the test did not test the window", open)
	}
	written := f.outbox.Written()
	c := harness.NewCommittedConsumer(f.brokers, harness.Topics(written, nil)...)
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := c.ReadUntil(rctx, time.Second, func(recs []harness.Record) bool { return harness.Verify(written, recs, nil).Missing == 0 })
	if rep := harness.Verify(written, c.Records(), nil); err != nil || !rep.OK() || rep.Duplicates > 0 {
		t.Fatalf("read_committed delivery check failed (read error: %v): %s", err, rep)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// walInsertLSN is PostgreSQL's current WAL insert position, read through q.
func walInsertLSN(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) pglogrepl.LSN {
	t.Helper()
	var lsn uint64
	if err := q.QueryRow(context.Background(), "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return pglogrepl.LSN(lsn)
}

// TestARelayThatFindsTheSlotStreamedFencesNothing: a relay that starts while another streams its
// slot (one run without the leader election, a second instance misconfigured onto the same slot)
// is refused by the checks; before them it must not have asked Kafka for the transactional id's
// producer, which would fence the relay that streams (it would stop with ErrSuperseded, and its
// open transaction would be aborted). The start's Kafka round trips that run alongside the checks
// (sink.Prestart) leave the transactional id alone.
func TestARelayThatFindsTheSlotStreamedFencesNothing(t *testing.T) {
	k := testenv.SharedKafka(t)
	f := newFixture(t, testenv.SharedPostgres(t), k.Brokers(), 1)
	cfg := f.config()
	cfg.Sink.Transactions = &sink.Transactions{ID: f.slot, Interval: 200 * time.Millisecond, PositionsTopic: testenv.UniqueName(t, "positions")}
	cfg.Replication.SlotBusyWait = time.Second
	stop := f.start(cfg)
	ctx := context.Background()
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "before"}); err != nil {
		t.Fatal(err)
	}
	f.verifyCommitted(30 * time.Second)

	second, err := relay.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := second.Run(rctx); !errors.Is(err, replication.ErrSlotActive) {
		t.Fatalf("the second relay ended with %v, want %v", err, replication.ErrSlotActive)
	}
	if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "after"}); err != nil {
		t.Fatal(err)
	}
	f.verifyCommitted(30 * time.Second) // the first relay still publishes
	if err := stop(); err != nil {
		t.Errorf("the relay streaming the slot ended with %v", err)
	}
}

// verifyCommitted reads every topic as a read_committed consumer until each written event arrived
// (or timeout), and checks that each did once, in order.
func (f *fixture) verifyCommitted(timeout time.Duration) {
	f.t.Helper()
	written := f.outbox.Written()
	c := harness.NewCommittedConsumer(f.brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := c.ReadUntil(ctx, time.Second, func(recs []harness.Record) bool {
		return harness.Verify(written, recs, nil).Missing == 0
	})
	if rep := harness.Verify(written, c.Records(), nil); err != nil || !rep.OK() || rep.Duplicates > 0 {
		f.t.Fatalf("delivery check failed (read error: %v): %s", err, rep)
	}
}
