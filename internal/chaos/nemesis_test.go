package chaos

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
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

// The three-broker kinds are not drawn with one broker; with three, a stop or a pause targets any
// broker and a kill never node 1, the only controller.
func TestBrokerFaultsTargetABrokerAndNeverKillTheController(t *testing.T) {
	if got := brokerKinds(FaultKinds(), 1); slices.ContainsFunc(got, func(k string) bool { return slices.Contains(threeBrokerKinds, k) }) ||
		!slices.Contains(got, kindBrokerStop) || !slices.Contains(got, kindBrokerPause) {
		t.Errorf("kinds with one broker: %v, want broker-stop and broker-pause and none of %v", got, threeBrokerKinds)
	}
	if got := brokerKinds(FaultKinds(), 3); !slices.Equal(got, FaultKinds()) {
		t.Errorf("kinds with three brokers: %v, want every kind", got)
	}
	for _, tc := range []struct {
		name    string
		brokers int
		kind    string
		want    []int // every node drawn, sorted
	}{
		{"with one broker a stop targets it", 1, kindBrokerStop, []int{1}},
		{"with three brokers a stop targets any of them", 3, kindBrokerStop, []int{1, 2, 3}},
		{"with three brokers a pause targets any of them", 3, kindBrokerPause, []int{1, 2, 3}},
		{"with three brokers a kill never targets the controller", 3, kindBrokerKill, []int{2, 3}},
		{"a coordinator's move reads its target when applied", 3, kindCoordinatorMove, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := testNemesis(7)
			n.run.opts.Brokers = tc.brokers
			seen := map[int]bool{}
			for range 100 {
				seen[n.brokerNode(tc.kind)] = true
			}
			got := slices.Sorted(maps.Keys(seen))
			if !slices.Equal(got, tc.want) {
				t.Errorf("nodes drawn: %v, want %v", got, tc.want)
			}
		})
	}
}

// A kind that waits for its group (six kinds share the broker's) is drawn as soon as the group is
// free, before kinds of later rounds: the short schedule applies every broker kind.
func TestAKindBlockedByItsGroupIsDrawnOnceTheGroupFrees(t *testing.T) {
	n := testNemesis(7)
	n.run.opts.Brokers = 3
	var held *fault
	for range 100 {
		if f := n.draw(); f.group == "broker" {
			held = f
			break
		} else {
			n.release(f)
		}
	}
	if held == nil {
		t.Fatal("no broker fault drawn")
	}
	for range 2 * len(FaultKinds()) {
		f := n.draw()
		if f == nil {
			break
		}
		if f.group == "broker" {
			t.Fatalf("%s drawn while %s held the broker", f.kind, held.kind)
		}
		n.release(f)
	}
	n.release(held)
	if f := n.draw(); f == nil || f.group != "broker" {
		t.Errorf("first draw once the broker is free: %+v, want a broker kind that waited", f)
	}
}
