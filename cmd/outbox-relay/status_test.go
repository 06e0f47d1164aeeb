package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// status runs `outbox-relay status` with only the PostgreSQL settings (it needs no broker) and
// returns its exit code and output.
func (f *haFixture) status(t *testing.T, args ...string) (int, string) {
	t.Helper()
	code, out := relayproc.Run(t, relayproc.Options{Subcommand: "status", Args: args, Env: map[string]string{
		"OUTBOX_PG_DSN": f.dsn, "OUTBOX_SLOT": f.slot, "GORACE": "atexit_sleep_ms=0",
	}}, 30*time.Second)
	if strings.Contains(out, devenvPGPassword) {
		t.Errorf("status output reveals the password:\n%s", out)
	}
	return code, out
}

// statusJSON is the part of `status --json` the tests read.
type statusJSON struct {
	Slot              string  `json:"slot"`
	Database          string  `json:"database"`
	Exists            bool    `json:"exists"`
	Active            bool    `json:"active"`
	ActivePID         int32   `json:"active_pid"`
	ActiveApplication string  `json:"active_application_name"`
	WALStatus         string  `json:"wal_status"`
	SafeWALSize       *int64  `json:"safe_wal_size_bytes"`
	LagBytes          *int64  `json:"lag_bytes"`
	RetainedBytes     *int64  `json:"retained_wal_bytes"`
	ConfirmedFlushLSN string  `json:"confirmed_flush_lsn"`
	CurrentWALLSN     string  `json:"current_wal_lsn"`
	LeaderLockKey     int64   `json:"leader_lock_key"`
	Leader            *holder `json:"leader"`
	OK                *bool   `json:"ok"`
	Problems          []string
}

type holder struct {
	PID             int32  `json:"pid"`
	ApplicationName string `json:"application_name"`
	ClientAddr      string `json:"client_addr"`
}

func parseStatus(t *testing.T, out string) statusJSON {
	t.Helper()
	var s statusJSON
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("status --json output is not JSON (%v):\n%s", err, out)
	}
	return s
}

func TestStatusOfAMissingSlotSaysSoAndExits3(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), "unused:9092", 1)

	code, out := f.status(t)
	if code != exitSlotProblem {
		t.Errorf("status exit code %d, want %d", code, exitSlotProblem)
	}
	for _, want := range []string{"slot", f.slot, f.dbName, "exists", "no", "leader lock", "not held",
		fmt.Sprintf("PROBLEM: replication slot %q does not exist", f.slot)} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}

	code, out = f.status(t, "--json")
	if code != exitSlotProblem {
		t.Errorf("status --json exit code %d, want %d", code, exitSlotProblem)
	}
	s := parseStatus(t, out)
	if s.Exists || s.OK == nil || *s.OK || len(s.Problems) != 1 || s.Slot != f.slot || s.Database != f.dbName || s.Leader != nil {
		t.Errorf("status --json of a missing slot = %+v", s)
	}
}

func TestStatusOfAStreamedSlotNamesTheStreamerAndTheLeaderLockHolder(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	r := f.start("relay-s", nil)
	walsender := f.waitStreamer(t, r, haStartTimeout)
	lockPID := f.lockHolder(t)

	code, out := f.status(t)
	if code != 0 {
		t.Fatalf("status exit code %d, want 0:\n%s", code, out)
	}
	t.Logf("status:\n%s", out)
	for _, re := range []string{
		`(?m)^exists\s+yes \(plugin pgoutput\)$`,
		fmt.Sprintf(`(?m)^active\s+yes: backend PID %d, application_name "relay-s", client 127\.0\.0\.1$`, walsender),
		`(?m)^wal_status\s+reserved$`,
		`(?m)^safe_wal_size\s+unlimited`,
		`(?m)^confirmed LSN\s+[0-9A-F]+/[0-9A-F]+$`,
		`(?m)^lag\s+\d+ bytes`,
		`(?m)^retained WAL\s+\d+ bytes`,
		fmt.Sprintf(`(?m)^leader lock\s+held by backend PID %d, application_name "relay-s", client 127\.0\.0\.1, connected since `, lockPID),
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status output does not match %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, "PROBLEM") {
		t.Errorf("status of a healthy slot reports a problem:\n%s", out)
	}

	code, out = f.status(t, "--json")
	if code != 0 {
		t.Fatalf("status --json exit code %d, want 0:\n%s", code, out)
	}
	s := parseStatus(t, out)
	switch {
	case !s.Exists || !s.Active || s.ActivePID != walsender || s.ActiveApplication != "relay-s":
		t.Errorf("slot part of status --json = %+v, want active by %d (relay-s)", s, walsender)
	case s.WALStatus != "reserved" || s.SafeWALSize != nil || s.LagBytes == nil || *s.LagBytes < 0 || s.RetainedBytes == nil:
		t.Errorf("WAL part of status --json = %+v", s)
	case s.ConfirmedFlushLSN == "" || s.CurrentWALLSN == "":
		t.Errorf("LSNs of status --json = %q, %q", s.ConfirmedFlushLSN, s.CurrentWALLSN)
	case s.Leader == nil || s.Leader.PID != lockPID || s.Leader.ApplicationName != "relay-s" || s.Leader.ClientAddr != "127.0.0.1":
		t.Errorf("leader of status --json = %+v, want pid %d", s.Leader, lockPID)
	case s.OK == nil || !*s.OK || len(s.Problems) != 0:
		t.Errorf("status --json of a healthy slot: ok=%v problems=%v", s.OK, s.Problems)
	}
	r.stop(t)
}

func TestStatusOfASlotThatLostItsWALExits3(t *testing.T) {
	// A cluster of its own that keeps at most 1MB of WAL for slots, so a slot nobody reads is
	// invalidated after a few segment switches and a checkpoint.
	pg := testenv.Postgres(t, devenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "1MB"}})
	f := newHAFixture(t, pg, "unused:9092", 1)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the slot's wal_status becomes lost", func() bool {
		for i := range 3 {
			if _, err := f.pool.Exec(ctx, fmt.Sprintf("CREATE TABLE IF NOT EXISTS filler%d AS SELECT 1 AS n; INSERT INTO filler%d VALUES (1); SELECT pg_switch_wal()", i, i)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := f.pool.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		var status *string
		if err := f.pool.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status != nil && *status == "lost"
	})

	code, out := f.status(t)
	if code != exitSlotProblem {
		t.Errorf("status exit code %d for a lost slot, want %d:\n%s", code, exitSlotProblem, out)
	}
	if !regexp.MustCompile(`(?m)^wal_status\s+lost$`).MatchString(out) || !strings.Contains(out, `PROBLEM: replication slot "`+f.slot+`" has wal_status "lost"`) {
		t.Errorf("status output of a lost slot:\n%s", out)
	}
	code, out = f.status(t, "--json")
	s := parseStatus(t, out)
	if code != exitSlotProblem || s.WALStatus != "lost" || s.OK == nil || *s.OK {
		t.Errorf("status --json of a lost slot: exit %d, %+v", code, s)
	}
}
