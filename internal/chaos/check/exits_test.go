package check

import (
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// withEnds adds to a clean history the ends a correct run leaves: the SIGTERM's exit with status
// 0, a kill -9's, an allowed exit of the relay's own accord, content hashes that match, and end
// offsets without an open transaction.
func withEnds(delivery string) *builder {
	b := clean(delivery)
	b.h.Exits = append(b.h.Exits,
		history.Exit{Relay: "r2", At: at(30), Cause: history.ExitSigkill, Code: -9},
		history.Exit{Relay: "r2", At: at(41), Cause: history.ExitSigterm, Code: 0},
		history.Exit{Relay: "r1", At: at(45), Cause: history.ExitOwn, Code: 1,
			LastError: `outbox-relay: replication slot lost: slot "outbox" has wal_status "lost": PostgreSQL removed WAL it still needed`},
	)
	for i := range b.h.Txns {
		for j := range b.h.Txns[i].Events {
			b.h.Txns[i].Events[j].Hash = "h-" + b.h.Txns[i].Events[j].ID
		}
	}
	for i := range b.log {
		b.log[i].Hash = "h-" + b.log[i].EventID
	}
	b.h.EndOffsets = []history.EndOffset{
		{Topic: "orders", Partition: 0, LastStable: 7, HighWatermark: 7},
		{Topic: "__outbox_relay_positions", Partition: 3, LastStable: 40, HighWatermark: 40},
	}
	return b
}

func TestExitsContentAndEndOffsets(t *testing.T) {
	tests := []struct {
		name   string
		change func(b *builder)
		rule   string // "" for none
		says   string
	}{
		{name: "a correct run's ends break no rule"},
		{
			name: "a relay that ends of its own accord with an error off the allowlist fails the run",
			change: func(b *builder) {
				b.h.Exits = append(b.h.Exits, history.Exit{Relay: "r1", At: at(50), Cause: history.ExitOwn, Code: 1,
					LastError: `outbox-relay: replication slot "outbox" does not exist: check the slot and publication settings`})
			},
			rule: RuleExit, says: `relay r1 ended of its own accord (exit 1), not on the allowlist: outbox-relay: replication slot "outbox" does not exist`,
		},
		{
			name: "a relay that ends of its own accord without a word fails the run",
			change: func(b *builder) {
				b.h.Exits = append(b.h.Exits, history.Exit{Relay: "r1", At: at(50), Cause: history.ExitOwn, Code: 0})
			},
			rule: RuleExit, says: "relay r1 ended of its own accord (exit 0), not on the allowlist: no error line in its output",
		},
		{
			name:   "a SIGTERM that ends the relay with status 1 fails the run",
			change: func(b *builder) { b.h.Stops[0].Code = 1 },
			rule:   RuleExit, says: "relay r2 exited with status 1 after SIGTERM; a SIGTERM must end the relay with status 0",
		},
		{
			name: "a SIGTERM of the nemesis, not only the final one, is held to status 0",
			change: func(b *builder) {
				b.h.Stops = append(b.h.Stops, history.Stop{Relay: "r1", Signal: at(20), Exited: at(21), Code: -15})
			},
			rule: RuleExit, says: "relay r1 exited with signal 15 after SIGTERM",
		},
		{
			name: "a panic in a SIGTERM's exit fails the run",
			change: func(b *builder) {
				b.h.Exits[1].Crash = "panic: runtime error: invalid memory address or nil pointer dereference"
			},
			rule: RuleCrash, says: "relay r2 (after SIGTERM, exit 0): panic: runtime error",
		},
		{
			name:   "a race report in a killed process's output fails the run",
			change: func(b *builder) { b.h.Exits[0].Crash = "WARNING: DATA RACE" },
			rule:   RuleCrash, says: "relay r2 (after SIGKILL, exit -9): WARNING: DATA RACE",
		},
		{
			name: "a hanging Kafka transaction at the end fails the run",
			change: func(b *builder) {
				b.h.EndOffsets[1].LastStable = 38
			},
			rule: RuleHangingTxn, says: "__outbox_relay_positions/3: last stable offset 38 below the high watermark 40",
		},
		{
			name:   "a record whose content differs from what was committed fails the run",
			change: func(b *builder) { b.log[2].Hash = "h-altered" },
			rule:   RuleContent, says: "read event e4 (key k1 seq 3 at orders/1@1) with content hash h-altered; txn t3 committed it with h-e4",
		},
		{
			name: "a read without a hash, from a history before the hashes, is not compared",
			change: func(b *builder) {
				for i := range b.log {
					b.log[i].Hash = ""
				}
			},
		},
	}
	for _, delivery := range []string{history.ExactlyOnce, history.AtLeastOnce} {
		for _, tt := range tests {
			t.Run(delivery+"/"+tt.name, func(t *testing.T) {
				b := withEnds(delivery)
				if tt.change != nil {
					tt.change(b)
				}
				h := b.done(bothConsumers)
				vs := Check(h)
				var rules []string
				for _, v := range vs {
					rules = append(rules, v.Rule)
				}
				slices.Sort(rules)
				rules = slices.Compact(rules)
				switch {
				case tt.rule == "" && len(vs) > 0:
					t.Fatalf("violations:\n%s", Format(h, vs, 0))
				case tt.rule == "":
					return
				case !slices.Equal(rules, []string{tt.rule}):
					t.Fatalf("rules %v fired, want only %s:\n%s", rules, tt.rule, Format(h, vs, 0))
				case !strings.Contains(vs[0].Message, tt.says):
					t.Fatalf("message %q\ndoes not say %q", vs[0].Message, tt.says)
				}
			})
		}
	}
}

// TestTheAllowlistIsShortAndExplained: every allowed exit says what it is and why; a line that
// merely mentions a slot is not excused.
func TestTheAllowlistIsShortAndExplained(t *testing.T) {
	if len(AllowedExits) > 3 {
		t.Errorf("%d allowed exits: the allowlist is meant to stay short", len(AllowedExits))
	}
	for _, a := range AllowedExits {
		if a.Name == "" || a.Match == "" || a.Why == "" || len(a.After) == 0 {
			t.Errorf("allowed exit %+v lacks a name, a match, a reason or the faults that bring it about", a)
		}
	}
	if _, ok := allowed(`outbox-relay: replication slot "s" is active for PID 7`); ok {
		t.Error("an exit naming the slot for another reason is excused")
	}
	if _, ok := allowed(""); ok {
		t.Error("an exit without an error line is excused")
	}
}
