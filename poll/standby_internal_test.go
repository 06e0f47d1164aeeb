package poll

import (
	"slices"
	"testing"
)

// TestTheStandbySlotsAreNamedAsPostgreSQLReadsThem: synchronized_standby_slots is a list of
// identifiers, which PostgreSQL splits as SplitIdentifierString does: an unquoted name in lower
// case, a quoted one as written, each slot once however often it is listed. A name kept as
// written ('Standby1' for slot standby1), or listed twice, would never count as caught up, and
// every claimed batch would wait for good.
func TestTheStandbySlotsAreNamedAsPostgreSQLReadsThem(t *testing.T) {
	tests := []struct {
		setting string
		want    []string
	}{
		{"", nil},
		{"standby1", []string{"standby1"}},
		{" standby1 , standby2 ", []string{"standby1", "standby2"}},
		{"Standby1", []string{"standby1"}},
		{`"standby1"`, []string{"standby1"}},
		{`"Standby1"`, []string{"Standby1"}},
		{"standby1, standby1", []string{"standby1"}},
		{`standby1, "standby1"`, []string{"standby1"}},
		{"a,,b", []string{"a", "b"}},
	}
	for _, tt := range tests {
		if got := standbySlotNames(tt.setting); !slices.Equal(got, tt.want) {
			t.Errorf("standbySlotNames(%q) = %q, want %q", tt.setting, got, tt.want)
		}
	}
}
