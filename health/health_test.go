package health_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/health"
)

type fakeRelay struct {
	streaming bool
	halted    string
}

func (f fakeRelay) Streaming() bool        { return f.streaming }
func (f fakeRelay) Halted() (string, bool) { return f.halted, f.halted != "" }

// stalledRelay also reports a stall, as the relay does while it waits for a missing topic.
type stalledRelay struct {
	fakeRelay
	stalled string
}

func (f stalledRelay) Stalled() (string, bool) { return f.stalled, f.stalled != "" }

func TestReadiness(t *testing.T) {
	tests := []struct {
		name  string
		setup func(s *health.State)
		ready bool
		why   string
	}{
		{"a starting instance is not ready", func(*health.State) {}, false, "starting"},
		{"a connected standby is ready", func(s *health.State) { s.Standby(true) }, true, "standby"},
		{"a standby that cannot reach PostgreSQL is not ready", func(s *health.State) { s.Standby(false) }, false, "cannot reach"},
		{"a streaming leader is ready", func(s *health.State) { s.Lead(fakeRelay{streaming: true}) }, true, "streaming"},
		{"a leader not streaming yet is not ready", func(s *health.State) { s.Lead(fakeRelay{}) }, false, "not streaming"},
		{"a halted leader is not ready", func(s *health.State) { s.Lead(fakeRelay{streaming: true, halted: "invalid_topic"}) }, false, "halted"},
		{"a leader whose slot poll fails is not ready", func(s *health.State) {
			s.Lead(fakeRelay{streaming: true})
			s.PostgresPolled(errors.New("connection refused"))
		}, false, "cannot reach PostgreSQL"},
		{"a leader is ready again once the poll succeeds", func(s *health.State) {
			s.Lead(fakeRelay{streaming: true})
			s.PostgresPolled(errors.New("connection refused"))
			s.PostgresPolled(nil)
		}, true, "streaming"},
		{"a leader stalled on a missing topic is not ready, and says which", func(s *health.State) {
			s.Lead(stalledRelay{fakeRelay{streaming: true}, "waiting for Kafka topic outbox.event.Order for 5s: it does not exist"})
		}, false, "leader stalled: waiting for Kafka topic outbox.event.Order"},
		{"a leader that can stall but does not is ready", func(s *health.State) {
			s.Lead(stalledRelay{fakeRelay{streaming: true}, ""})
		}, true, "streaming"},
		{"a stopping instance is not ready", func(s *health.State) { s.Lead(fakeRelay{streaming: true}); s.Stopping() }, false, "stopping"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s health.State
			tt.setup(&s)
			ready, why := s.Ready()
			if ready != tt.ready || !strings.Contains(why, tt.why) {
				t.Fatalf("Ready() = %v, %q; want %v and a reason containing %q", ready, why, tt.ready, tt.why)
			}
			rec := httptest.NewRecorder()
			s.ReadyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
			want := http.StatusOK
			if !tt.ready {
				want = http.StatusServiceUnavailable
			}
			if rec.Code != want || !strings.Contains(rec.Body.String(), tt.why) {
				t.Fatalf("/readyz = %d %q; want %d with %q", rec.Code, rec.Body.String(), want, tt.why)
			}
		})
	}
}

func TestTheErrorTextOfAFailedPollIsNotServed(t *testing.T) {
	var s health.State
	s.Lead(fakeRelay{streaming: true})
	s.PostgresPolled(errors.New(`failed to connect to user=relay host=db.internal: password authentication failed`))
	rec := httptest.NewRecorder()
	s.ReadyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if strings.Contains(rec.Body.String(), "db.internal") {
		t.Fatalf("/readyz serves driver details: %q", rec.Body.String())
	}
}
