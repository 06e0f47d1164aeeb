package chaos

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
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

// shortOptions are the options of make test's short run, defaults applied.
func shortOptions(seed uint64) Options {
	return Options{Seed: seed, Duration: 90 * time.Second, Modes: slices.Clone(modes), Kinds: ShortKinds(),
		Relays: 2, Writers: 2, Rate: 5, Mean: 2 * time.Second, Short: true, PGVersion: "18"}
}

const testLease = 7 * time.Second

// The schedule is drawn up front from the seed and the options alone: the same ones draw the
// same plan, another seed or other options another.
func TestTheSameSeedAndOptionsDrawTheSamePlan(t *testing.T) {
	a := drawPlan(shortOptions(42), true, testLease)
	if b := drawPlan(shortOptions(42), true, testLease); !reflect.DeepEqual(a, b) {
		t.Errorf("the same seed and options drew another plan:\n%v\n%v", a, b)
	}
	if c := drawPlan(shortOptions(43), true, testLease); reflect.DeepEqual(a, c) {
		t.Error("seeds 42 and 43 drew the same plan")
	}
	long := shortOptions(42)
	long.Short = false
	if d := drawPlan(long, true, testLease); reflect.DeepEqual(a, d) {
		t.Error("a short and a long run drew the same plan (big transactions of the same size)")
	}
	for i, f := range a {
		if f.Seq != i+1 || f.At >= 90*time.Second || (i > 0 && f.At <= a[i-1].At) {
			t.Fatalf("fault %d: seq %d at %v: want seq %d, times rising within the fault period", i, f.Seq, f.At, i+1)
		}
	}
}

// The short schedule carries out what every run must (a kill and a zombie pause of each mode's
// leader, a failover) and still deals every kind.
func TestTheShortPlanDealsWhatEveryRunMust(t *testing.T) {
	for _, seed := range []uint64{7, 1201, 31337, 20261206} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			plan := drawPlan(shortOptions(seed), true, testLease)
			kinds := map[string]int{}
			kills, zombies := map[string]bool{}, map[string]bool{}
			failover := false
			for _, f := range plan {
				kinds[f.Kind]++
				wantRole := history.RoleLeader
				if f.Mode == "poll" {
					wantRole = history.RoleAny
				}
				switch {
				case f.Kind == kindKill9 && f.Role == wantRole:
					kills[f.Mode] = true
				case f.Kind == kindPause && f.Role == wantRole && f.Duration > testLease:
					zombies[f.Mode] = true
				case f.Kind == kindFailoverSync || f.Kind == kindFailoverLag:
					failover = true
				}
			}
			for _, m := range modes {
				if !kills[m.Name] || !zombies[m.Name] {
					t.Errorf("%s: leader's kill planned %v, zombie pause planned %v; want both", m.Name, kills[m.Name], zombies[m.Name])
				}
			}
			if !failover {
				t.Error("no failover planned")
			}
			// Every kind once the faults every run must carry out leave room for a round of
			// the deck (exponential gaps make some schedules sparser than others).
			if must := 2*len(modes) + 1; len(plan) >= must+len(ShortKinds()) {
				for _, k := range ShortKinds() {
					if kinds[k] == 0 {
						t.Errorf("no %s planned in %d faults (%v)", k, len(plan), kinds)
					}
				}
			}
			if len(plan) < 25 || len(plan) > 70 {
				t.Errorf("%d faults planned in 90 s, want about 45 (one every 2 s)", len(plan))
			}
		})
	}
}

