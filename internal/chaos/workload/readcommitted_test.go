package workload_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	kproducer "github.com/outbox-relay/outbox-relay/sink/producer"
)

// TestReadCommittedSkipsAbortedTransactionsOfARealProducer writes one partition with the relay's
// own transactional producer: a committed transaction, then one left open while another producer
// commits inside it, that one aborted, then a committed one of the same producer after the
// abort. The read_committed
// consumer reads every committed record in offset order and never the aborted ones;
// read_uncommitted reads them all. While the aborted transaction is open the partition's last
// stable offset is below its high watermark (the end state's hanging-transaction rule), and equal
// once it ends.
func TestReadCommittedSkipsAbortedTransactionsOfARealProducer(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := testenv.UniqueName(t, "rc")
	if err := workload.CreateTopics(ctx, k.Brokers(), []string{topic}, 1); err != nil {
		t.Fatal(err)
	}
	// The relay gives its committer a client with a transport of its own; so does the test.
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	idA, idB := testenv.UniqueName(t, "a"), testenv.UniqueName(t, "b")

	first := beginTxn(ctx, t, client, idA)
	first.write(ctx, t, topic, "a1", "a2")
	first.commit(ctx, t)
	aborted := beginTxn(ctx, t, client, idA)
	aborted.write(ctx, t, topic, "a3", "a4")
	inside := beginTxn(ctx, t, client, idB)
	inside.write(ctx, t, topic, "b1", "b2")
	// The relay's committer returns from a commit only once its records are readable, which they
	// are not while the older transaction is open: it commits in the background meanwhile.
	committed := make(chan error, 1)
	go func() { committed <- inside.c.Flush(ctx) }()

	// a1, a2, their marker, a3, a4, b1, b2, b's marker: stable up to a3 while its transaction is open.
	want := []history.EndOffset{{Topic: topic, Partition: 0, LastStable: 3, HighWatermark: 8}}
	var offs []history.EndOffset
	for !slices.Equal(offs, want) {
		var err error
		if offs, err = workload.EndOffsets(ctx, k.Brokers(), []string{topic}); err != nil {
			t.Fatal(err)
		}
		if len(offs) == 1 && offs[0].HighWatermark >= want[0].HighWatermark {
			break // b's marker is written: the offsets say what they will say until a3's transaction ends
		}
		select {
		case <-ctx.Done():
			t.Fatalf("b's commit marker never written: end offsets %+v", offs)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if !slices.Equal(offs, want) {
		t.Errorf("end offsets with a transaction open: %+v, want %+v", offs, want)
	}
	aborted.abort(t)
	if err := <-committed; err != nil {
		t.Fatalf("the commit inside the aborted transaction: %v", err)
	}
	inside.close()
	// The aborted transaction's producer again: its records after the abort marker are committed.
	after := beginTxn(ctx, t, client, idA)
	after.write(ctx, t, topic, "c1")
	after.commit(ctx, t)

	offs, err := workload.SettledEndOffsets(ctx, k.Brokers(), []string{topic}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(offs) != 1 || offs[0].LastStable != offs[0].HighWatermark || offs[0].HighWatermark < 10 {
		t.Errorf("end offsets once every transaction ended: %+v, want the last stable offset at a high watermark of 10 or more", offs)
	}

	for _, tc := range []struct {
		isolation string
		want      []string
	}{
		{history.ReadCommitted, []string{"a1", "a2", "b1", "b2", "c1"}},
		{history.ReadUncommitted, []string{"a1", "a2", "a3", "a4", "b1", "b2", "c1"}},
	} {
		c := workload.StartConsumer(ctx, tc.isolation, k.Brokers(), tc.isolation, []string{topic})
		ids := map[string]bool{}
		for _, id := range tc.want {
			ids[id] = true
		}
		// c1 comes after every other record: once it is read, nothing before it is still to come.
		err := c.WaitFor(ctx, ids, 0)
		reads := c.Stop()
		if err != nil {
			t.Fatalf("%s: %v", tc.isolation, err)
		}
		var got []string
		for _, rd := range reads {
			got = append(got, rd.EventID)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s read %v, want %v", tc.isolation, got, tc.want)
		}
	}
}

// txn is one Kafka transaction of the relay's producer: a producer and a committer of its own,
// whose transaction stays open until commit (Flush) or abort (the committer's end).
type txn struct {
	p      *kproducer.Producer
	c      *kproducer.Committer
	stop   context.CancelFunc
	mu     sync.Mutex
	seq    uint64
	wrote  int // records the broker acknowledged, inside the open transaction
	failed error
}

func beginTxn(ctx context.Context, t *testing.T, client *kafka.Client, id string) *txn {
	log := zaptest.NewLogger(t)
	ident := kproducer.NewIdentity(client, log, kproducer.IdempotenceOn, id, time.Minute)
	x := &txn{}
	rctx, stop := context.WithCancel(ctx)
	x.stop = stop
	// A committer lingers an hour: the transaction ends only when the test ends it.
	x.c = kproducer.NewCommitter(kproducer.CommitterConfig{
		Client: client, ID: id, Identity: ident, Timeout: 10 * time.Second,
		MaxRecords: 100, Linger: time.Hour, Owner: &owner{}, Log: log,
	})
	x.p = kproducer.New(rctx, kproducer.Config{
		Client: client, MaxBytes: 1 << 20, MaxRecords: 50, Linger: time.Millisecond, Timeout: 10 * time.Second,
		Identity: ident, Log: log, Transactions: x.c, TransactionalID: id,
		Done: func(batch []*kproducer.Record, err error) {
			x.mu.Lock()
			defer x.mu.Unlock()
			if err != nil {
				x.failed = err
				return
			}
			x.wrote += len(batch)
			x.c.Written(batch, func([]*kproducer.Record) {})
		},
		Retrying: func(string, int, int, error, time.Duration) {},
		Sent:     func(int) {},
		StopAt:   func() uint64 { return math.MaxUint64 },
		Failed:   func(err error) { x.mu.Lock(); x.failed = err; x.mu.Unlock() },
	})
	x.c.Producers(x.p)
	go x.c.Run(rctx)
	t.Cleanup(x.close)
	return x
}

// write hands values over (each its own event id, in the "id" header) and returns once the broker
// has them, in the open transaction.
func (x *txn) write(ctx context.Context, t *testing.T, topic string, values ...string) {
	t.Helper()
	for _, v := range values {
		x.seq++
		rec := &kproducer.Record{Msg: kafka.Message{Topic: topic, Key: []byte("k"), Value: fmt.Appendf(nil, `{"seq":%d}`, x.seq),
			Headers: []kafka.Header{{Key: "id", Value: []byte(v)}}, Time: time.Now()}, Partition: 0, Seq: x.seq, Enqueued: time.Now()}
		rec.Size = int64(kproducer.RecordSize(&rec.Msg))
		x.c.Join(rec)
		if err := x.p.Enqueue(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	x.waitFor(ctx, t, func() bool { return x.wrote == int(x.seq) })
}

func (x *txn) waitFor(ctx context.Context, t *testing.T, cond func() bool) {
	t.Helper()
	for {
		x.mu.Lock()
		ok, failed := cond(), x.failed
		x.mu.Unlock()
		switch {
		case failed != nil:
			t.Fatal(failed)
		case ok:
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for the producer: %v", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// commit commits the transaction and returns once its markers are written.
func (x *txn) commit(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := x.c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	x.close()
}

// abort ends the committer, which aborts the open transaction (EndTxn abort) before it returns.
func (x *txn) abort(t *testing.T) {
	t.Helper()
	x.close()
}

func (x *txn) close() {
	x.stop()
	<-x.c.Done()
	x.p.Close()
}

// owner is a committer's owner that adds nothing to its transactions and never halts.
type owner struct{}

func (*owner) Halted() (uint64, bool)                      { return 0, false }
func (*owner) Companion() (kproducer.TopicPartition, bool) { return kproducer.TopicPartition{}, false }
func (*owner) Committed(*kproducer.Record)                 {}
func (*owner) Count(string)                                {}
func (*owner) Stopped(error, bool)                         {}
func (*owner) BeforeCommit(context.Context, *kproducer.Record, map[kproducer.TopicPartition]kproducer.Span) (kproducer.TopicPartition, int64, error) {
	return kproducer.TopicPartition{}, -1, nil
}
