package sink

import "testing"

func TestAPositionValueKeepsItsOriginAndAnOldOneReadsAsUnknown(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    Position
		wantErr bool
	}{
		{"version 1: no origin", `{"v":1,"commit_lsn":"0/1A2B3C8","events":12}`, Position{CommitLSN: 0x1A2B3C8, Events: 12}, false},
		{"version 1 with origin fields is still of unknown origin", `{"v":1,"system_identifier":"7","timeline":3,"commit_lsn":"0/10","events":1}`, Position{CommitLSN: 0x10, Events: 1}, false},
		{"version 2", `{"v":2,"system_identifier":"7714668250760685997","timeline":2,"commit_lsn":"1/0","events":3}`,
			Position{CommitLSN: 1 << 32, Events: 3, SystemID: "7714668250760685997", Timeline: 2}, false},
		{"version 2 without a timeline", `{"v":2,"system_identifier":"7","commit_lsn":"0/10","events":1}`, Position{}, true},
		{"version 2 without a system identifier", `{"v":2,"timeline":1,"commit_lsn":"0/10","events":1}`, Position{}, true},
		{"a later version", `{"v":3,"commit_lsn":"0/10","events":1}`, Position{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodePosition([]byte(tt.value))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("decodePosition(%s) = %+v, %v; want %+v (error: %v)", tt.value, got, err, tt.want, tt.wantErr)
			}
		})
	}
	for _, p := range []Position{
		{CommitLSN: 0x5000000, Events: 4, SystemID: "7714668250760685997", Timeline: 3},
		{CommitLSN: 0x5000000, Events: 4}, // unknown origin: written as version 1
	} {
		got, err := decodePosition(encodePosition(p))
		if err != nil || got != p {
			t.Errorf("%+v encoded as %s decodes to %+v, %v", p, encodePosition(p), got, err)
		}
	}
}
