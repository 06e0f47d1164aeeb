package main

import (
	"net/http"
	"testing"
	"time"
)

// TestTheMetricsServerBoundsEveryPhaseOfAConnection: with only ReadHeaderTimeout, a client that
// sends a body slowly, reads a response slowly or keeps a connection idle holds it for ever.
func TestTheMetricsServerBoundsEveryPhaseOfAConnection(t *testing.T) {
	srv := newHTTPServer(http.NotFoundHandler())
	for name, d := range map[string]time.Duration{
		"ReadHeaderTimeout": srv.ReadHeaderTimeout, "ReadTimeout": srv.ReadTimeout,
		"WriteTimeout": srv.WriteTimeout, "IdleTimeout": srv.IdleTimeout,
	} {
		if d <= 0 {
			t.Errorf("%s is not set: a connection may hold the server for ever in that phase", name)
		}
	}
}
