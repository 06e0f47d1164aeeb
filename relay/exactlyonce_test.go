package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
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
	eventually(t, time.Minute, "the first Kafka transaction to commit", func() bool { return position() > 0 })

	// before is where the marker transaction's commit record can start at the earliest: the slot
	// may be confirmed up to it (heartbeats and keepalives before the commit), not past it.
	before := func() pglogrepl.LSN {
		tx, err := f.outbox.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		record, err := f.outbox.WriteIn(ctx, tx, harness.Spec{AggregateType: f.types[0], AggregateID: "marker"})
		if err != nil {
			t.Fatal(err)
		}
		var lsn uint64
		if err := tx.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		record()
		return pglogrepl.LSN(lsn)
	}()
	open := 0 // checks that found the Kafka transaction still open
	deadline := time.Now().Add(time.Minute)
	for {
		f.outbox.Pool().Exec(ctx, "INSERT INTO other (note) SELECT repeat('x', 200) FROM generate_series(1, 50)")
		confirmed := pglogrepl.LSN(f.confirmedLSN())
		committed := position() >= before // the commit record starts at or after before
		switch {
		case confirmed > before && !committed:
			t.Fatalf("confirmed_flush_lsn %s passed the start of the transaction's commit record (at or after %s) while its Kafka transaction had not committed", confirmed, before)
		case !committed:
			open++
		case confirmed > before:
			t.Logf("the slot moved past the transaction once its Kafka transaction committed, after %d checks that found it open", open)
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
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot was not confirmed past the transaction within a minute (confirmed %s, committed %v)", confirmed, committed)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
