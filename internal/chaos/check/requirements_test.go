package check

import (
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// A fault whose action failed, or that never applied, excuses nothing: an at-least-once repeat
// that only a kill's replay explains (appended 19 s after it, past every other fault's window)
// is a violation when that kill failed or was skipped, and the summary does not count it.
func TestAFaultThatDidNotTakeEffectExcusesNothing(t *testing.T) {
	tests := []struct {
		name   string
		change func(f *history.Fault)
		want   bool // a duplicate violation
	}{
		{"the kill took effect", func(*history.Fault) {}, false},
		{"the kill failed", func(f *history.Fault) { f.Failed = "kill: no such process" }, true},
		{"the kill was skipped", func(f *history.Fault) { f.Skipped = "not running" }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := clean(history.AtLeastOnce)
			i := slices.IndexFunc(b.h.Faults, func(f history.Fault) bool { return f.Kind == "kill9" })
			tt.change(&b.h.Faults[i])
			b.publish(49, "e1")
			h := b.done(bothConsumers)
			vs := Check(h)
			if got := slices.ContainsFunc(vs, func(v Violation) bool { return v.Rule == RuleDuplicate }); got != tt.want {
				t.Errorf("duplicate violation: %v; want %v\n%s", got, tt.want, Format(h, vs, 0))
			}
			wantKills := 1
			if tt.want {
				wantKills = 0
			}
			if got := Summarize(h).Faults["kill9"]; got != wantKills {
				t.Errorf("summary counts %d kill9, want %d", got, wantKills)
			}
		})
	}
}

// Each requirement a run must meet is missed, and said so, when the only fault that would meet
// it failed, was skipped, or hit a relay that was not leading at the moment.
func TestUnmetRequirements(t *testing.T) {
	all := []string{history.RequireLeaderKill, history.RequireLeaderZombie, history.RequireLeaderChange, history.RequireFailover}
	tests := []struct {
		name     string
		required []string
		change   func(b *builder)
		want     []string // the requirements reported unmet, by name
	}{
		{name: "the leader killed and paused past its lease, a handover and a failover meet all", required: all},
		{
			name: "a kill of a relay that was not leading at that moment is no leader's kill", required: all,
			change: func(b *builder) { b.h.Faults[1].Leader = false },
			want:   []string{history.RequireLeaderKill},
		},
		{
			name: "a zombie pause that failed does not count", required: all,
			change: func(b *builder) { b.h.Faults[2].Failed = "SIGSTOP: no such process" },
			want:   []string{history.RequireLeaderZombie},
		},
		{
			name: "a pause within the lease is no zombie", required: all,
			change: func(b *builder) { b.h.Faults[2].End = b.h.Faults[2].Start.Add(b.h.Settings.Lease) },
			want:   []string{history.RequireLeaderZombie},
		},
		{
			name: "a skipped failover is no failover", required: all,
			change: func(b *builder) { b.h.Faults[0].Skipped = "the standby was not ready" },
			want:   []string{history.RequireFailover},
		},
		{
			name: "one relay leading throughout is no leader change", required: all,
			change: func(b *builder) {
				b.h.Relays = slices.DeleteFunc(b.h.Relays, func(s history.RelaySample) bool { return s.Relay == "r2" })
				for i := range b.h.Relays {
					b.h.Relays[i].Leader = true
				}
			},
			want: []string{history.RequireLeaderChange},
		},
		{
			name: "a mode without a leader needs a kill and a zombie of any relay", required: []string{history.RequireRelayKill, history.RequireRelayZombie},
			change: func(b *builder) { b.h.Faults[1].Leader, b.h.Faults[2].Leader = false, false },
		},
		{
			name: "nothing required, nothing missed", required: nil,
			change: func(b *builder) { b.h.Faults = nil },
		},
		{
			name: "a requirement this checker does not know is reported", required: []string{"three-brokers"},
			want: []string{"three-brokers"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := clean(history.ExactlyOnce)
			// The clean history's failover, its kill of r2 (leading at 30 s) and r1's zombie pause.
			b.h.Faults[1].Leader, b.h.Faults[2].Leader = true, true
			if tt.change != nil {
				tt.change(b)
			}
			b.h.Required = tt.required
			got := Unmet(b.done(bothConsumers))
			var names []string
			for _, u := range got {
				names = append(names, u[:strings.Index(u, ":")])
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("unmet %q, want %v", got, tt.want)
			}
		})
	}
}
