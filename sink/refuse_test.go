package sink_test

import (
	"context"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/sink"
)

// refuser records what the sink tells it; take says whether it takes refusals back.
type refuser struct {
	take    bool
	mu      sync.Mutex
	acks    int
	reasons []string
}

func (r *refuser) Ack(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acks += n
}

func (r *refuser) Refuse(reason string, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.take {
		r.reasons = append(r.reasons, reason)
	}
	return r.take
}

// TestARefuserTakesAPermanentRefusalBackInsteadOfThePolicy: the polling mode counts attempts
// itself, so a Refuser that takes the refusal gets it instead of the failure policy (nothing halts,
// nothing is counted as failed, the capacity comes back); one that declines leaves it to the
// policy. The refusal here is made before Kafka is contacted (no valid topic name).
func TestARefuserTakesAPermanentRefusalBackInsteadOfThePolicy(t *testing.T) {
	ctx := context.Background()
	s := newSink(t, "127.0.0.1:9", sink.Config{Policy: sink.Halt})
	taken := &refuser{take: true}
	if err := s.Publish(ctx, newEvent("e1", []byte("no topic!"), "a", "E", []byte(`{}`)), taken); err != nil {
		t.Fatal(err)
	}
	if len(taken.reasons) != 1 || taken.reasons[0] != sink.ReasonInvalidTopic || taken.acks != 0 {
		t.Fatalf("a taking Refuser got reasons %v and %d acks, want one %s and no ack", taken.reasons, taken.acks, sink.ReasonInvalidTopic)
	}
	if events, bytes := s.InFlight(); events != 0 || bytes != 0 {
		t.Fatalf("%d events, %d bytes still in flight after the refusal was taken back", events, bytes)
	}
	if _, _, _, halted := s.Halted(); halted {
		t.Fatal("the sink halted on a refusal its Refuser took back")
	}
	declined := &refuser{take: false}
	if err := s.Reject(ctx, newEvent("e2", []byte("no topic!"), "a", "E", []byte(`{}`)), "max_attempts", errStub{}, declined); err != nil {
		t.Fatal(err)
	}
	if _, reason, _, halted := s.Halted(); !halted || reason != "max_attempts" {
		t.Fatalf("halted %v with reason %q, want the halt policy applied to the declined refusal", halted, reason)
	}
}

type errStub struct{}

func (errStub) Error() string { return "refused before" }
