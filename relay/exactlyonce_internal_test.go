package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// These tests drive the pipeline with hand-made pgoutput messages and a position that a fake reads
// from "Kafka", so they pin the relay's half of exactly-once (what a replay skips, what it still
// publishes, when it refuses) independently of the transactional producer. The sink itself is the
// at-least-once one: what matters here is what the pipeline hands it.

func session(timeline uint32, walEnd pglogrepl.LSN) replication.Message {
	return replication.Message{Kind: replication.Session, Timeline: timeline, WALEnd: walEnd}
}

func stream(msgs ...any) <-chan replication.Message {
	ch := make(chan replication.Message, len(msgs))
	for _, m := range msgs {
		switch m := m.(type) {
		case replication.Message:
			ch <- m
		case []byte:
			ch <- dataMessage(m)
		}
	}
	close(ch)
	return ch
}

// exactlyOnceWAL is a WAL source whose pipeline behaves as with delivery: exactly-once, reading the
// position pos (found says whether there is one) from a fake. It has a database with the slot
// ledger, for the checks against it.
func exactlyOnceWAL(t *testing.T, pos sink.Position, found bool) (*walSource, *prometheus.Registry, *countingReads) {
	t.Helper()
	k := testenv.SharedKafka(t)
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	r, reg := newTestWAL(t, Config{Sink: sink.Config{Brokers: []string{k.Brokers()}}})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r.sink.Close(ctx)
	})
	r.cfg.Replication.DSN = dsn
	r.cfg.Replication.Slot = testenv.UniqueName(t, "slot")
	// Set after newTestWAL, so the sink stays the plain one: the pipeline alone is under test.
	r.cfg.Sink.Transactions = &sink.Transactions{ID: "relay-test-" + r.cfg.Replication.Slot}
	reads := &countingReads{wal: r, pos: pos, found: found}
	r.positions = reads.read
	return r, reg, reads
}

type countingReads struct {
	wal   *walSource
	pos   sink.Position
	found bool
	err   error
	n     int
}

func (c *countingReads) read(context.Context) (sink.Position, bool, error) {
	c.n++
	return c.pos, c.found, c.err
}

func TestAReplayPublishesOnlyWhatTheCommittedPositionDoesNotCover(t *testing.T) {
	t.Parallel()
	aggType := testenv.UniqueName(t, "eos")
	r, reg, reads := exactlyOnceWAL(t, sink.Position{CommitLSN: 200, Events: 2}, true)
	ctx := context.Background()
	msgs := stream(session(1, 50), relationMessage(outboxColumns),
		// Before the position's transaction: all of it is in Kafka.
		beginMessage(100), event(aggType, 1, `{}`), event(aggType, 2, `{}`), commitMessage(100, 110),
		// The position's transaction: its first two events are in Kafka, the other two are not.
		beginMessage(200), event(aggType, 3, `{}`), event(aggType, 4, `{}`), event(aggType, 5, `{}`), event(aggType, 6, `{}`), commitMessage(200, 210),
		// After it: nothing of it is in Kafka.
		beginMessage(300), event(aggType, 7, `{}`), commitMessage(300, 310),
	)
	if err := r.pipeline(ctx, ctx, msgs); err != nil {
		t.Fatal(err)
	}
	if reads.n != 1 {
		t.Fatalf("the position was read %d times for one session, want 1", reads.n)
	}
	waitSafe(t, r, 310)
	if got := metricSum(t, reg, "outbox_relay_events_replay_skipped_total"); got != 4 {
		t.Fatalf("%v events skipped, want 4 (both of the first transaction, two of the second)", got)
	}
	if got := publishedTotal(t, reg); got != 3 {
		t.Fatalf("%v events published, want 3 (events 5, 6 and 7)", got)
	}
}