// A plan saved in a history and replayed runs the same schedule with the same options: the
// replay takes every option from the plan, and those options draw that very plan again.
func TestAReplayedPlanIsTheSameSchedule(t *testing.T) {
	o := shortOptions(1201)
	plan := &history.Plan{Options: planOptions(o), Faults: drawPlan(o, true, testLease)}
	path := filepath.Join(t.TempDir(), "history.json")
	if err := (&history.History{Mode: "eo-table", Plan: plan}).Save(path); err != nil {
		t.Fatal(err)
	}
	h, err := history.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	eo, _ := ParseModes("eo-table")
	got, err := replayOptions(Options{Plan: h.Plan, Modes: eo, Seed: 99, Duration: time.Hour, Relays: 3, Kinds: []string{kindKill9}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Seed != o.Seed || got.Duration != o.Duration || got.Relays != o.Relays || got.Writers != o.Writers ||
		got.Rate != o.Rate || got.Mean != o.Mean || !got.Short || got.PGVersion != o.PGVersion || !slices.Equal(got.Kinds, o.Kinds) {
		t.Errorf("replay options %+v, want the plan's %+v", got, h.Plan.Options)
	}
	if len(got.Modes) != 1 || got.Modes[0].Name != "eo-table" {
		t.Errorf("replay modes %v, want eo-table alone", got.Modes)
	}
	all, _ := ParseModes(strings.Join(h.Plan.Options.Modes, ","))
	got.Modes = all
	if again := drawPlan(got, true, testLease); !reflect.DeepEqual(again, h.Plan.Faults) {
		t.Errorf("the replayed options draw another plan than the saved one")
	}
	if _, err := replayOptions(Options{Plan: h.Plan, Modes: []Mode{{Name: "nope"}}}); err == nil {
		t.Error("a replay of a mode the plan does not have was accepted")
	}
	cmd := h.Plan.Options.Command()
	for _, want := range []string{"SEED=1201", "DURATION=1m30s", "MODE=alo-table,", "KINDS=kill9,", "RELAYS=2", "WRITERS=2", "RATE=5", "MEAN=2s", "PG_VERSION=18", "SHORT=1"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("command %q lacks %s", cmd, want)
		}
	}
}

// Only the plan's faults of the modes a replay runs are applied (and the cluster's), each with
// its planned group.
func TestAReplayOfOneModeAppliesItsFaultsAndTheClusters(t *testing.T) {
	o := shortOptions(7)
	plan := drawPlan(o, true, testLease)
	r := &runner{lease: testLease}
	eo, _ := modeNamed("eo-table")
	r.modes = []*modeRun{{mode: eo}}
	n := &nemesis{run: r, plan: plan}
	var mine, cluster int
	for _, p := range plan {
		f, ok := n.fault(p)
		switch {
		case p.Mode == "" && !ok, p.Mode == "eo-table" && !ok:
			t.Errorf("fault #%d %s of %q not applied", p.Seq, p.Kind, p.Mode)
		case p.Mode != "" && p.Mode != "eo-table" && ok && (f.mode != nil || f.kind == p.Kind):
			t.Errorf("fault #%d %s of %s applied in a replay of eo-table", p.Seq, p.Kind, p.Mode)
		case p.Mode != "" && p.Mode != "eo-table" && ok:
			// a neighbour's start under a server fault: the server fault alone (review test)
		case ok && f.group != group(p.Kind, p.Mode):
			t.Errorf("fault #%d group %q", p.Seq, f.group)
		case ok && p.Mode == "":
			cluster++
		case ok:
			mine++
		}
	}
	if mine == 0 || cluster == 0 {
		t.Errorf("%d faults of eo-table and %d of the cluster applied, want some of each", mine, cluster)
	}
}

// What a run must carry out follows its modes and kinds, and a missed requirement fails the run.
func TestRequirementsFollowTheModeAndKindsAndFailTheRun(t *testing.T) {
	eo, _ := modeNamed("eo-table")
	poll, _ := modeNamed("poll")
	all := []string{history.RequireLeaderKill, history.RequireLeaderZombie, history.RequireLeaderChange, history.RequireFailover}
	for _, tt := range []struct {
		name    string
		mode    Mode
		kinds   []string
		standby bool
		want    []string
	}{
		{"a WAL mode with every kind and a standby", eo, ShortKinds(), true, all},
		{"without a standby no failover is required", eo, ShortKinds(), false, all[:3]},
		{"kills alone require the leader's kill and a leader change", eo, []string{kindKill9}, true, []string{history.RequireLeaderKill, history.RequireLeaderChange}},
		{"poll has no leader: any poller's kill and zombie pause", poll, ShortKinds(), false, []string{history.RequireRelayKill, history.RequireRelayZombie}},
		{"no relay or failover kind, nothing required", eo, []string{kindBigTx, kindBrokerStop}, true, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &runner{standby: tt.standby, opts: Options{Kinds: tt.kinds}}
			if got := r.required(tt.mode); !slices.Equal(got, tt.want) {
				t.Errorf("required %v, want %v", got, tt.want)
			}
		})
	}
	res := &Result{Modes: []ModeResult{{Mode: "eo-table"}, {Mode: "poll"}}}
	if res.Failed() {
		t.Fatal("a clean result failed")
	}
	res.Modes[1].Unmet = []string{"relay-kill: no kill9 of a relay took effect"}
	if !res.Failed() {
		t.Error("a result with a missed requirement did not fail")
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
			rng := rand.New(rand.NewPCG(7, 1))
			seen := map[int]bool{}
			for range 100 {
				seen[brokerNode(tc.kind, tc.brokers, rng)] = true
			}
			if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, tc.want) {
				t.Errorf("nodes drawn: %v, want %v", got, tc.want)
			}
		})
	}
}

// A plan for three brokers names the broker of every stop, pause and kill, and a plan for one
// draws no three-broker kind.
func TestAPlanNamesTheBrokerOfEachBrokerFault(t *testing.T) {
	for _, brokers := range []int{1, 3} {
		o := Options{Seed: 7, Duration: 10 * time.Minute, Modes: modes, Kinds: brokerKinds(FaultKinds(), brokers),
			Relays: 2, Writers: 2, Rate: 5, Mean: 2 * time.Second, Brokers: brokers}
		kinds := map[string]int{}
		for _, f := range drawPlan(o, true, 7*time.Second) {
			kinds[f.Kind]++
			switch f.Kind {
			case kindBrokerStop, kindBrokerPause, kindBrokerKill:
				if f.Pick < 1 || f.Pick > brokers || f.Kind == kindBrokerKill && f.Pick == 1 {
					t.Errorf("%d brokers: %s planned on node %d", brokers, f.Kind, f.Pick)
				}
			}
		}
		for _, k := range threeBrokerKinds {
			if brokers == 1 && kinds[k] > 0 || brokers == 3 && kinds[k] == 0 {
				t.Errorf("%d brokers: %s planned %d times", brokers, k, kinds[k])
			}
		}
	}
}
