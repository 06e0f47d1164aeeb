package chaos

import (
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
)

// PostgreSQL's and the process's kinds are planned only where they can act: a slot is
// invalidated only in a mode that recovers it, prune runs only where there are outbox rows, the
// standby kinds need a standby, and every PostgreSQL fault but prune is in PostgreSQL's group.
func TestPostgresAndProcessKindsTargetWhatTheyCanActOn(t *testing.T) {
	for _, tc := range []struct {
		kind    string
		standby bool
		ok      func(Mode) bool // nil: a cluster fault
		group   string          // "": none
		never   bool            // never planned with these options
	}{
		{kind: kindSlotInvalidated, standby: true, ok: func(m Mode) bool { return m.Recover }, group: "postgres"},
		{kind: kindPrune, standby: true, ok: func(m Mode) bool { return m.Shape != workload.Messages }, group: "prune/"},
		{kind: kindStandbyStop, standby: true, group: "postgres"},
		{kind: kindStandbyLag, standby: true, group: "postgres"},
		{kind: kindStandbyStop, never: true},
		{kind: kindStandbyLag, never: true},
		{kind: kindPGFreeze, group: "postgres"},
		{kind: kindOOM, ok: func(Mode) bool { return true }},
	} {
		t.Run(fmt.Sprintf("%s with a standby %v", tc.kind, tc.standby), func(t *testing.T) {
			o := shortOptions(3)
			o.Kinds = []string{tc.kind}
			for seed := range uint64(10) {
				o.Seed = seed
				plan := drawPlan(o, tc.standby, testLease)
				if tc.never {
					if len(plan) > 0 {
						t.Fatalf("seed %d: %s planned without a standby: %+v", seed, tc.kind, plan[0])
					}
					continue
				}
				if len(plan) == 0 {
					t.Fatalf("seed %d: no %s planned", seed, tc.kind)
				}
				for _, f := range plan {
					m, _ := modeNamed(f.Mode)
					if (tc.ok == nil) != (f.Mode == "") || (tc.ok != nil && !tc.ok(m)) {
						t.Fatalf("seed %d: %s planned for mode %q", seed, tc.kind, f.Mode)
					}
					if g := group(f.Kind, f.Mode); g != tc.group && g != tc.group+f.Mode {
						t.Fatalf("seed %d: %s in group %q, want %q", seed, tc.kind, g, tc.group)
					}
				}
			}
		})
	}
}

// A standby-lag's replay delay is drawn with it: a quarter of its length, in its detail.
func TestAStandbyLagsDelayIsAQuarterOfItsLength(t *testing.T) {
	o := shortOptions(5)
	o.Kinds = []string{kindStandbyLag}
	for _, f := range drawPlan(o, true, testLease) {
		if want := fmt.Sprintf("replay %s behind", (f.Duration / 4).Round(100*time.Millisecond)); f.Detail != want {
			t.Fatalf("detail %q for %s, want %q", f.Detail, f.Duration, want)
		}
	}
}
