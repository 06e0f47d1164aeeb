package replay

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
)

func TestMissingVersionsAreListedAsRanges(t *testing.T) {
	cases := []struct {
		name     string
		have     []int64
		from, to int64
		want     string
	}{
		{"all there from 1 to the newest", []int64{1, 2, 3}, 0, 0, ""},
		{"the first ones pruned", []int64{3, 4}, 0, 0, "1..2"},
		{"a hole and a single one", []int64{1, 4, 6}, 0, 0, "2..3, 5"},
		{"a range starting inside", []int64{3, 4, 5}, 4, 0, ""},
		{"a range ending beyond the newest", []int64{3, 4}, 3, 6, "5..6"},
		{"a range ending before a later hole", []int64{1, 2, 5}, 1, 2, ""},
		{"nothing at all", nil, 0, 0, "1 and later"},
		{"nothing in a closed range", nil, 2, 3, "2..3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := missingVersions(c.have, c.from, c.to); got != c.want {
				t.Fatalf("missingVersions(%v, %d, %d) = %q, want %q", c.have, c.from, c.to, got, c.want)
			}
		})
	}
}

func TestSelectionsAreRefusedWhenPartOfThemWouldBeIgnored(t *testing.T) {
	table := Table{Columns: decoder.DefaultColumns(), Created: "created_at"}
	table.Columns.AggregateVersion = "version"
	now := time.Now()
	cases := []struct {
		name string
		sel  Selection
		want string // in the error; empty: accepted
	}{
		{"event ids", Selection{EventIDs: []string{"a"}}, ""},
		{"an aggregate with a version range", Selection{AggregateType: "order", AggregateID: "1", FromVersion: 2, ToVersion: 5}, ""},
		{"a time range", Selection{Since: now.Add(-time.Hour), Until: now}, ""},
		{"nothing", Selection{}, "choose one selection"},
		{"event ids and a time range", Selection{EventIDs: []string{"a"}, Since: now}, "choose one selection"},
		{"event ids with a version range", Selection{EventIDs: []string{"a"}, FromVersion: 3}, "version range"},
		{"a time range with a version range", Selection{Since: now.Add(-time.Hour), ToVersion: 3}, "version range"},
		{"until without since", Selection{EventIDs: []string{"a"}, Until: now}, "needs its start"},
		{"an aggregate without its id", Selection{AggregateType: "order"}, "both its type and its id"},
		{"a version range ending before it starts", Selection{AggregateType: "order", AggregateID: "1", FromVersion: 5, ToVersion: 2}, "ends (2) before it starts (5)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := table.Validate(c.sel)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Validate = %v, want the selection accepted", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Validate = %v, want an error saying %q", err, c.want)
			}
		})
	}
}

func TestTheOrderIsSeqElseEachAggregatesVersionsElseTheCreationTime(t *testing.T) {
	table := Table{Columns: decoder.DefaultColumns(), Created: "created_at", Order: "seq"}
	table.Columns.AggregateVersion = `v"x`
	cases := []struct {
		name              string
		hasSeq, byVersion bool
		want              string
	}{
		{"the insertion sequence", true, true, `"seq", "id"`},
		{"versions", false, true, `"aggregate_type", "aggregate_id", coalesce("v""x", max("v""x") OVER (PARTITION BY "aggregate_type", "aggregate_id" ORDER BY "created_at", "id"), 0), "created_at", "id"`},
		{"the creation time", false, false, `"created_at", "id"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := table.order(c.hasSeq, c.byVersion); got != c.want {
				t.Fatalf("order:\n got %s\nwant %s", got, c.want)
			}
		})
	}
}
