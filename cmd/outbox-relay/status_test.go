package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
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
		"PGPASSWORD": devenvPGPassword, // for a --standby-dsn without one
	}}, 30*time.Second)
	if strings.Contains(out, devenvPGPassword) {
		t.Errorf("status output reveals the password:\n%s", out)
	}
	return code, out
}

// serverMajor returns the major version of the fixture's server.
func (f *haFixture) serverMajor(t *testing.T) int {
	t.Helper()
	var major int
	if err := f.pool.QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int / 10000").Scan(&major); err != nil {
		t.Fatal(err)
	}
	return major
}

// checkVersionedColumns checks that status --json (out) has exactly the slot columns and settings
// that PostgreSQL major has, with the values of a healthy slot that is streamed (active) or not:
// what the server lacks is left out, never filled in.
func checkVersionedColumns(t *testing.T, major int, out string, active bool) {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("status --json output is not JSON (%v):\n%s", err, out)
	}
	for _, c := range []struct {
		key   string
		since int
		ok    func(v any) bool
		want  string
	}{
		{"conflicting", 16, func(v any) bool { return v == false }, "false"},
		{"invalidation_reason", 17, func(v any) bool { return v == nil }, "null"},
		{"inactive_since", 17, func(v any) bool {
			if active {
				return v == nil
			}
			ts, _ := v.(string)
			at, err := time.Parse(time.RFC3339Nano, ts)
			return err == nil && time.Since(at) < time.Hour
		}, map[bool]string{true: "null while streamed", false: "a recent time"}[active]},
		{"idle_replication_slot_timeout_seconds", 18, func(v any) bool { return v == float64(0) }, "0 (the default: off)"},
	} {
		v, present := raw[c.key]
		switch {
		case major < c.since && present:
			t.Errorf("PostgreSQL %d has no %s (from %d), but status --json shows %v", major, c.key, c.since, v)
		case major >= c.since && !present:
			t.Errorf("PostgreSQL %d has %s, but status --json leaves it out", major, c.key)
		case present && !c.ok(v):
			t.Errorf("PostgreSQL %d: status --json %s = %v, want %s", major, c.key, v, c.want)
		}
	}
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

// A streamed slot's status names the walsender and the lock holder, and shows exactly the slot
// columns and settings the suite's version has, while streamed and after.
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
	major := f.serverMajor(t)
	checkVersionedColumns(t, major, out, true)
	r.stop(t)
	// The walsender leaves the slot as it exits, a moment after the relay.
	await.True(t, 30*time.Second, "the slot to be inactive", func() bool {
		var active bool
		err := f.pool.QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&active)
		return err == nil && !active
	})

	code, out = f.status(t, "--json")
	if code != 0 {
		t.Fatalf("status --json of a slot nothing streams: exit code %d, want 0:\n%s", code, out)
	}
	checkVersionedColumns(t, major, out, false)
}

// Status shows exactly the slot columns and settings each supported version has: here those of
// the matrix's versions, for a slot nothing streams (TestStatusOfAStreamedSlotNamesTheStreamerAndTheLeaderLockHolder
// checks the suite's version with a streamed slot and after).
func TestStatusOnEveryPostgresVersion(t *testing.T) {
	for _, v := range testenv.MatrixVersions(t) {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			f := newHAFixture(t, testenv.SharedPostgresVersion(t, v), "unused:9092", 1)
			if _, err := f.pool.Exec(context.Background(), "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
				t.Fatal(err)
			}
			code, out := f.status(t, "--json")
			if code != 0 {
				t.Fatalf("status --json of a healthy slot: exit code %d, want 0:\n%s", code, out)
			}
			checkVersionedColumns(t, f.serverMajor(t), out, false)
		})
	}
}

// A slot whose WAL was removed is a problem on every version: 16 says so only through wal_status
// lost, 17+ also through invalidation_reason wal_removed.
func TestStatusOfASlotThatLostItsWALExits3(t *testing.T) {
	for _, version := range []string{"16", "18"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			// A cluster of its own that keeps at most 1MB of WAL for slots, so a slot nobody reads
			// is invalidated after a few segment switches and a checkpoint.
			pg := testenv.Postgres(t, devenv.PostgresOptions{Version: version, Settings: map[string]string{"max_slot_wal_keep_size": "1MB"}})
			f := newHAFixture(t, pg, "unused:9092", 1)
			ctx := context.Background()
			if _, err := f.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
				t.Fatal(err)
			}
			await.True(t, 30*time.Second, "the slot's wal_status becomes lost", func() bool {
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
			checkInvalidatedStatus(t, f, "lost", "wal_removed", "PostgreSQL removed WAL it still needed")
		})
	}
}

