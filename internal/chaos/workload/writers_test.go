package workload_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const table = "public.outbox_events"

// TestWritersRecordWhatCommitted writes with rollbacks and mid-way aborts in every shape, and
// checks the database against the history: the marker rows are exactly the committed
// transactions, and the events that reached the outbox (rows, or decoded messages) exactly theirs.
func TestWritersRecordWhatCommitted(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	for _, shape := range []workload.Shape{workload.Table, workload.PartitionedTable, workload.Messages} {
		t.Run(shape.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var dsn string
			if shape == workload.Messages {
				dsn = testenv.MessagesDatabase(t, pg)
			} else {
				dsn = testenv.OutboxDatabase(t, pg)
			}
			if err := workload.Prepare(ctx, dsn, shape, table); err != nil {
				t.Fatal(err)
			}
			conn := connect(ctx, t, dsn)
			slot := ""
			if shape == workload.Messages {
				slot = testenv.UniqueName(t, "slot")
				exec(ctx, t, conn, fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'test_decoding')", slot))
				t.Cleanup(func() {
					exec(context.Background(), t, conn, fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", slot))
				})
			}

			w := workload.StartWriters(ctx, workload.Config{
				DSN: dsn, Table: table, Shape: shape, MessagesPrefix: "outbox", Types: []string{"a", "b"},
				Writers: 3, Aggregates: 4, MaxPerTx: 4, TxPerSecond: 100, RollbackEvery: 4, AbortEvery: 4,
				Seed: 1, Log: t.Logf,
			})
			if err := w.OtherLoad(ctx, 300*time.Millisecond, 50); err != nil {
				t.Error(err)
			}
			if err := w.BigTransaction(ctx, 300); err != nil {
				t.Error(err)
			}
			w.Pause()
			c0, _, _ := w.Counts()
			time.Sleep(200 * time.Millisecond)
			if c1, _, _ := w.Counts(); c1 != c0 {
				t.Errorf("paused writers committed %d transactions", c1-c0)
			}
			w.Resume()
			time.Sleep(300 * time.Millisecond)
			txns := stopAndResolve(ctx, t, w)

			got := outcomes(txns)
			if got[history.Committed] < 10 || got[history.RolledBack] < 4 {
				t.Fatalf("outcomes %v: want at least 10 committed and 4 rolled back", got)
			}
			if got[history.InDoubt]+got[history.Vanished] > 0 {
				t.Errorf("outcomes %v: none may stay in doubt or vanish without faults", got)
			}
			checkSequences(t, txns)
			checkCommitLSNs(ctx, t, conn, txns)
			committedTxns, committedEvents, lostEvents := split(txns)
			if markers := strings.Join(column(ctx, t, conn, "SELECT id FROM chaos_markers"), "\n"); markers != strings.Join(committedTxns, "\n") {
				t.Errorf("marker rows are not the committed transactions:\n%s\nwant\n%s", markers, strings.Join(committedTxns, "\n"))
			}
			var events []string
			switch shape {
			case workload.Messages:
				for _, data := range column(ctx, t, conn, fmt.Sprintf("SELECT data FROM pg_logical_slot_peek_changes('%s', NULL, NULL) WHERE data LIKE 'message:%%'", slot)) {
					for _, id := range append(slices.Clone(committedEvents), lostEvents...) {
						if strings.Contains(data, `"`+id+`"`) {
							events = append(events, id)
						}
					}
				}
				slices.Sort(events)
			case workload.PartitionedTable:
				if leaves := column(ctx, t, conn, "SELECT DISTINCT tableoid::regclass::text FROM "+table+" ORDER BY 1"); !slices.Equal(leaves, []string{"outbox_events_cur_0", "outbox_events_cur_1"}) {
					t.Errorf("rows are in %v, want the two hash partitions", leaves)
				}
				fallthrough
			default:
				events = column(ctx, t, conn, "SELECT id::text FROM "+table)
			}
			if !slices.Equal(events, committedEvents) {
				t.Errorf("the outbox holds %d events, want the %d committed ones (%d rolled back)", len(events), len(committedEvents), len(lostEvents))
			}
		})
	}
}