// TestAPositionBeyondTheServersEndOfWALSkipsNothing: a position no transaction of the server
// reached (forged into the positions topic: FFFFFFFF/0) would skip every event for good, and the
// slot would be confirmed past them. It is refused, loudly, and every event is published.
func TestAPositionBeyondTheServersEndOfWALSkipsNothing(t *testing.T) {
	t.Parallel()
	aggType := testenv.UniqueName(t, "forged")
	r, reg, _ := exactlyOnceWAL(t, sink.Position{CommitLSN: 0xFFFFFFFF00000000}, true)
	ctx := context.Background()
	start := session(1, 50)
	start.ServerEnd = 400
	msgs := stream(start, relationMessage(outboxColumns),
		beginMessage(100), event(aggType, 1, `{}`), event(aggType, 2, `{}`), commitMessage(100, 110),
		beginMessage(300), event(aggType, 3, `{}`), commitMessage(300, 310),
	)
	if err := r.pipeline(ctx, ctx, msgs); err != nil {
		t.Fatal(err)
	}
	waitSafe(t, r, 310)
	if got := metricSum(t, reg, "outbox_relay_events_replay_skipped_total"); got != 0 {
		t.Fatalf("%v events skipped by a position beyond the server's end of WAL, want none", got)
	}
	if got := publishedTotal(t, reg); got != 3 {
		t.Fatalf("%v events published, want all 3", got)
	}
}

func TestAResumedTransactionIsNotPublishedTwiceAfterAReconnect(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		exactlyOnce bool
	}{
		{"at-least-once", false},
		{"exactly-once, with no position in Kafka yet", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			aggType := testenv.UniqueName(t, "resume")
			var r *walSource
			var reg *prometheus.Registry
			if tt.exactlyOnce {
				r, reg, _ = exactlyOnceWAL(t, sink.Position{}, false)
			} else {
				r, reg = newTestWAL(t, Config{Sink: sink.Config{Brokers: []string{testenv.SharedKafka(t).Brokers()}}})
			}
			ctx := context.Background()
			// The first session ends after two events of a transaction; the second replays it whole.
			msgs := stream(session(1, 50), relationMessage(outboxColumns),
				beginMessage(100), event(aggType, 1, `{}`), event(aggType, 2, `{}`),
				session(1, 50), relationMessage(outboxColumns),
				beginMessage(100), event(aggType, 1, `{}`), event(aggType, 2, `{}`), event(aggType, 3, `{}`), commitMessage(100, 110),
			)
			if err := r.pipeline(ctx, ctx, msgs); err != nil {
				t.Fatal(err)
			}
			waitSafe(t, r, 110)
			if got := publishedTotal(t, reg); got != 3 {
				t.Fatalf("%v events published, want 3: the two handed over before the reconnect went once", got)
			}
		})
	}
}

