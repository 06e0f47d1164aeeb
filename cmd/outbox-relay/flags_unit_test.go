package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/config"
)

// TestEachCommandsHelpListsTheKeysItUses: -h of every command exits 0 and lists its own keys and no
// other; run lists them all.
func TestEachCommandsHelpListsTheKeysItUses(t *testing.T) {
	all := config.Keys()
	for _, tc := range []struct {
		command      string
		has, hasNot  []string
		allKeysShown bool
	}{
		{command: "run", allKeysShown: true},
		{command: "migrate", has: []string{"--pg-dsn", "--table", "--publication", "--source"}, hasNot: []string{"--kafka-brokers", "--delivery", "--topic-template"}},
		{command: "status", has: []string{"--slot", "--kafka-brokers", "--positions-topic", "--json", "--standby-dsn"}, hasNot: []string{"--topic-template", "--kafka.linger"}},
		{command: "forget-slot", has: []string{"--slot"}, hasNot: []string{"--kafka-brokers", "--table-"}},
		{command: "prune", has: []string{"--older-than", "--prune-older-than", "--on-slot-lost", "--slot-recovery-margin"}, hasNot: []string{"--kafka-brokers"}},
		{command: "replay", has: []string{"--event-id", "--kafka-brokers", "--topic-template", "--value-encoding", "--on-failure"}, hasNot: []string{"--slot", "--leader-election", "--delivery"}},
		{command: "redrive", has: []string{"--dead-letter-topic", "--kafka-brokers", "--dry-run", "--topic-template", "--topic-allow", "--positions-topic"}, hasNot: []string{"--pg-dsn"}},
		{command: "retry", has: []string{"--ids", "--dead-letters", "--source", "--columns.id", "--profile"}, hasNot: []string{"--kafka-brokers", "--slot"}},
	} {
		t.Run(tc.command, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), []string{tc.command, "-h"}, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d:\n%s", code, stderr.String())
			}
			help := stderr.String()
			if !strings.Contains(help, "Usage: outbox-relay "+tc.command+" [flags]\n\n"+about[tc.command]) {
				t.Errorf("help does not begin with the usage line and what the command does:\n%s", help)
			}
			flagLine := func(f string) bool {
				return strings.Contains(help, "\n  "+f+"\n") || strings.Contains(help, "\n  "+f+" ")
			}
			for _, f := range tc.has {
				if !flagLine(f) {
					t.Errorf("help lacks %s:\n%s", f, help)
				}
			}
			for _, f := range tc.hasNot {
				if flagLine(f) {
					t.Errorf("help lists %s, which the command does not use", f)
				}
			}
			if tc.allKeysShown {
				for _, k := range all {
					if !flagLine(k.Flag()) {
						t.Errorf("run's help lacks %s", k.Flag())
					}
				}
			}
		})
	}
}

// TestAMistakeOnTheCommandLineIsOneLine: a mistake is one line that says what is wrong, not the
// whole help.
func TestAMistakeOnTheCommandLineIsOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"prune", "--olderthan=1h"}, "outbox-relay prune: unknown flag --olderthan\nRun 'outbox-relay prune -h' for its flags.\n"},
		{[]string{"status", "extra"}, "outbox-relay status: unexpected argument \"extra\"\n"},
		{[]string{"migrate", "--create-slot", "false"}, "outbox-relay migrate: unexpected argument \"false\" (a boolean flag takes its value after =, as in --failover=false)\n"},
		{[]string{"migrate", "--slot"}, "outbox-relay migrate: --slot needs a value\nRun 'outbox-relay migrate -h' for its flags.\n"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != 2 || stderr.String() != tc.want {
			t.Errorf("%v: exit %d, said:\n%s\nwant exit 2 and:\n%s", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// TestTheReferenceNamesTheCommandsWhoseHelpListsAKey: the commands docs/configuration.md gives for
// a key (config.Key.Commands) are exactly those whose -h lists it.
func TestTheReferenceNamesTheCommandsWhoseHelpListsAKey(t *testing.T) {
	for _, command := range config.Commands() {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{command, "-h"}, &stdout, &stderr); code != 0 {
			t.Fatalf("%s -h: exit %d:\n%s", command, code, stderr.String())
		}
		help := stderr.String()
		for _, k := range config.Keys() {
			listed := strings.Contains(help, "\n  "+k.Flag()+"\n") || strings.Contains(help, "\n  "+k.Flag()+" ")
			if said := slices.Contains(k.Commands, command); said != listed {
				t.Errorf("%s: the reference says %s uses it: %v; its -h lists it: %v", k.Name, command, said, listed)
			}
		}
	}
}
