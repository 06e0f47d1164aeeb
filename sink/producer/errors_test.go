package producer_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// TestBrokerErrorsThatAreNotAboutTheRecordAreRetriedInPlace: error codes kafka-go does not mark
// temporary but that say nothing about the record (a broker restarting, a credential or ACL
// rotation) must be retried in place, never answered as a refusal (which the sink would
// dead-letter or halt on); a record-level code must still refuse the record, alone, and the ones
// behind it go on in order.
func TestBrokerErrorsThatAreNotAboutTheRecordAreRetriedInPlace(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		produce, metadata, auth int
		code                    kafka.Error
		refused                 bool // code refuses e0 for good
	}{
		{"broker not available on produce", 3, 0, 0, kafka.BrokerNotAvailable, false},
		{"replica not available on produce", 3, 0, 0, kafka.ReplicaNotAvailable, false},
		{"the unknown server error on produce", 3, 0, 0, kafka.Unknown, false},
		{"topic authorization failed on produce (an ACL rotation)", 3, 0, 0, kafka.TopicAuthorizationFailed, false},
		{"cluster authorization failed on produce", 3, 0, 0, kafka.ClusterAuthorizationFailed, false},
		{"topic authorization failed on the partition lookup", 0, 3, 0, kafka.TopicAuthorizationFailed, false},
		{"broker not available on the partition lookup", 0, 3, 0, kafka.BrokerNotAvailable, false},
		{"SASL authentication failed (a credential rotation)", 0, 0, 3, kafka.SASLAuthenticationFailed, false},
		{"an invalid record is still refused", 0, 0, 0, kafka.InvalidRecord, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := fakebroker.New(t)
			// The transport is the sink's (its metadata TTL decides how long an error the
			// transport cached is answered again). The fake broker offers no producer ids:
			// idempotence auto goes without, as the sink's default does.
			transport := &kafka.Transport{SASL: plain.Mechanism{Username: "relay", Password: "secret"},
				DialTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second, MetadataTTL: 5 * time.Second}
			f := newOnFakeVia(t, fb, -1, 5*time.Second, transport, producer.IdempotenceAuto, zaptest.NewLogger(t))
			fb.Script(tt.produce, tt.metadata, tt.auth, tt.code)
			if tt.refused {
				fb.RefuseID("e0")
			}
			const n = 3
			for i := range n {
				f.enqueue(t, "events", fmt.Sprintf("e%d", i))
			}
			f.wait(t, n)
			stored, left := fb.State()
			if left != 0 {
				t.Fatalf("%d scripted failures never happened: the test did not test", left)
			}
			want := "events/e0,events/e1,events/e2"
			if tt.refused {
				want = "events/e1,events/e2"
			} else if !f.retriedTopic("events") {
				t.Errorf("no retry of events: %v was not retried in place", tt.code)
			}
			f.mu.Lock()
			for i := range n {
				id := fmt.Sprintf("e%d", i)
				err, answered := f.answers[id]
				if refused := tt.refused && id == "e0"; !answered || refused != (err != nil) || refused && !errors.Is(err, tt.code) {
					t.Errorf("%s answered %v with %v; want only a record-level code to refuse, and only e0", id, answered, err)
				}
			}
			f.mu.Unlock()
			if got := strings.Join(stored, ","); got != want {
				t.Errorf("the broker stored %s, want %s", got, want)
			}
		})
	}
}
