package chaos

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// fakeRelay is a stand-in for the relay binary: it does what the file named by CHAOS_TEST_MODE
// says, so one relay entry runs processes that end in every way the harness must tell apart.
const fakeRelay = `#!/bin/sh
case "$(cat "$CHAOS_TEST_MODE")" in
panic) echo '{"level":"error","msg":"about to fail"}'; echo 'panic: boom'; echo 'goroutine 1 [running]:'; exit 2;;
own) echo '{"level":"error","msg":"slot gone"}'; echo 'outbox-relay: replication slot lost: slot "s" has wal_status "lost"' >&2; exit 1;;
race) trap 'exit 0' TERM; echo '=================='; echo 'WARNING: DATA RACE'; echo 'ready'; while :; do sleep 0.05; done;;
*) trap 'exit 0' TERM; echo 'ready'; while :; do sleep 0.05; done;;
esac
`

// TestEveryExitIsRecordedWithItsCauseAndItsOwnOutput runs processes that end of their own accord
// (with a panic, with an error), by SIGTERM and by SIGKILL, one after the other under one relay,
// and checks each exit's cause, status, last error and crash line, taken from its own output only
// (an earlier process's panic is not the next one's).
func TestEveryExitIsRecordedWithItsCauseAndItsOwnOutput(t *testing.T) {
	dir := t.TempDir()
	bin, mode := filepath.Join(dir, "relay.sh"), filepath.Join(dir, "mode")
	if err := os.WriteFile(bin, []byte(fakeRelay), 0o755); err != nil {
		t.Fatal(err)
	}
	rl, err := newRelay("m-r1", bin, nil, []string{"CHAOS_TEST_MODE=" + mode}, filepath.Join(dir, "r1.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := func(m string, end func()) history.Exit {
		t.Helper()
		if err := os.WriteFile(mode, []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := rl.start(); err != nil {
			t.Fatal(err)
		}
		if end != nil {
			// The process is up once its output says so.
			for !strings.HasSuffix(strings.TrimSpace(rl.output(rl.logStart)), "ready") {
				if ctx.Err() != nil || !rl.Running() {
					t.Fatalf("%s: the process never said it was ready", m)
				}
				sleep(ctx, 10*time.Millisecond)
			}
			end()
		}
		if _, err := rl.wait(ctx); err != nil {
			t.Fatal(err)
		}
		exits := rl.takeExits()
		if len(exits) != 1 {
			t.Fatalf("%s: %d exits recorded, want 1: %+v", m, len(exits), exits)
		}
		return exits[0]
	}
	terminate := func() {
		if _, exited, code, err := rl.terminate(ctx, 10*time.Second); err != nil || exited.IsZero() || code != 0 {
			t.Errorf("terminate: exited %v, code %d, err %v", exited, code, err)
		}
	}
	kill := func() {
		if err := rl.kill(ctx); err != nil {
			t.Error(err)
		}
	}
	for _, tc := range []struct {
		mode string
		end  func()
		want history.Exit
	}{
		{mode: "panic", want: history.Exit{Cause: history.ExitOwn, Code: 2, LastError: `{"level":"error","msg":"about to fail"}`, Crash: "panic: boom"}},
		{mode: "sigterm", end: terminate, want: history.Exit{Cause: history.ExitSigterm, Code: 0}},
		{mode: "race", end: kill, want: history.Exit{Cause: history.ExitSigkill, Code: -9, Crash: "WARNING: DATA RACE"}},
		{mode: "own", want: history.Exit{Cause: history.ExitOwn, Code: 1, LastError: `outbox-relay: replication slot lost: slot "s" has wal_status "lost"`}},
	} {
		got := run(tc.mode, tc.end)
		if got.Relay != "m-r1" || got.At.IsZero() {
			t.Errorf("%s: exit of %q at %v", tc.mode, got.Relay, got.At)
		}
		got.Relay, got.At = "", time.Time{}
		if got != tc.want {
			t.Errorf("%s: recorded %+v\nwant %+v", tc.mode, got, tc.want)
		}
	}
	if n := rl.takeOwnExits(); n != 2 {
		t.Errorf("%d exits of the relay's own accord counted, want 2", n)
	}
}

// A relay runs in a process group of its own: in the harness's, a relay stopped by the pause
// fault was ended by the kernel's SIGHUP to an orphaned process group with a stopped member.
func TestARelayRunsInAProcessGroupOfItsOwn(t *testing.T) {
	dir := t.TempDir()
	bin, mode := filepath.Join(dir, "relay.sh"), filepath.Join(dir, "mode")
	if err := os.WriteFile(bin, []byte(fakeRelay), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mode, []byte("wait"), 0o644); err != nil {
		t.Fatal(err)
	}
	rl, err := newRelay("m-r1", bin, nil, []string{"CHAOS_TEST_MODE=" + mode}, filepath.Join(dir, "r1.log"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer rl.kill(ctx)
	pgid, err := syscall.Getpgid(rl.pid())
	if err != nil {
		t.Fatal(err)
	}
	if pgid != rl.pid() || pgid == syscall.Getpgrp() {
		t.Fatalf("the relay (pid %d) runs in process group %d, the harness's is %d: want a group of its own", rl.pid(), pgid, syscall.Getpgrp())
	}
}
