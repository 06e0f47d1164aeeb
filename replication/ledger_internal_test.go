package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestANewSlotIsRecordedEvenWhenTheRelayIsStoppingMeanwhile: a relay told to stop while it creates
// its slot (a rolling restart right after a first start) leaves the slot behind; if the ledger
// misses it, losing that slot later cannot be told from a first start, and a new slot silently
// skips what was committed in between. The record is written even though the caller's context
// has ended.
func TestANewSlotIsRecordedEvenWhenTheRelayIsStoppingMeanwhile(t *testing.T) {
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	slot := testenv.UniqueName(t, "slot")
	s := &Stream{cfg: Config{DSN: dsn, Slot: slot}, log: zaptest.NewLogger(t), ledger: NewLedger("public")}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.recordSlot(ctx, 0x1234)

	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	e, ok, err := s.ledger.Lookup(context.Background(), conn, slot)
	if err != nil || !ok || e.ConsistentLSN != 0x1234 {
		t.Fatalf("ledger entry %+v (found %v, %v), want the slot recorded at 0/1234", e, ok, err)
	}
}

// TestAStoppingStreamDoesNotBlameTheLedger: recording the server's identity is retried by every
// session; a stream already stopping skips it, instead of failing to connect and warning the
// operator to run migrate and grant rights, which nothing is wrong with.
func TestAStoppingStreamDoesNotBlameTheLedger(t *testing.T) {
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	core, logs := observer.New(zap.DebugLevel)
	s := &Stream{cfg: Config{DSN: dsn, Slot: testenv.UniqueName(t, "slot")}, log: zap.New(core), ledger: NewLedger("public"),
		identity: Identity{SystemID: "1", Timeline: 1}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.recordIdentity(ctx, nil)
	if logs.Len() != 0 {
		t.Fatalf("a stopping stream logged %q", logs.All()[0].Message)
	}
}

// TestALaterTermKnowsWhatTheLedgerHolds: a term of the process begins with the server an earlier
// term reached. When that earlier term reached a promoted standby but ended before streaming (the
// old primary's death also cut the leader lock), only the ledger, which still names the old
// timeline, says that the next term resumes from the slot the standby synchronised: the relay
// must say so (faults.TestFailoverToAStandbyWithTheFailoverSlot missed it in a CI run).
func TestALaterTermKnowsWhatTheLedgerHolds(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	slot := testenv.UniqueName(t, "slot")
	old := Identity{SystemID: "7", Timeline: 1}
	promoted := Identity{SystemID: "7", Timeline: 2}
	first := &Stream{cfg: Config{DSN: dsn, Slot: slot}, log: zaptest.NewLogger(t), ledger: NewLedger("public"), identity: old}
	if err := first.recordSlot(ctx, 0x1234); err != nil {
		t.Fatal(err)
	}
	first.recordIdentity(ctx, nil)

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, tt := range []struct {
		name         string
		remembered   Identity // what the process knew when the Stream began
		wantRecorded Identity // what a first session compares with
	}{
		{"the process's first term", Identity{}, old},
		{"a later term after one that reached the promoted standby", promoted, Identity{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &Stream{cfg: Config{DSN: dsn, Slot: slot}, log: zaptest.NewLogger(t), ledger: NewLedger("public"), identity: tt.remembered}
			// Twice: a session that ended before IDENTIFY_SYSTEM (the slot still busy, a standby
			// reached) is retried, and the retry compares with the record as the first one did.
			for range 2 {
				if got := s.readLedgerIdentity(ctx, conn); got != tt.wantRecorded {
					t.Errorf("recorded = %+v, want %+v", got, tt.wantRecorded)
				}
			}
			if s.ledgerIdentity != old {
				t.Errorf("ledgerIdentity = %+v, want %+v", s.ledgerIdentity, old)
			}
			if !resumesSynced(slotFailoverState{failover: true, synced: true}, false, s.ledgerIdentity, promoted) {
				t.Error("a session on the promoted standby's synchronised slot would not say it resumes from it")
			}
		})
	}
}

// TestAStartsLedgerWritesOutliveTheChecksConnection: the start writes the server's identity and
// its holder to the ledger on the checks' connection, kept open for them, which a long
// BeforeStream (a backfill) may outlive: closed, or ended by the server. The writes then go
// through a connection of their own; a holder left unrecorded would end the session.
func TestAStartsLedgerWritesOutliveTheChecksConnection(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, tt := range []struct {
		name string
		conn func(t *testing.T) *pgx.Conn // the checks' connection as the writes find it
	}{
		{"open", func(t *testing.T) *pgx.Conn { return connect(t, dsn) }},
		{"none", func(t *testing.T) *pgx.Conn { return nil }},
		{"closed by the relay", func(t *testing.T) *pgx.Conn {
			c := connect(t, dsn)
			c.Close(ctx)
			return c
		}},
		{"ended by the server", func(t *testing.T) *pgx.Conn {
			c := connect(t, dsn)
			if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", c.PgConn().PID()); err != nil {
				t.Fatal(err)
			}
			return c
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			slot := testenv.UniqueName(t, "slot")
			id := Identity{SystemID: "7", Timeline: 3}
			s := &Stream{cfg: Config{DSN: dsn, Slot: slot}, log: zaptest.NewLogger(t), ledger: NewLedger("public"), identity: id, mem: NewMemory()}
			if err := s.recordSlot(ctx, 0x1234); err != nil {
				t.Fatal(err)
			}
			conn := tt.conn(t)
			s.recordIdentity(ctx, conn)
			if err := s.recordHolder(ctx, conn); err != nil {
				t.Fatalf("recordHolder: %v", err)
			}
			if recorded, known, err := s.ledger.Identity(ctx, admin, slot); err != nil || !known || recorded != id {
				t.Errorf("ledger identity %+v (known %v, %v), want %+v", recorded, known, err, id)
			}
			if holder, ok, err := s.ledger.Holder(ctx, admin, slot); err != nil || !ok || holder != s.mem.token {
				t.Errorf("ledger holder %q (ok %v, %v), want this process's %q", holder, ok, err, s.mem.token)
			}
		})
	}
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestARecoveryIsEndedOnlyByItsOwnerForTheReplacementItCreated: a recovery recorded as ended
// makes the next start stream the replacement slot from its consistent point, so only the
// process that owns the recovery (its session holds the recovery lock) may end it, and only for
// the replacement it created: another process's replacement, even at the same position, starts
// after a gap this one did not publish.
func TestARecoveryIsEndedOnlyByItsOwnerForTheReplacementItCreated(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	ledger := NewLedger("public")
	for _, tt := range []struct {
		name    string
		locked  bool // the ending session holds the recovery lock
		other   bool // another replacement at the same position was recorded meanwhile
		want    bool
		wantErr error
	}{
		{"the owner ends the recovery of its replacement", true, false, true, nil},
		{"a session without the recovery lock ends nothing", false, false, false, ErrNotRecoveryOwner},
		{"the owner ends nothing once another replacement is recorded, even at the same position", true, true, false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			slot := testenv.UniqueName(t, "slot")
			conn := connect(t, dsn)
			if err := ledger.BeginRecovery(ctx, conn, slot, time.Now().Add(-time.Minute), false); err != nil {
				t.Fatal(err)
			}
			const lsn = pglogrepl.LSN(0x1234)
			created, err := ledger.RecordReplacementSlot(ctx, conn, slot, lsn)
			if err != nil {
				t.Fatal(err)
			}
			if tt.other {
				if _, err := ledger.RecordReplacementSlot(ctx, connect(t, dsn), slot, lsn); err != nil {
					t.Fatal(err)
				}
			}
			if tt.locked {
				if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", RecoveryLockKey(slot)); err != nil {
					t.Fatal(err)
				}
			}
			ended, err := ledger.EndRecovery(ctx, conn, slot, Replacement{ConsistentLSN: lsn, Created: created}, RecoveryLockKey(slot),
				Recovery{Events: 3, From: time.Now().Add(-time.Minute), Rule: RuleCreatedAt, Took: time.Second})
			if ended != tt.want || !errors.Is(err, tt.wantErr) {
				t.Fatalf("EndRecovery = %v, %v; want %v, %v", ended, err, tt.want, tt.wantErr)
			}
			st, err := ledger.Recovery(ctx, conn, slot)
			if err != nil {
				t.Fatal(err)
			}
			if underWay := !st.Since.IsZero(); underWay == tt.want {
				t.Errorf("recovery under way %v after EndRecovery returned %v", underWay, ended)
			}
		})
	}
}

