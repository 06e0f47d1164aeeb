package replication

import (
	"testing"
	"time"
)

func TestReceiveTimeoutLeavesABusyWalsenderTimeToAnswer(t *testing.T) {
	tests := []struct {
		name                                string
		configured, senderTimeout, interval time.Duration
		want                                time.Duration
	}{
		{"the configured timeout when it covers wal_sender_timeout", 2 * time.Minute, time.Minute, time.Second, 2 * time.Minute},
		{"wal_sender_timeout and two status intervals when longer", 2 * time.Minute, 5 * time.Minute, time.Second, 5*time.Minute + 2*time.Second},
		{"the configured timeout when the server never times out", 3 * time.Second, 0, time.Second, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := receiveTimeout(tt.configured, tt.senderTimeout, tt.interval); got != tt.want {
				t.Fatalf("receiveTimeout(%s, %s, %s) = %s, want %s", tt.configured, tt.senderTimeout, tt.interval, got, tt.want)
			}
		})
	}
}