// TestWritersSurviveKilledConnections terminates the writers' backends again and again for a
// second: they keep writing afterwards, and every transaction ends resolved.
func TestWritersSurviveKilledConnections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	if err := workload.Prepare(ctx, dsn, workload.Table, table); err != nil {
		t.Fatal(err)
	}
	conn := connect(ctx, t, dsn)
	w := workload.StartWriters(ctx, workload.Config{
		DSN: dsn, Table: table, Types: []string{"a"}, Writers: 3, Aggregates: 3, MaxPerTx: 3, Seed: 2, Log: t.Logf,
	})
	time.Sleep(200 * time.Millisecond)
	killed := 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		killed += n
		time.Sleep(20 * time.Millisecond)
	}
	if killed == 0 {
		t.Fatal("no backend was terminated")
	}
	before, _, _ := w.Counts()
	await.True(t, time.Minute, "the writers to commit 10 transactions after the kills", func() bool {
		after, _, _ := w.Counts()
		return after-before >= 10
	})
	txns := stopAndResolve(ctx, t, w)
	got := outcomes(txns)
	t.Logf("%d backends terminated; outcomes %v", killed, got)
	if got[history.InDoubt]+got[history.Vanished] > 0 {
		t.Errorf("outcomes %v: every transaction must be resolved, none vanish", got)
	}
	resolved := 0
	for _, tx := range txns {
		if tx.Resolved {
			resolved++
		}
	}
	t.Logf("%d resolved from their marker rows", resolved)
	committedTxns, committedEvents, _ := split(txns)
	if markers := column(ctx, t, conn, "SELECT id FROM chaos_markers"); !slices.Equal(markers, committedTxns) {
		t.Errorf("%d marker rows, want the %d committed transactions", len(markers), len(committedTxns))
	}
	if events := column(ctx, t, conn, "SELECT id::text FROM "+table); !slices.Equal(events, committedEvents) {
		t.Errorf("%d events in the outbox, want the %d committed ones", len(events), len(committedEvents))
		for _, tx := range txns {
			for _, e := range tx.Events {
				if _, found := slices.BinarySearch(events, e.ID); found != (tx.Outcome == history.Committed) {
					t.Errorf("transaction %+v: event %s in the outbox: %v", tx, e.ID, found)
				}
			}
		}
	}
}

