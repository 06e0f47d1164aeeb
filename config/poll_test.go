package config_test

import (
	"strings"
	"testing"
	"time"
)

func TestThePollingSourceHasItsDefaultsAndTurnsLeaderElectionOffUnlessSet(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		leader bool
	}{
		{"source wal keeps leader election on by default", required(), nil, true},
		{"source poll turns it off by default: pollers share the table", with(required(), "OUTBOX_SOURCE", "poll"), nil, false},
		{"source poll keeps it on when asked for", with(required(), "OUTBOX_SOURCE", "poll"), []string{"--leader-election=true"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := load(t, "", tc.env, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if c.LeaderElection != tc.leader {
				t.Errorf("leader_election %v, want %v", c.LeaderElection, tc.leader)
			}
		})
	}
	c, _, err := load(t, "", with(required(), "OUTBOX_SOURCE", "POLL"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != "poll" || c.PollBatchSize != 200 || c.PollInterval != time.Second || c.PollMaxAttempts != 5 ||
		c.PollRetryBackoff != time.Second || c.PollWorkers != 2 {
		t.Errorf("poll defaults: %+v", c)
	}
}

func TestBadPollingValuesNameTheirKey(t *testing.T) {
	for _, tc := range []struct{ key, value, want string }{
		{"source", "logical", "config key source"},
		{"poll_batch_size", "0", "config key poll_batch_size"},
		{"poll_interval", "1ms", "config key poll_interval"},
		{"poll_max_attempts", "-1", "config key poll_max_attempts"},
		{"poll_retry_backoff", "soon", "config key poll_retry_backoff"},
		{"poll_workers", "many", "config key poll_workers"},
	} {
		_, _, err := load(t, "", with(required(), "OUTBOX_"+strings.ToUpper(tc.key), tc.value))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q: %v, want an error naming %q", tc.key, tc.value, err, tc.want)
		}
	}
}
