package oauthbearer_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/credentials/oauthbearer"
)

func TestMechanismSpeaksRFC7628(t *testing.T) {
	m := oauthbearer.Mechanism{Token: func(context.Context) (string, error) { return "eyJ.a.b", nil }}
	sess, first, err := m.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(first), "n,,\x01auth=Bearer eyJ.a.b\x01\x01"; got != want {
		t.Fatalf("client first message %q, want %q", got, want)
	}
	if done, _, err := sess.Next(context.Background(), nil); !done || err != nil {
		t.Fatalf("an empty server answer: done %v, err %v; want done", done, err)
	}

	tests := []struct {
		name, challenge, want string
	}{
		{"the broker's error JSON gives its status", `{"status":"invalid_token"}`, "(invalid_token)"},
		{"a scope in the error JSON is named", `{"status":"insufficient_scope","scope":"kafka"}`, "insufficient_scope, scope kafka"},
		{"an answer that is not JSON is still a refusal", `garbage`, "unreadable error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sess, _, _ := m.Start(context.Background())
			done, _, err := sess.Next(context.Background(), []byte(tt.challenge))
			if done || err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("done %v, err %v; want an error with %q", done, err, tt.want)
			}
			if !errors.Is(err, kafka.SASLAuthenticationFailed) {
				t.Fatalf("%v is not a kafka.SASLAuthenticationFailed: the relay would not call it refused credentials", err)
			}
			if got, want := oauthbearer.KeyRollover(err), strings.Contains(tt.challenge, `"invalid_token"`); got != want {
				t.Fatalf("KeyRollover(%v) = %v, want %v", err, got, want)
			}
		})
	}

	t.Run("a token with a space or a line break is refused before it is sent", func(t *testing.T) {
		bad := oauthbearer.Mechanism{Token: func(context.Context) (string, error) { return "tok en\n", nil }}
		if _, _, err := bad.Start(context.Background()); err == nil || strings.Contains(err.Error(), "tok en") {
			t.Fatalf("err %v; want an error that does not quote the token", err)
		}
	})
}

// endpoint answers with the statuses in order (200 with a token of life seconds), then 200.
func endpoint(t *testing.T, life int, statuses ...int) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(calls.Add(1))
		id, secret, _ := r.BasicAuth()
		if id != "client" || secret != "s3cret" || r.FormValue("grant_type") != "client_credentials" || r.FormValue("scope") != "kafka" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"invalid_client","error_description":"unknown client"}`)
			return
		}
		if n <= len(statuses) && statuses[n-1] != http.StatusOK {
			w.WriteHeader(statuses[n-1])
			return
		}
		fmt.Fprintf(w, `{"access_token":"tok-%d","token_type":"Bearer","expires_in":%d}`, n, life)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestClientCredentials(t *testing.T) {
	secret := func() (string, error) { return "s3cret", nil }
	ctx := context.Background()

	t.Run("a failing endpoint is asked again with backoff until it answers", func(t *testing.T) {
		srv, calls := endpoint(t, 3600, 503, 500)
		c := &oauthbearer.ClientCredentials{URL: srv.URL, ClientID: "client", Secret: secret, Scope: "kafka", Key: "k"}
		tok, err := c.Token(ctx)
		if err != nil || tok != "tok-3" || calls.Load() != 3 {
			t.Fatalf("token %q, err %v after %d calls; want tok-3 after 3", tok, err, calls.Load())
		}
		if tok, _ := c.Token(ctx); tok != "tok-3" || calls.Load() != 3 {
			t.Fatalf("a token young enough was fetched again (%q, %d calls)", tok, calls.Load())
		}
	})

	t.Run("wrong client credentials are not retried and the error names the keys, not the secret", func(t *testing.T) {
		srv, calls := endpoint(t, 3600)
		c := &oauthbearer.ClientCredentials{URL: srv.URL, ClientID: "client", Scope: "kafka", Key: "kafka.sasl.oauthbearer.token_endpoint_url",
			Secret: func() (string, error) { return "wrong-secret", nil }}
		_, err := c.Token(ctx)
		if err == nil || calls.Load() != 1 || !errors.Is(err, kafka.SASLAuthenticationFailed) {
			t.Fatalf("err %v after %d calls; want one refused call", err, calls.Load())
		}
		for _, want := range []string{"kafka.sasl.oauthbearer.token_endpoint_url", "401", "invalid_client", "client_secret_file"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v lacks %q", err, want)
			}
		}
		if strings.Contains(err.Error(), "wrong-secret") {
			t.Errorf("%v reveals the secret", err)
		}
	})

	t.Run("a password in the endpoint's URL is in no error", func(t *testing.T) {
		srv, _ := endpoint(t, 3600, 503, 503, 503, 503, 503, 503, 503, 503)
		withPassword := strings.Replace(srv.URL, "://", "://relay:url-secret@", 1)
		for _, status := range []string{"401", "503"} {
			c := &oauthbearer.ClientCredentials{URL: withPassword, ClientID: "client", Scope: "kafka", Key: "k",
				Secret: func() (string, error) { return map[string]string{"503": "s3cret", "401": "wrong-secret"}[status], nil }}
			ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := c.Token(ctx)
			cancel()
			if err == nil {
				t.Fatalf("no error from an endpoint answering %s", status)
			}
			if strings.Contains(err.Error(), "url-secret") {
				t.Errorf("%v reveals the URL's password", err)
			}
		}
	})

	t.Run("a token due for refresh is still used while the endpoint is down", func(t *testing.T) {
		srv, calls := endpoint(t, 2, 200, 503, 503, 503)
		c := &oauthbearer.ClientCredentials{URL: srv.URL, ClientID: "client", Secret: secret, Scope: "kafka", Key: "k", RefreshFactor: 0.01}
		if tok, err := c.Token(ctx); err != nil || tok != "tok-1" {
			t.Fatalf("token %q, err %v", tok, err)
		}
		time.Sleep(50 * time.Millisecond) // past 1% of the 2s life: the token's age is the condition
		if tok, err := c.Token(ctx); err != nil || tok != "tok-1" || calls.Load() != 2 {
			t.Fatalf("token %q, err %v after %d calls; want tok-1 kept after one failed refresh", tok, err, calls.Load())
		}
	})

	t.Run("the caller's context bounds the retries", func(t *testing.T) {
		srv, _ := endpoint(t, 3600, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503)
		c := &oauthbearer.ClientCredentials{URL: srv.URL, ClientID: "client", Secret: secret, Scope: "kafka", Key: "k"}
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, err := c.Token(ctx); err == nil || !strings.Contains(err.Error(), "gave up") {
			t.Fatalf("err %v; want the endpoint's last error once the context ends", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("gave up after %s, long past the context's 300ms", took)
		}
	})
}