func stopAndResolve(ctx context.Context, t *testing.T, w *workload.Writers) []history.Txn {
	t.Helper()
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	txns, err := w.Resolve(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSortedFunc(txns, func(a, b history.Txn) int { return a.Start.Compare(b.Start) }) {
		t.Error("Resolve's transactions are not ordered by Start")
	}
	return txns
}

func outcomes(txns []history.Txn) map[history.Outcome]int {
	out := make(map[history.Outcome]int)
	for _, tx := range txns {
		out[tx.Outcome]++
	}
	return out
}

// split returns the sorted ids of the committed transactions and of their events, and the ids of
// the others' events.
func split(txns []history.Txn) (committedTxns, committedEvents, lostEvents []string) {
	for _, tx := range txns {
		if tx.Outcome == history.Committed {
			committedTxns = append(committedTxns, tx.ID)
		}
		for _, e := range tx.Events {
			if tx.Outcome == history.Committed {
				committedEvents = append(committedEvents, e.ID)
			} else {
				lostEvents = append(lostEvents, e.ID)
			}
		}
	}
	slices.Sort(committedTxns)
	slices.Sort(committedEvents)
	return committedTxns, committedEvents, lostEvents
}

// checkSequences checks that each key belongs to one writer and its sequence numbers increase
// from 1 in the order the transactions started, every number used once.
func checkSequences(t *testing.T, txns []history.Txn) {
	t.Helper()
	owner := make(map[string]string)
	last := make(map[string]int)
	nonASCII := false
	for _, tx := range txns {
		for _, e := range tx.Events {
			if o, ok := owner[e.Key]; ok && o != tx.Writer {
				t.Fatalf("key %s written by %s and %s", e.Key, o, tx.Writer)
			}
			owner[e.Key] = tx.Writer
			if e.Seq != last[e.Key]+1 {
				t.Fatalf("key %s: seq %d after %d", e.Key, e.Seq, last[e.Key])
			}
			last[e.Key] = e.Seq
			nonASCII = nonASCII || strings.ContainsFunc(e.Key, func(r rune) bool { return r > 127 })
		}
	}
	if !nonASCII {
		t.Error("no key is non-ASCII")
	}
}

func connect(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func column(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) []string {
	t.Helper()
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	slices.Sort(out)
	return out
}

// TestABigTransactionReachesTheWALInSeqOrder decodes a big transaction from the WAL: each
// aggregate's rows must come in the order of their sequence numbers, which is what the relay
// publishes. COPY into a partitioned table breaks that (PostgreSQL buffers COPY's rows per
// partition and writes each buffer in turn), which the nemesis found as reordered events of its big
// transactions in the partitioned mode: the writers use COPY only for a plain table.
func TestABigTransactionReachesTheWALInSeqOrder(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	for _, shape := range []workload.Shape{workload.Table, workload.PartitionedTable} {
		t.Run(shape.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dsn := testenv.OutboxDatabase(t, pg)
			if err := workload.Prepare(ctx, dsn, shape, table); err != nil {
				t.Fatal(err)
			}
			conn := connect(ctx, t, dsn)
			slot := testenv.UniqueName(t, "slot")
			exec(ctx, t, conn, fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'test_decoding')", slot))
			t.Cleanup(func() {
				exec(context.Background(), t, conn, fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", slot))
			})
			w := workload.StartWriters(ctx, workload.Config{DSN: dsn, Table: table, Shape: shape, Types: []string{"a", "b"},
				Writers: 1, Aggregates: 8, TxPerSecond: 1, Seed: 3, Log: t.Logf})
			if err := w.BigTransaction(ctx, 3000); err != nil {
				t.Fatal(err)
			}
			txns := stopAndResolve(ctx, t, w)
			type pos struct {
				key string
				seq int
			}
			byID := map[string]pos{}
			for _, tx := range txns {
				if tx.Writer == "big" && tx.Outcome == history.Committed {
					for _, e := range tx.Events {
						byID[e.ID] = pos{e.Key, e.Seq}
					}
				}
			}
			if len(byID) != 3000 {
				t.Fatalf("the big transaction committed %d events, want 3000", len(byID))
			}
			last := map[string]int{}
			decoded, disordered := 0, 0
			rows, err := conn.Query(ctx, fmt.Sprintf("SELECT data FROM pg_logical_slot_get_changes('%s', NULL, NULL)", slot))
			if err != nil {
				t.Fatal(err)
			}
			changes, err := pgx.CollectRows(rows, pgx.RowTo[string]) // in WAL order, unlike column's
			if err != nil {
				t.Fatal(err)
			}
			for _, change := range changes {
				_, rest, ok := strings.Cut(change, "id[uuid]:'")
				if !ok {
					continue
				}
				p, ok := byID[rest[:36]]
				if !ok {
					continue
				}
				decoded++
				if p.seq < last[p.key] {
					disordered++
				}
				last[p.key] = max(last[p.key], p.seq)
			}
			if decoded != 3000 || disordered > 0 {
				t.Errorf("decoded %d of 3000 rows, %d of them after a later seq of their aggregate", decoded, disordered)
			}
		})
	}
}

// checkCommitLSNs requires every committed transaction to carry a commit LSN, increasing per
// writer (one connection commits in turn) and not beyond the WAL written by the end.
func checkCommitLSNs(ctx context.Context, t *testing.T, conn *pgx.Conn, txns []history.Txn) {
	t.Helper()
	var end int64
	if err := conn.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint").Scan(&end); err != nil {
		t.Fatal(err)
	}
	last := make(map[string]uint64)
	for _, tx := range txns {
		if tx.Outcome != history.Committed {
			continue
		}
		switch {
		case tx.CommitLSN == 0:
			t.Errorf("txn %s (writer %s) committed without a commit LSN", tx.ID, tx.Writer)
		case tx.CommitLSN <= last[tx.Writer]:
			t.Errorf("txn %s (writer %s): commit LSN %d not after the writer's previous %d", tx.ID, tx.Writer, tx.CommitLSN, last[tx.Writer])
		case tx.CommitLSN > uint64(end):
			t.Errorf("txn %s: commit LSN %d beyond the WAL written by the end, %d", tx.ID, tx.CommitLSN, end)
		}
		last[tx.Writer] = max(last[tx.Writer], tx.CommitLSN)
	}
}