func TestAPositionLostFromKafkaStopsTheRelayWithTheFix(t *testing.T) {
	t.Parallel()
	r, _, _ := exactlyOnceWAL(t, sink.Position{}, false)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, r.cfg.Replication.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// A previous run committed a position; the topic has none now (deleted, or compacted away).
	if err := replication.NewLedger("public").RecordPositions(ctx, conn, r.cfg.Replication.Slot, r.cfg.Sink.Transactions.ID, sink.DefaultPositionsTopic); err != nil {
		t.Fatal(err)
	}
	err = r.pipeline(ctx, ctx, stream(session(1, 50)))
	if err == nil || !replication.IsFatal(err) {
		t.Fatalf("pipeline returned %v, want a fatal error", err)
	}
	for _, want := range []string{sink.DefaultPositionsTopic, r.cfg.Sink.Transactions.ID, "cleanup.policy=compact", "kafka_transactional_id = NULL", "duplicates"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestAFirstCommitIsRecordedInTheLedgerSoALaterLossIsNoticed(t *testing.T) {
	t.Parallel()
	aggType := testenv.UniqueName(t, "first")
	r, _, _ := exactlyOnceWAL(t, sink.Position{}, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); r.recordPositions(ctx) }()
	if err := r.pipeline(ctx, ctx, stream(session(1, 50), relationMessage(outboxColumns),
		beginMessage(100), event(aggType, 1, `{}`), commitMessage(100, 110))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the first commit was not recorded within a minute")
	}
	conn, err := pgx.Connect(ctx, r.cfg.Replication.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rec, ok, err := replication.NewLedger("public").Positions(ctx, conn, r.cfg.Replication.Slot)
	if err != nil || !ok || rec.TransactionalID != r.cfg.Sink.Transactions.ID || rec.PositionsTopic != sink.DefaultPositionsTopic {
		t.Fatalf("ledger record %+v (found %v, error %v), want transactional id %q in %s", rec, ok, err, r.cfg.Sink.Transactions.ID, sink.DefaultPositionsTopic)
	}
}

func TestAPositionThatCannotBeReadForGoodStopsTheRelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		err   error
		fatal bool
	}{
		{"an authorization failure on the positions topic", kafka.TopicAuthorizationFailed, true},
		{"a broker that does not speak the request", kafka.UnsupportedVersion, true},
	}
	for _, tt := range tests {
		t.Run(tt.name+" ends the relay with the fix", func(t *testing.T) {
			_, _, reads := exactlyOnceWAL(t, sink.Position{}, false)
			r := reads.wal
			reads.err = tt.err
			ctx := context.Background()
			err := r.pipeline(ctx, ctx, stream(session(1, 50)))
			if !replication.IsFatal(err) || !errors.Is(err, tt.err) {
				t.Fatalf("pipeline returned %v, want a fatal error wrapping %v", err, tt.err)
			}
			if !strings.Contains(err.Error(), "positions_topic") || !strings.Contains(err.Error(), "docs/operations.md") {
				t.Errorf("error %q names neither the key nor where the fix is described", err)
			}
		})
	}
	t.Run("a broker that is unreachable is retried until the stop", func(t *testing.T) {
		_, _, reads := exactlyOnceWAL(t, sink.Position{}, false)
		r := reads.wal
		reads.err = errors.New("dial tcp: connection refused")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := r.pipeline(ctx, ctx, stream(session(1, 50))); err != nil {
			t.Fatalf("pipeline returned %v, want nil at the stop", err)
		}
		if reads.n < 2 {
			t.Fatalf("read %d times in 2s, want retries", reads.n)
		}
	})
}

func TestANewTimelineWhileStreamingStopsSkippingByTheOldPosition(t *testing.T) {
	t.Parallel()
	aggType := testenv.UniqueName(t, "timeline")
	r, reg, _ := exactlyOnceWAL(t, sink.Position{CommitLSN: 200, Events: 1}, true)
	r.history = func(context.Context, uint32) (replication.Identity, []replication.TimelineSwitch, error) {
		return replication.Identity{Timeline: 2}, []replication.TimelineSwitch{{Timeline: 1, End: 150}}, nil
	}
	ctx := context.Background()
	// After a failover the new timeline may reuse LSNs: its transaction at 200 is another one.
	msgs := stream(session(1, 50), relationMessage(outboxColumns),
		session(2, 150), relationMessage(outboxColumns),
		beginMessage(200), event(aggType, 1, `{}`), commitMessage(200, 210),
	)
	if err := r.pipeline(ctx, ctx, msgs); err != nil {
		t.Fatal(err)
	}
	waitSafe(t, r, 210)
	if got := publishedTotal(t, reg); got != 1 {
		t.Fatalf("%v events published, want 1: a position of the old timeline must not skip the new one's events", got)
	}
}

func waitSafe(t *testing.T, r *walSource, lsn pglogrepl.LSN) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.tracker.Safe() < lsn {
		if time.Now().After(deadline) {
			t.Fatalf("Safe() = %s after a minute, want %s", r.tracker.Safe(), lsn)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
