package replication

import (
	"reflect"
	"testing"
)

func TestATimelineHistoryFileReadsAsTheTimelinesAndWhereEachEnded(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []TimelineSwitch
		wantErr bool
	}{
		{"one promotion", "1\t0/3000060\tno recovery target specified\n", []TimelineSwitch{{1, 0x3000060}}, false},
		{"two, with a comment and a blank line", "# comment\n1\t0/3000060\tno recovery target specified\n\n2\t1/A0\tat restore point \"x\"\n",
			[]TimelineSwitch{{1, 0x3000060}, {2, 0x1000000A0}}, false},
		{"empty", "", nil, false},
		{"no LSN", "1\n", nil, true},
		{"a bad LSN", "1\tzz\treason\n", nil, true},
		{"timelines out of order", "2\t0/10\tx\n1\t0/20\tx\n", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTimelineHistory([]byte(tt.content))
			if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseTimelineHistory = %v, %v; want %v (error: %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
