// Package health decides whether this relay instance is ready: a leader is ready while it streams
// and is not halted by the failure policy; a standby is ready while it is connected and waiting to
// take over. Liveness is simpler: the process answers.
package health

import (
	"io"
	"net/http"
	"sync"
)

// Streamer is what readiness needs to know about the relay of the current leadership term.
type Streamer interface {
	// Streaming reports whether a replication session has started.
	Streaming() bool
	// Halted reports whether the failure policy stopped publishing, and why.
	Halted() (reason string, halted bool)
}

// Staller is optionally implemented by a Streamer whose publishing can stall on something an
// operator must fix (a Kafka topic that does not exist while the brokers do not create topics, or
// that the relay may not write): every later event waits behind it, so the leader is not ready.
type Staller interface {
	Stalled() (why string, stalled bool)
}

type role int

const (
	starting role = iota
	standby
	leader
	stopping
)

// State is the instance's readiness, updated by the leader loop and the slot monitor and read by
// /readyz. Its zero value is a starting instance (not ready).
type State struct {
	mu        sync.Mutex
	role      role
	connected bool     // standby: its lock connection works
	relay     Streamer // leader: the current term's relay
	pgDown    error    // the slot monitor's last poll failed
}

// Standby records that this instance waits for the leader lock; connected says whether it can
// reach PostgreSQL.
func (s *State) Standby(connected bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.role, s.connected, s.relay = standby, connected, nil
}

// Lead records that this instance holds leadership (or runs without election) with relay r.
func (s *State) Lead(r Streamer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.role, s.relay = leader, r
}

// Stopping records that the instance is shutting down: it no longer takes traffic of any kind.
func (s *State) Stopping() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.role = stopping
}

// PostgresPolled records the outcome of the slot monitor's last poll; a leader that cannot reach
// PostgreSQL is not ready even while its replication connection has not noticed yet.
func (s *State) PostgresPolled(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pgDown = err
}

// Ready reports readiness and, in words, why.
func (s *State) Ready() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.role {
	case standby:
		if !s.connected {
			return false, "standby cannot reach PostgreSQL"
		}
		return true, "standby: connected, waiting for the leader lock"
	case leader:
		if reason, halted := s.relay.Halted(); halted {
			return false, "leader halted by the failure policy: " + reason
		}
		if s.pgDown != nil {
			// Not the error text: /readyz is unauthenticated and driver errors name hosts and users.
			return false, "leader cannot reach PostgreSQL"
		}
		if st, ok := s.relay.(Staller); ok {
			if why, stalled := st.Stalled(); stalled {
				return false, "leader stalled: " + why
			}
		}
		if !s.relay.Streaming() {
			return false, "leader starting: not streaming yet"
		}
		return true, "leader: streaming"
	case stopping:
		return false, "stopping"
	}
	return false, "starting"
}

// ReadyHandler serves /readyz: 200 when ready, 503 otherwise, with the reason as text.
func (s *State) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ok, why := s.Ready()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready: "+why+"\n")
			return
		}
		io.WriteString(w, "ready: "+why+"\n")
	})
}

// LiveHandler serves /healthz: 200 while the process answers.
func LiveHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
}
