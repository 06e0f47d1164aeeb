package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/workload"
)

func TestParseModes(t *testing.T) {
	for _, tc := range []struct {
		list    string
		want    []string
		wantErr bool
	}{
		{list: "", want: AllModes()},
		{list: "all", want: AllModes()},
		{list: "eo-table, poll,eo-table", want: []string{"eo-table", "poll"}},
		{list: "eo-tabel", wantErr: true},
	} {
		got, err := ParseModes(tc.list)
		if (err != nil) != tc.wantErr {
			t.Fatalf("ParseModes(%q): error %v, want error %v", tc.list, err, tc.wantErr)
		}
		var names []string
		for _, m := range got {
			names = append(names, m.Name)
		}
		if !tc.wantErr && !slices.Equal(names, tc.want) {
			t.Errorf("ParseModes(%q) = %v, want %v", tc.list, names, tc.want)
		}
	}
}

// testNemesis is a nemesis over modes whose relays are names only: drawing never starts anything.
func testNemesis(seed uint64) *nemesis {
	r := &runner{standby: true, lease: 7 * time.Second, opts: Options{Kinds: FaultKinds()}}
	for _, m := range modes {
		mr := &modeRun{mode: m}
		for i := 1; i <= 2; i++ {
			mr.relays = append(mr.relays, &relay{name: relayName(m, i)})
		}
		if m.Delivery == "exactly-once" {
			mr.neighbour = &neighbour{}
		}
		r.modes = append(r.modes, mr)
	}
	return &nemesis{run: r, rng: rand.New(rand.NewPCG(seed, 1)), kinds: FaultKinds(),
		active: make(map[string]int), busy: make(map[string]bool), columns: make(map[string]int)}
}

// A round of the deck applies every kind once, so a short schedule still covers them all, and the
// same seed draws the same schedule.
func TestTheDeckDrawsEveryKindOncePerRoundAndRepeatsBySeed(t *testing.T) {
	schedule := func(seed uint64) []string {
		n := testNemesis(seed)
		var out []string
		for range 3 * len(FaultKinds()) {
			f := n.draw()
			if f == nil {
				t.Fatal("nothing eligible with every fault healed")
			}
			target := "cluster"
			if f.relay != nil {
				target = f.relay.name
			} else if f.mode != nil {
				target = f.mode.mode.Name
			}
			out = append(out, f.kind+"@"+target)
			n.release(f)
		}
		return out
	}
	a := schedule(42)
	round := map[string]int{}
	for _, d := range a[:len(FaultKinds())] {
		kind := d[:slices.Index([]byte(d), '@')]
		round[kind]++
	}
	for _, k := range FaultKinds() {
		// The neighbour starts once per exactly-once mode; every other kind once per round.
		if round[k] != 1 {
			t.Errorf("first round drew %s %d times, want once (%v)", k, round[k], a[:len(FaultKinds())])
		}
	}
	if b := schedule(42); !slices.Equal(a, b) {
		t.Errorf("the same seed drew another schedule:\n%v\n%v", a, b)
	}
	if c := schedule(43); slices.Equal(a, c) {
		t.Errorf("seeds 42 and 43 drew the same schedule")
	}
}

// Faults that share a server never overlap (two broker faults, a restart during a failover); a
// relay under a fault is not drawn again until it heals.
func TestExclusiveFaultsDoNotOverlap(t *testing.T) {
	n := testNemesis(7)
	var held []*fault
	for range 200 {
		f := n.draw()
		if f == nil {
			break
		}
		held = append(held, f)
	}
	groups := map[string]int{}
	relays := map[string]int{}
	for _, f := range held {
		if f.group != "" {
			groups[f.group]++
		}
		if f.relay != nil {
			relays[f.relay.name]++
		}
	}
	for g, c := range groups {
		if c > 1 {
			t.Errorf("group %s drawn %d times at once", g, c)
		}
	}
	for r, c := range relays {
		if c > 1 {
			t.Errorf("relay %s under %d faults at once", r, c)
		}
	}
	if relays := len(relays); relays != 2*len(modes) {
		t.Errorf("%d relays under faults once every one was drawn, want %d (two per mode)", relays, 2*len(modes))
	}
}

// PostgreSQL's and the process's new kinds target only what they can act on: a slot is
// invalidated only in a mode that recovers it, prune runs only where there are outbox rows, the
// standby kinds need a standby, and every PostgreSQL fault but prune holds PostgreSQL's group.
func TestPostgresAndProcessKindsTargetWhatTheyCanActOn(t *testing.T) {
	for _, tc := range []struct {
		kind    string
		standby bool
		ok      func(*modeRun) bool // nil: a cluster fault
		group   string
	}{
		{kindSlotInvalidated, true, func(m *modeRun) bool { return m.mode.Recover }, "postgres"},
		{kindPrune, true, func(m *modeRun) bool { return m.mode.Shape != workload.Messages }, "prune/"},
		{kindStandbyStop, true, nil, "postgres"},
		{kindStandbyLag, true, nil, "postgres"},
		{kindStandbyStop, false, nil, ""},
		{kindPGFreeze, false, nil, "postgres"},
		{kindOOM, false, func(*modeRun) bool { return true }, ""},
	} {
		t.Run(fmt.Sprintf("%s with a standby %v", tc.kind, tc.standby), func(t *testing.T) {
			for seed := range uint64(20) {
				n := testNemesis(seed)
				n.run.standby = tc.standby
				f, ok := n.pick(tc.kind)
				if !tc.standby && tc.group == "" && tc.ok == nil {
					if ok {
						t.Fatalf("%s drawn without a standby", tc.kind)
					}
					continue
				}
				if !ok {
					t.Fatalf("seed %d: %s not drawn with every fault healed", seed, tc.kind)
				}
				if tc.ok != nil && (f.mode == nil || !tc.ok(f.mode)) {
					t.Fatalf("seed %d: %s drawn for mode %v", seed, tc.kind, f.mode)
				}
				if !strings.HasPrefix(f.group, tc.group) || (tc.group == "" && f.group != "") {
					t.Fatalf("seed %d: %s in group %q, want %q", seed, tc.kind, f.group, tc.group)
				}
			}
		})
	}
}
