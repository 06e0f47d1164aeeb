package cluster

import (
	"context"
	"errors"
	"fmt"

	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// One cluster with a standby, three brokers and two clients goes through every fault and its heal,
// two failovers in a row, and a Close that leaves no server of its own running.
func TestEveryFaultIsAppliedAndHealedAndCloseLeavesNothingRunning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	dir := t.TempDir()
	start := time.Now()
	c, err := Start(ctx, Options{Dir: dir, Standby: true, Brokers: 3, Clients: []string{"r1", "r2"}, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Start took %v", time.Since(start).Round(time.Millisecond))
	closed := false
	defer func() {
		if !closed {
			_ = c.Close(context.Background())
		}
	}()
	if _, err := c.CreateDatabase(ctx, "chaos"); err != nil {
		t.Fatal(err)
	}

	t.Run("a cut PostgreSQL path hangs while the direct one and other clients' work, and heals", func(t *testing.T) {
		held := connect(ctx, t, c.ClientDSN("r1", "chaos"))
		defer held.Close(context.Background())
		c.CutPostgres("r1")
		if err := query(ctx, held, time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a query on a connection held through the cut path: %v, want a timeout", err)
		}
		if err := connectQuery(ctx, c.ClientDSN("r1", "chaos"), time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a new connection through the cut path: %v, want a timeout", err)
		}
		for _, dsn := range []string{c.DSN("chaos"), c.ClientDSN("r2", "chaos")} {
			if err := connectQuery(ctx, dsn, 5*time.Second); err != nil {
				t.Fatalf("%s during r1's cut: %v", dsn, err)
			}
		}
		c.HealPostgres("r1")
		if err := connectQuery(ctx, c.ClientDSN("r1", "chaos"), 5*time.Second); err != nil {
			t.Fatalf("after the heal: %v", err)
		}
	})

	t.Run("the leader lock's path is cut alone, a cut PostgreSQL path cuts it too", func(t *testing.T) {
		lock := connect(ctx, t, c.ClientLeaderDSN("r1", "chaos"))
		defer lock.Close(context.Background())
		c.CutLeaderLock("r1")
		defer c.HealLeaderLock("r1")
		if err := query(ctx, lock, time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the lock session through its cut path: %v, want a timeout", err)
		}
		if err := connectQuery(ctx, c.ClientDSN("r1", "chaos"), 5*time.Second); err != nil {
			t.Fatalf("r1's other PostgreSQL path during the lock's cut: %v", err)
		}
		c.HealLeaderLock("r1")
		if err := connectQuery(ctx, c.ClientLeaderDSN("r1", "chaos"), 5*time.Second); err != nil {
			t.Fatalf("the lock's path after the heal: %v", err)
		}
		c.CutPostgres("r1")
		defer c.HealPostgres("r1")
		if err := connectQuery(ctx, c.ClientLeaderDSN("r1", "chaos"), time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the lock's path during a cut of r1's PostgreSQL: %v, want a timeout", err)
		}
		c.HealPostgres("r1")
	})

	t.Run("with PostgreSQL's replies cut a statement is applied and its answer lost", func(t *testing.T) {
		conn := connect(ctx, t, c.ClientDSN("r1", "chaos"))
		defer conn.Close(context.Background())
		c.CutPostgresReplies("r1")
		defer c.HealPostgres("r1")
		qctx, qcancel := context.WithTimeout(ctx, time.Second)
		_, err := conn.Exec(qctx, "CREATE TABLE applied_unanswered (id int)")
		qcancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a statement with the replies cut: %v, want a timeout", err)
		}
		direct := connect(ctx, t, c.DSN("chaos"))
		defer direct.Close(context.Background())
		var exists bool
		if err := direct.QueryRow(ctx, "SELECT to_regclass('applied_unanswered') IS NOT NULL").Scan(&exists); err != nil || !exists {
			t.Fatalf("the table created with the replies cut: exists %v (%v), want it there", exists, err)
		}
		c.HealPostgres("r1")
		if err := connectQuery(ctx, c.ClientDSN("r1", "chaos"), 5*time.Second); err != nil {
			t.Fatalf("after the heal: %v", err)
		}
	})

	if err := c.Kafka().CreateTopic(ctx, "chaos", 1); err != nil {
		t.Fatal(err)
	}
	t.Run("a cut Kafka path hangs metadata, produce and fetch, and heals", func(t *testing.T) {
		roundTrip(ctx, t, c.ClientBrokers("r1"), "before")
		c.CutKafka("r1")
		for _, addr := range strings.Split(c.ClientBrokers("r1"), ",") {
			dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := kafka.DialLeader(dctx, "tcp", addr, "chaos", 0)
			dcancel()
			if err == nil {
				t.Fatalf("dialled the leader through the cut path %s", addr)
			}
		}
		roundTrip(ctx, t, c.ClientBrokers("r2"), "r2 during r1's cut")
		c.HealKafka("r1")
		roundTrip(ctx, t, c.ClientBrokers("r1"), "after")
	})

	t.Run("with the broker's replies cut a produce is appended and its acknowledgement lost", func(t *testing.T) {
		conn, err := kafka.DialLeader(ctx, "tcp", strings.Split(c.ClientBrokers("r1"), ",")[0], "chaos", 0)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// The connection learns the broker's API versions with its first request.
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.WriteMessages(kafka.Message{Value: []byte("acknowledged")}); err != nil {
			t.Fatal(err)
		}
		c.CutKafkaReplies("r1")
		defer c.HealKafka("r1")
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.WriteMessages(kafka.Message{Value: []byte("unacknowledged")}); !isTimeout(err) {
			t.Fatalf("a produce with the replies cut: %v, want a timeout", err)
		}
		direct, err := kafka.DialLeader(ctx, "tcp", c.Kafka().Brokers(), "chaos", 0)
		if err != nil {
			t.Fatal(err)
		}
		defer direct.Close()
		_ = direct.SetDeadline(time.Now().Add(10 * time.Second))
		last, err := direct.ReadLastOffset()
		if err == nil {
			_, err = direct.Seek(last-1, kafka.SeekAbsolute)
		}
		var m kafka.Message
		if err == nil {
			m, err = direct.ReadMessage(1 << 20)
		}
		if err != nil || string(m.Value) != "unacknowledged" {
			t.Fatalf("the last record on the broker: %q (%v), want the unacknowledged one", m.Value, err)
		}
		c.HealKafka("r1")
		roundTrip(ctx, t, c.ClientBrokers("r1"), "after the replies' heal")
	})

	t.Run("node 1 stops and starts, pauses and resumes", func(t *testing.T) {
		start := time.Now()
		if err := c.StopBroker(ctx); err != nil {
			t.Fatal(err)
		}
		if c.Kafka().Running() {
			t.Fatal("broker still running after StopBroker")
		}
		if err := c.StartBroker(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("broker stopped and started in %v", time.Since(start).Round(time.Millisecond))
		roundTrip(ctx, t, c.ClientBrokers("r1"), "after the restart")
		if err := c.PauseBroker(); err != nil {
			t.Fatal(err)
		}
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		_, err := kafka.DialLeader(dctx, "tcp", c.Kafka().Brokers(), "chaos", 0)
		dcancel()
		if err == nil {
			for _, pid := range processesUnder(c.Kafka().Dir()) {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				t.Logf("%d: %.80s", pid, b) // the state: T when stopped
			}
			t.Fatal("a paused broker answered")
		}
		if err := c.ResumeBroker(); err != nil {
			t.Fatal(err)
		}
		roundTrip(ctx, t, c.Brokers(), "after the pause")
	})
	brokerFaults(ctx, t, c)

	t.Run("PostgreSQL restarts fast and immediately, and the standby streams again", func(t *testing.T) {
		for _, immediate := range []bool{false, true} {
			start := time.Now()
			if err := c.RestartPostgres(ctx, immediate); err != nil {
				t.Fatal(err)
			}
			t.Logf("restart (immediate %v) took %v", immediate, time.Since(start).Round(time.Millisecond))
			if err := connectQuery(ctx, c.DSN("chaos"), 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := waitStreaming(ctx, c.Primary(), c.standbySlot); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("the standby stops and starts, its replay is delayed and caught up, and the primary freezes and thaws", func(t *testing.T) {
		if err := c.Primary().Exec(ctx, "chaos", "CREATE TABLE lagging (id int)"); err != nil {
			t.Fatal(err)
		}
		if err := c.StopStandby(ctx); err != nil {
			t.Fatal(err)
		}
		if c.Standby().Running() {
			t.Fatal("the standby still runs after StopStandby")
		}
		if err := connectQuery(ctx, c.DSN("chaos"), 5*time.Second); err != nil {
			t.Fatalf("the primary while the standby is away: %v", err)
		}
		if err := c.StartStandby(ctx); err != nil {
			t.Fatal(err)
		}

		if err := c.DelayStandby(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := c.Primary().Exec(ctx, "chaos", "INSERT INTO lagging VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		standby := connect(ctx, t, c.Standby().DSN("chaos"))
		defer standby.Close(context.Background())
		rows := func() int {
			var n int
			if err := standby.QueryRow(ctx, "SELECT count(*) FROM lagging").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		// The standby receives and flushes the commit at once, and only its replay waits.
		var commit int64
		primary := connect(ctx, t, c.DSN("chaos"))
		err := primary.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::bigint").Scan(&commit)
		primary.Close(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		defer rcancel()
		if err := poll(rctx, 100*time.Millisecond, func(ctx context.Context) (bool, error) {
			var received int64
			err := standby.QueryRow(ctx, "SELECT coalesce((pg_last_wal_receive_lsn() - '0/0')::bigint, 0)").Scan(&received)
			return received >= commit, err
		}); err != nil {
			t.Fatalf("the delayed standby did not receive the commit: %v", err)
		}
		if n := rows(); n != 0 {
			t.Fatalf("the delayed standby shows %d rows it received, want 0 until the delay ends", n)
		}
		if err := c.DelayStandby(ctx, 0); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := poll(wctx, 100*time.Millisecond, func(context.Context) (bool, error) { return rows() == 1, nil }); err != nil {
			t.Fatalf("the standby did not replay the row once the delay was reset: %v", err)
		}

		if err := c.FreezePrimary(); err != nil {
			t.Fatal(err)
		}
		err = connectQuery(ctx, c.Primary().DSN("chaos"), time.Second)
		if terr := c.ThawPrimary(); terr != nil {
			t.Fatal(terr)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a frozen primary answered: %v, want a timeout", err)
		}
		if err := connectQuery(ctx, c.Primary().DSN("chaos"), 5*time.Second); err != nil {
			t.Fatalf("the thawed primary: %v", err)
		}
	})

	t.Run("max_slot_wal_keep_size invalidates the slot left behind, and no other", func(t *testing.T) {
		for _, sql := range []string{
			"SELECT pg_create_logical_replication_slot('left_behind', 'pgoutput')",
			// Two segments later: a slot whose relay keeps up.
			"SELECT pg_logical_emit_message(false, 'test', ''), pg_switch_wal()",
			"SELECT pg_logical_emit_message(false, 'test', ''), pg_switch_wal()",
			"SELECT pg_create_logical_replication_slot('kept_up', 'pgoutput')",
		} {
			if err := c.Primary().Exec(ctx, "chaos", sql); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if _, err := c.InvalidateSlot(ctx, "chaos", "left_behind"); err != nil {
			t.Fatal(err)
		}
		t.Logf("invalidated in %v", time.Since(start).Round(time.Millisecond))
		conn := connect(ctx, t, c.DSN("chaos"))
		defer conn.Close(context.Background())
		rows, err := conn.Query(ctx, "SELECT slot_name, coalesce(wal_status, ''), coalesce(invalidation_reason, '') FROM pg_replication_slots ORDER BY 1")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for rows.Next() {
			var name, status, reason string
			if err := rows.Scan(&name, &status, &reason); err != nil {
				t.Fatal(err)
			}
			got[name] = status + " " + reason
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		for name, state := range got {
			want := name == "left_behind"
			if lost := strings.HasPrefix(state, "lost"); lost != want {
				t.Errorf("slot %s: %q, lost %v, want %v", name, state, lost, want)
			}
		}
		if got["left_behind"] != "lost wal_removed" {
			t.Errorf("left_behind: %q, want lost wal_removed", got["left_behind"])
		}
		var setting string
		if err := conn.QueryRow(ctx, "SHOW max_slot_wal_keep_size").Scan(&setting); err != nil || setting != "-1" {
			t.Errorf("max_slot_wal_keep_size after the fault: %q (%v), want -1", setting, err)
		}
		// The standby's own slot kept its WAL: it still streams.
		if err := waitStreaming(ctx, c.Primary(), c.standbySlot); err != nil {
			t.Fatal(err)
		}
		for _, slot := range []string{"left_behind", "kept_up"} {
			if err := c.Primary().Exec(ctx, "chaos", "SELECT pg_drop_replication_slot('"+slot+"')"); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("no failover while the standby's copy of a failover slot is temporary", func(t *testing.T) {
		primary, standby := c.Primary(), c.Standby()
		slot := testenv.TemporaryFailoverCopy(t, primary, standby, "chaos", "unready")
		c.readyTimeout = 3 * time.Second
		_, err := c.Failover(ctx, true)
		c.readyTimeout = defaultReadyTimeout
		if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), slot) {
			t.Fatalf("Failover: %v, want ErrNotReady naming %s", err, slot)
		}
		t.Log(err)
		if c.Primary() != primary || c.Standby() != standby || !primary.Running() {
			t.Fatal("the servers changed after a refused failover")
		}
		if err := primary.Exec(ctx, "chaos", fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", slot)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("two failovers in a row keep the failover slot and the two ports", func(t *testing.T) {
		if err := c.Primary().Exec(ctx, "chaos", "SELECT pg_create_logical_replication_slot('relay', 'pgoutput', false, false, true)"); err != nil {
			t.Fatal(err)
		}
		ports := map[int]bool{c.Primary().Port(): true, c.Standby().Port(): true}
		for i, synchronized := range []bool{true, false} {
			old, standby := c.Primary(), c.Standby()
			persist(ctx, t, old, standby, "chaos", "relay")
			res, err := c.Failover(ctx, synchronized)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("failover %d (synchronized %v, set %v before the kill): promoted %v after the kill, new standby %v later",
				i+1, synchronized, res.Killed.Sub(res.SynchronizedSince).Round(time.Millisecond),
				res.Promoted.Sub(res.Killed).Round(time.Millisecond), res.NewStandbyReady.Sub(res.Promoted).Round(time.Millisecond))
			if c.Primary() != standby || c.Standby() == nil || c.Standby().Port() != old.Port() {
				t.Fatalf("after failover %d: primary %s, standby %v, want %s and a standby on port %d", i+1,
					c.Primary().Dir(), c.Standby(), standby.Dir(), old.Port())
			}
			if pids := processesUnder(old.Dir()); len(pids) > 0 {
				t.Fatalf("the old primary's processes %v still run", pids)
			}
			if _, err := os.Stat(old.Dir()); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the old primary's directory is still there (%v)", err)
			}
			conn := connect(ctx, t, c.DSN("chaos"))
			var recovery bool
			var port, slots int
			err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), current_setting('port')::int, (SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'relay' AND failover)").Scan(&recovery, &port, &slots)
			conn.Close(context.Background())
			if err != nil || recovery || port != standby.Port() || slots != 1 {
				t.Fatalf("DSN after failover %d: in recovery %v, port %d, %d slots relay (%v); want the promoted server on %d with the slot", i+1, recovery, port, slots, err, standby.Port())
			}
			if err := connectQuery(ctx, c.ClientDSN("r2", "chaos"), 10*time.Second); err != nil {
				t.Fatalf("ClientDSN after failover %d: %v", i+1, err)
			}
			sconn := connect(ctx, t, c.Standby().DSN("chaos"))
			err = sconn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery)
			sconn.Close(context.Background())
			if err != nil || !recovery {
				t.Fatalf("new standby: in recovery %v (%v)", recovery, err)
			}
			if !ports[c.Standby().Port()] || !ports[c.Primary().Port()] {
				t.Fatalf("ports moved: primary %d, standby %d, want %v", c.Primary().Port(), c.Standby().Port(), ports)
			}
		}
	})

	t.Run("a slot is lost under its walsender once the ledger holds a horizon, and its recovery is waited for", func(t *testing.T) {
		const slot = "lose_me"
		for _, sql := range []string{
			// The relay's ledger, as migrations 0002, 0007 and 0008 leave it, in the columns read.
			`CREATE TABLE public.outbox_relay_slots (slot text PRIMARY KEY, confirmed_xmin xid8, recovery_since timestamptz,
				recovered_at timestamptz, recovered_events bigint, recovered_rule text)`,
			"INSERT INTO public.outbox_relay_slots (slot) VALUES ('" + slot + "')",
			"CREATE PUBLICATION " + slot,
			"SELECT pg_create_logical_replication_slot('" + slot + "', 'pgoutput')",
		} {
			if err := c.Primary().Exec(ctx, "chaos", sql); err != nil {
				t.Fatal(err)
			}
		}
		repl, err := pgconn.Connect(ctx, c.Primary().DSN("chaos")+"&replication=database")
		if err != nil {
			t.Fatal(err)
		}
		defer repl.Close(context.Background())
		if err := pglogrepl.StartReplication(ctx, repl, slot, 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names '" + slot + "'"}}); err != nil {
			t.Fatal(err)
		}
		if err := waitStreaming(ctx, c.Primary(), slot); err != nil {
			t.Fatal(err)
		}

		// Without a horizon a recovery would stop the relay: nothing is done.
		if _, err := c.LoseSlot(ctx, "chaos", slot); !errors.Is(err, ErrNoHorizon) {
			t.Fatalf("LoseSlot without a horizon: %v, want ErrNoHorizon", err)
		}
		if _, _, err := c.SlotSample(ctx, "chaos", slot); err != nil {
			t.Fatalf("the slot after a refused LoseSlot: %v", err)
		}
		if err := c.Primary().Exec(ctx, "chaos", "UPDATE public.outbox_relay_slots SET confirmed_xmin = pg_current_xact_id(), recovered_at = now() - interval '1 hour', recovered_rule = 'xmin'"); err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		lost, err := c.LoseSlot(ctx, "chaos", slot)
		if err != nil {
			t.Fatal(err)
		}
		if lost.Before(before) {
			t.Errorf("LoseSlot says its drop began at %v, before it was called at %v", lost, before)
		}
		if _, _, err := c.SlotSample(ctx, "chaos", slot); !errors.Is(err, ErrNoSlot) {
			t.Fatalf("the slot after LoseSlot: %v, want ErrNoSlot", err)
		}

		// The earlier recovery in the ledger is not this one.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = c.WaitSlotRecovered(wctx, "chaos", slot, lost)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitSlotRecovered before a recovery: %v, want the deadline", err)
		}
		if err := c.Primary().Exec(ctx, "chaos", "UPDATE public.outbox_relay_slots SET recovered_at = now(), recovered_events = 42"); err != nil {
			t.Fatal(err)
		}
		rec, err := c.WaitSlotRecovered(ctx, "chaos", slot, lost)
		if err != nil || rec.Events != 42 || rec.Rule != "xmin" {
			t.Fatalf("WaitSlotRecovered: %+v, %v; want 42 events by rule xmin", rec, err)
		}
	})

	confirmed, walEnd, err := c.SlotSample(ctx, "chaos", "relay")
	if err != nil || confirmed == 0 || confirmed > walEnd {
		t.Fatalf("SlotSample: confirmed %d, WAL end %d (%v)", confirmed, walEnd, err)
	}
	if _, _, err := c.SlotSample(ctx, "chaos", "none"); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("SlotSample of a missing slot: %v, want ErrNoSlot", err)
	}
	if err := c.Primary().Exec(ctx, "chaos", "CREATE TABLE outbox (id int)"); err != nil {
		t.Fatal(err)
	}
	if err := c.AddColumn(ctx, "chaos", "public.outbox", "extra"); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	closed = true
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(start).Round(time.Millisecond))
	if pids := processesUnder(dir); len(pids) > 0 {
		t.Fatalf("processes %v still run after Close", pids)
	}
}

// A Start whose context ends stops what it started, whichever server was up when it ended. The
// context ends from the log hook, at a step of the start, not after a time: a timer raced the
// machine's speed (a fast run had both servers up within 3 s).
func TestStartCancelledLeavesNothingRunning(t *testing.T) {
	for _, tc := range []struct {
		name string
		when string // the log line's prefix after which ctx ends
	}{
		// No comma in a name: t.TempDir's path holds it, and Kafka's log.dirs would split it.
		{"the primary is up and the standby and the broker not yet", "postgres "},
		{"the broker is up", "kafka on "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var seen atomic.Bool
			logf := func(format string, args ...any) {
				t.Logf(format, args...)
				if strings.HasPrefix(format, tc.when) {
					seen.Store(true)
					cancel()
				}
			}
			c, err := Start(ctx, Options{Dir: dir, Standby: true, Clients: []string{"r1"}, Log: logf})
			if err == nil {
				c.Close(context.Background())
				t.Fatal("Start succeeded after its context ended")
			}
			if !seen.Load() {
				t.Fatalf("Start failed before the step that ends its context: %v", err)
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Start: %v, want context.Canceled", err)
			}
			if pids := processesUnder(dir); len(pids) > 0 {
				t.Fatalf("processes %v still run after a failed Start", pids)
			}
		})
	}
}

func connect(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func query(ctx context.Context, conn *pgx.Conn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

func connectQuery(ctx context.Context, dsn string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return query(ctx, conn, timeout)
}

// roundTrip produces a record through brokers (comma-separated) and fetches it back from the
// partition leader the metadata names, which must be one of brokers itself (the client's proxies,
// or the brokers).
func roundTrip(ctx context.Context, t *testing.T, brokers, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var conn *kafka.Conn
	var err error
	addrs := strings.Split(brokers, ",")
	for i := 0; conn == nil; i++ {
		// Through each bootstrap address in turn: one may be a stopped broker's.
		dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
		conn, err = kafka.DialLeader(dctx, "tcp", addrs[i%len(addrs)], "chaos", 0)
		dcancel()
		if err == nil {
			if !slices.Contains(addrs, conn.RemoteAddr().String()) {
				t.Fatalf("the leader is %s, want one of %s", conn.RemoteAddr(), brokers)
			}
			deadline, _ := ctx.Deadline()
			_ = conn.SetDeadline(deadline)
			_, err = conn.WriteMessages(kafka.Message{Value: []byte(value)})
			var kerr kafka.Error
			if errors.As(err, &kerr) && kerr.Temporary() {
				// The metadata named a leader the partition has not settled on yet (a topic just
				// created, brokers just joined): ask again.
				conn.Close()
				conn = nil
			} else if err != nil {
				t.Fatalf("produce through %s: %v", brokers, err)
			}
		}
		if conn == nil {
			if ctx.Err() != nil {
				t.Fatalf("dial leader and produce through %s: %v", brokers, err)
			}
			time.Sleep(200 * time.Millisecond) // a restarted broker's leadership comes a moment later
		}
	}
	defer conn.Close()
	last, err := conn.ReadLastOffset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Seek(last-1, kafka.SeekAbsolute); err != nil {
		t.Fatal(err)
	}
	m, err := conn.ReadMessage(1 << 20)
	if err != nil || string(m.Value) != value {
		t.Fatalf("fetch through %s: %q (%v), want %q", brokers, m.Value, err, value)
	}
}

// persist nudges primary's failover slot until standby holds a persisted copy of it: nothing
// streams from the slot here, so nothing else would move it past the standby's catalog xmin.
func persist(ctx context.Context, t *testing.T, primary, standby *devenv.Postgres, database, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := poll(ctx, 500*time.Millisecond, func(ctx context.Context) (bool, error) {
		if err := testenv.NudgeSlotSync(ctx, primary, standby, database, slot); err != nil {
			return false, err
		}
		conn, err := pgx.Connect(ctx, standby.DSN(database))
		if err != nil {
			return false, err
		}
		defer conn.Close(context.Background())
		var persisted bool
		err = conn.QueryRow(ctx, "SELECT coalesce(bool_or(NOT temporary), false) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&persisted)
		return persisted, err
	})
	if err != nil {
		t.Fatalf("the standby's copy of %s was not persisted: %v", slot, err)
	}
}

// processesUnder returns the live processes whose command line names a path under dir.
func processesUnder(dir string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), dir) && devenv.PIDAlive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