// TestASecondProcessWaitsForTheRecoverysOwnerAndSaysWho: while one process owns a lost slot's
// recovery, another one that finds the slot lost waits for the recovery lock, naming the owner's
// backend, and takes it only once the owner's session ends.
func TestASecondProcessWaitsForTheRecoverysOwnerAndSaysWho(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	slot := testenv.UniqueName(t, "slot")
	owner := &Stream{cfg: Config{DSN: dsn, Slot: slot}, log: zaptest.NewLogger(t), ledger: NewLedger("public")}
	first, err := owner.ownRecovery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	waiter := &Stream{cfg: Config{DSN: dsn, Slot: slot}, log: zap.New(core), ledger: NewLedger("public")}
	type result struct {
		o   *recoveryOwner
		err error
	}
	got := make(chan result, 1)
	go func() {
		o, err := waiter.ownRecovery(ctx)
		got <- result{o, err}
	}()
	want := fmt.Sprintf("PostgreSQL backend PID %d", first.conn.PgConn().PID())
	deadline := time.Now().Add(30 * time.Second)
	for {
		waiting := logs.FilterMessageSnippet("another process owns the recovery").All()
		if len(waiting) > 0 {
			if owner := waiting[0].ContextMap()["owner"]; !strings.Contains(fmt.Sprint(owner), want) {
				t.Errorf("the waiting line names the owner %q; want %q", owner, want)
			}
			break
		}
		select {
		case r := <-got:
			t.Fatalf("the second process took the recovery lock while the first held it (%v)", r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the second process did not say that it waits for the recovery's owner")
		}
		time.Sleep(20 * time.Millisecond)
	}
	first.close(ctx)
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the second process did not take the recovery lock once it was free: %v", r.err)
		}
		r.o.close(ctx)
	case <-time.After(30 * time.Second):
		t.Fatal("the second process did not take the recovery lock within 30s of its release")
	}
}

