package replay

import "testing"

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
