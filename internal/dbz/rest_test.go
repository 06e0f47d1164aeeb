package dbz

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A configuration Connect refuses comes back with Connect's own message, so the benchmark can
// quote it; one it accepts is no error. (Connect's REST answers are stood in for here; the
// benchmark's run creates the connector on a real worker.)
func TestCreateConnectorReturnsConnectsRefusal(t *testing.T) {
	tests := []struct {
		name        string
		status      int
		body        string
		wantRefusal *RefusedError
	}{
		{name: "an accepted connector is no error", status: http.StatusCreated, body: `{"name":"c"}`},
		{
			name:   "a refused one carries the status and the message",
			status: http.StatusBadRequest,
			body:   `{"error_code":400,"message":"Connector configuration is invalid: exactly.once.support: The connector does not support exactly-once semantics"}`,
			wantRefusal: &RefusedError{Status: 400,
				Message: "Connector configuration is invalid: exactly.once.support: The connector does not support exactly-once semantics"},
		},
		{name: "an answer without JSON keeps its text", status: http.StatusInternalServerError, body: "boom\n",
			wantRefusal: &RefusedError{Status: 500, Message: "boom"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/connectors" {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			err := Worker{URL: srv.URL}.CreateConnector(context.Background(), "c", map[string]string{"exactly.once.support": "required"})
			if tt.wantRefusal == nil {
				if err != nil {
					t.Fatalf("CreateConnector = %v, want nil", err)
				}
				return
			}
			refused, ok := errors.AsType[*RefusedError](err)
			if !ok || *refused != *tt.wantRefusal {
				t.Errorf("CreateConnector = %v, want %v", err, tt.wantRefusal)
			}
		})
	}
}