// TestAnOwnerWhoseLockConnectionEndsStopsPublishingTheGap: once the recovery lock's connection is
// gone, another process may own the recovery and publish the gap again; the publication under the
// lost lock must stop at once, saying why, before it records anything.
func TestAnOwnerWhoseLockConnectionEndsStopsPublishingTheGap(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	s := &Stream{cfg: Config{DSN: dsn, Slot: testenv.UniqueName(t, "slot")}, log: zaptest.NewLogger(t), ledger: NewLedger("public")}
	o, err := s.ownRecovery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer o.close(ctx)
	publishing, stop := o.watch(ctx)
	if _, err := connect(t, dsn).Exec(ctx, "SELECT pg_terminate_backend($1)", o.conn.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-publishing.Done():
	case <-time.After(ownerCheckInterval + ownerCheckTimeout + 5*time.Second):
		t.Fatal("the publication went on after the recovery lock's connection ended")
	}
	if err := stop(); !errors.Is(err, errOwnershipLost) || !errors.Is(context.Cause(publishing), errOwnershipLost) {
		t.Fatalf("stop() = %v, cause %v; want errOwnershipLost", err, context.Cause(publishing))
	}
}

// TestRecordConfirmedNeverMovesTheCommitTimeOrTheHorizonBack: a horizon is valid for every later
// point, so the ledger keeps the newest of each, records a horizon without a commit time (an idle
// outbox), and a write from a process behind another changes neither.
func TestRecordConfirmedNeverMovesTheCommitTimeOrTheHorizonBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	l, slot := NewLedger("public"), testenv.UniqueName(t, "slot")
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, step := range []struct {
		name string
		rec  Confirmed
		want Confirmed
	}{
		{"a horizon alone is recorded", Confirmed{Xmin: 1000}, Confirmed{Xmin: 1000}},
		{"a commit time is recorded and the horizon moves on", Confirmed{CommitTime: t0, EndLSN: 0x100, Xmin: 2000}, Confirmed{CommitTime: t0, EndLSN: 0x100, Xmin: 2000}},
		{"an older commit time and horizon change nothing", Confirmed{CommitTime: t0.Add(-time.Second), EndLSN: 0x80, Xmin: 1500}, Confirmed{CommitTime: t0, EndLSN: 0x100, Xmin: 2000}},
		{"a newer commit time without a horizon keeps the horizon", Confirmed{CommitTime: t0.Add(time.Second), EndLSN: 0x200}, Confirmed{CommitTime: t0.Add(time.Second), EndLSN: 0x200, Xmin: 2000}},
		{"a newer horizon with an older commit time moves only the horizon", Confirmed{CommitTime: t0, EndLSN: 0x100, Xmin: 5_000_000_000}, Confirmed{CommitTime: t0.Add(time.Second), EndLSN: 0x200, Xmin: 5_000_000_000}},
	} {
		if err := l.RecordConfirmed(ctx, conn, slot, step.rec); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		st, err := l.Recovery(ctx, conn, slot)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if !st.Confirmed.CommitTime.Equal(step.want.CommitTime) || st.Confirmed.EndLSN != step.want.EndLSN || st.Confirmed.Xmin != step.want.Xmin {
			t.Errorf("%s: the ledger holds %+v, want %+v", step.name, st.Confirmed, step.want)
		}
	}
}