// On PostgreSQL 18 a slot that nothing streamed for longer than idle_replication_slot_timeout is
// invalidated at the next checkpoint; status names the reason and the setting (its wal_status is
// "lost" too, though no WAL was removed).
func TestStatusOfASlotInvalidatedForIdlenessExits3(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t, devenv.PostgresOptions{Version: "18", Settings: map[string]string{"idle_replication_slot_timeout": "1s"}})
	f := newHAFixture(t, pg, "unused:9092", 1)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
		t.Fatal(err)
	}
	code, out := f.status(t)
	if code != 0 || !regexp.MustCompile(`(?m)^idle_replication_slot_timeout\s+1s: a slot inactive for longer is invalidated$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^inactive_since\s+\d{4}-`).MatchString(out) {
		t.Errorf("status of an idle slot before the checkpoint: exit %d, want 0 with the timeout and inactive_since:\n%s", code, out)
	}
	await.True(t, 30*time.Second, "the idle slot to be invalidated", func() bool {
		// The checkpoint invalidates a slot inactive for the timeout's whole seconds by the
		// server's clock: wait for that, as the server reads it.
		await.True(t, 30*time.Second, "the slot to idle for idle_replication_slot_timeout", func() bool {
			var idle bool
			err := f.pool.QueryRow(ctx, "SELECT now() - inactive_since >= current_setting('idle_replication_slot_timeout')::interval FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&idle)
			return err == nil && idle
		})
		if _, err := f.pool.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		var reason *string
		if err := f.pool.QueryRow(ctx, "SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&reason); err != nil {
			t.Fatal(err)
		}
		return reason != nil
	})
	checkInvalidatedStatus(t, f, "lost", "idle_timeout", "nothing streamed it for longer than idle_replication_slot_timeout")
}

