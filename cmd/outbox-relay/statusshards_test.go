package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Status given one --config per shard (docs/scaling.md) reports every shard under its file's name
// and exits with the worst shard's code: one missing slot among healthy ones is exit 3.
func TestStatusOverSeveralShardsReportsEachAndExitsWithTheWorst(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), "unused:9092", 1)
	if _, err := f.pool.Exec(context.Background(), "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", f.slot) })
	missing := "missing_" + f.slot[len(f.slot)-8:] // slot names stop at 63 characters
	dir := t.TempDir()
	var configs []string
	for i, slot := range []string{f.slot, missing} {
		file := filepath.Join(dir, fmt.Sprintf("shard-%d.yaml", i))
		if err := os.WriteFile(file, fmt.Appendf(nil, "pg_dsn: %q\nslot: %s\n", f.dsn, slot), 0o600); err != nil {
			t.Fatal(err)
		}
		configs = append(configs, file)
	}
	status := func(args ...string) (int, string) {
		code, out := relayproc.Run(t, relayproc.Options{Subcommand: "status", Args: append([]string{"--config", configs[0], "--config=" + configs[1]}, args...),
			Env: map[string]string{"GORACE": "atexit_sleep_ms=0"}}, 30*time.Second)
		if strings.Contains(out, devenvPGPassword) {
			t.Errorf("status output reveals the password:\n%s", out)
		}
		return code, out
	}

	code, out := status()
	if code != exitSlotProblem {
		t.Errorf("status over a healthy and a missing slot: exit code %d, want %d:\n%s", code, exitSlotProblem, out)
	}
	for _, want := range []string{"== " + configs[0] + " (exit 0)", "== " + configs[1] + " (exit 3)",
		fmt.Sprintf("PROBLEM: replication slot %q does not exist", missing)} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}

	code, out = status("--json")
	if code != exitSlotProblem {
		t.Errorf("status --json over a healthy and a missing slot: exit code %d, want %d", code, exitSlotProblem)
	}
	var shards []struct {
		Config   string     `json:"config"`
		ExitCode int        `json:"exit_code"`
		Report   statusJSON `json:"report"`
	}
	if err := json.Unmarshal([]byte(out), &shards); err != nil {
		t.Fatalf("status --json over shards is not a JSON array (%v):\n%s", err, out)
	}
	if len(shards) != 2 ||
		shards[0].Config != configs[0] || shards[0].ExitCode != 0 || shards[0].Report.Slot != f.slot || !shards[0].Report.Exists ||
		shards[1].Config != configs[1] || shards[1].ExitCode != exitSlotProblem || shards[1].Report.Slot != missing || shards[1].Report.Exists {
		t.Errorf("status --json over shards = %+v", shards)
	}
}
