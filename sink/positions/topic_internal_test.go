package positions

import (
	"errors"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestOnlyACreationThatMayWorkLaterIsRetried: a creation of the positions topic that failed for a
// reason that passes (a timeout, the controller moving, the connection) is tried again; a refusal
// that needs an operator (ACLs, policies, a bad configuration) ends the start.
func TestOnlyACreationThatMayWorkLaterIsRetried(t *testing.T) {
	for _, tc := range []struct {
		err   error
		retry bool
	}{
		{kafka.RequestTimedOut, true},
		{kafka.NotController, true},
		{errors.New("read tcp: connection reset by peer"), true},
		{kafka.TopicAuthorizationFailed, false},
		{kafka.PolicyViolation, false},
		{kafka.InvalidConfiguration, false},
	} {
		if got := retriableCreate(fmt.Errorf("sink: positions topic p does not exist and creating it failed: %w", tc.err)); got != tc.retry {
			t.Errorf("retriableCreate(%v) = %v, want %v", tc.err, got, tc.retry)
		}
	}
}