// checkInvalidatedStatus checks status and status --json of an invalidated slot: exit 3, the
// wal_status, the reason where the server reports one (17+) and the cause in the problem.
func checkInvalidatedStatus(t *testing.T, f *haFixture, walStatus, reason, cause string) {
	t.Helper()
	major := f.serverMajor(t)
	code, out := f.status(t)
	if code != exitSlotProblem {
		t.Errorf("status exit code %d for an invalidated slot, want %d:\n%s", code, exitSlotProblem, out)
	}
	problem := fmt.Sprintf(`PROBLEM: replication slot "%s" is invalidated (%s): %s`, f.slot, reason, cause)
	if !regexp.MustCompile(`(?m)^wal_status\s+`+walStatus+`$`).MatchString(out) || !strings.Contains(out, problem) {
		t.Errorf("status output of an invalidated slot lacks wal_status %s or %q:\n%s", walStatus, problem, out)
	}
	if got := regexp.MustCompile(`(?m)^invalidation_reason\s+` + reason + `$`).MatchString(out); got != (major >= 17) {
		t.Errorf("PostgreSQL %d: status shows invalidation_reason %s: %v, want %v:\n%s", major, reason, got, major >= 17, out)
	}
	code, out = f.status(t, "--json")
	s := parseStatus(t, out)
	if code != exitSlotProblem || s.WALStatus != walStatus || s.OK == nil || *s.OK || len(s.Problems) != 1 || !strings.Contains(s.Problems[0], cause) {
		t.Errorf("status --json of an invalidated slot: exit %d, %+v", code, s)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	if got, ok := raw["invalidation_reason"]; ok != (major >= 17) || (ok && got != reason) {
		t.Errorf("PostgreSQL %d: status --json invalidation_reason = %v (present: %v), want %q only on 17+", major, got, ok, reason)
	}
}

// standbyJSON is the part of status --json's standbys the tests read.
type standbyJSON struct {
	Synced            bool   `json:"synced"`
	Temporary         bool   `json:"temporary"`
	Persisted         *bool  `json:"persisted"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	TrailBytes        *int64 `json:"trail_bytes"`
	RestartTrailBytes *int64 `json:"restart_trail_bytes"`
}

// status --standby-dsn says whether the standby's copy of the failover slot is persisted, which
// is what a promotion keeps: right after the slot's creation the copy is temporary (PostgreSQL
// keeps it so until the primary's slot passes the standby's catalog xmin, and drops it at
// promotion), a problem with exit 3; once the primary's slot has moved on it is persisted, with
// how far it trails the primary's slot.
func TestStatusWithAStandbySaysWhetherItsCopyIsPersistedAndHowFarItTrails(t *testing.T) {
	ctx := context.Background()
	primary := testenv.Postgres(t, devenv.PostgresOptions{Version: "18"})
	standby := testenv.FailoverStandby(t, primary)
	f := newHAFixture(t, primary, "unused:9092", 1)
	f.slot = testenv.TemporaryFailoverCopy(t, primary, standby, f.dbName, f.slot)
	// Without its password, which status takes from PGPASSWORD (f.status): in the flag it would
	// warn on stderr, which the output holds.
	dsn, _ := testenv.SplitPassword(t, standby.DSN(f.dbName))
	standbyDSN := "--standby-dsn=" + dsn
	copyIs := func(what string) func() bool {
		return func() bool {
			conn, err := pgx.Connect(ctx, standby.DSN("postgres")) // the slots are the cluster's
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var got string
			err = conn.QueryRow(ctx, "SELECT CASE WHEN NOT synced THEN 'unsynced' WHEN temporary THEN 'temporary' ELSE 'persisted' END FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&got)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
			return got == what
		}
	}
	code, out := f.status(t, standbyDSN)
	if code != exitSlotProblem || !regexp.MustCompile(`(?m)^  copy of the slot\s+temporary \(synced true\): not persisted yet, a promotion now drops it`).MatchString(out) ||
		!strings.Contains(out, "is not persisted yet (synced true, temporary true): a promotion now drops it and loses the slot") {
		t.Errorf("status of a temporary copy: exit %d, want %d with the copy temporary and a problem:\n%s", code, exitSlotProblem, out)
	}
	code, out = f.status(t, "--json", standbyDSN)
	var s struct {
		Standbys []standbyJSON `json:"standbys"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if code != exitSlotProblem || len(s.Standbys) != 1 || s.Standbys[0].Persisted == nil || *s.Standbys[0].Persisted || !s.Standbys[0].Temporary {
		t.Errorf("status --json of a temporary copy: exit %d, standbys %+v; want persisted false:\n%s", code, s.Standbys, out)
	}

	await.True(t, 2*time.Minute, "the copy is persisted once the primary's slot moves on", func() bool {
		if err := testenv.NudgeSlotSync(ctx, primary, standby, f.dbName, f.slot); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		return copyIs("persisted")()
	})
	code, out = f.status(t, standbyDSN)
	t.Logf("status:\n%s", out)
	for _, re := range []string{
		`(?m)^standby 127\.0\.0\.1:\d+\s+copy ready for a promotion$`,
		`(?m)^  copy of the slot\s+persisted \(synced, not temporary\): a promotion keeps it$`,
		`(?m)^  copy trails by\s+-?\d+ bytes.* \(primary confirmed [0-9A-F]+/[0-9A-F]+ - copy confirmed [0-9A-F]+/[0-9A-F]+\)$`,
		`(?m)^  copy restart trails by\s+-?\d+ bytes`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status of a persisted copy does not match %s:\n%s", re, out)
		}
	}
	if code != 0 {
		t.Errorf("status of a persisted copy: exit %d, want 0", code)
	}
	code, out = f.status(t, "--json", standbyDSN)
	s.Standbys = nil
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if code != 0 || len(s.Standbys) != 1 || s.Standbys[0].Persisted == nil || !*s.Standbys[0].Persisted || s.Standbys[0].TrailBytes == nil || s.Standbys[0].RestartTrailBytes == nil {
		t.Errorf("status --json of a persisted copy: exit %d, standbys %+v; want persisted with its trail:\n%s", code, s.Standbys, out)
	}
}
