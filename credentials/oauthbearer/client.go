package oauthbearer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// ClientCredentials fetches tokens from an OAuth 2.0 token endpoint with the client-credentials
// grant (RFC 6749 section 4.4), as managed Kafka services hand them out. A token is kept until
// RefreshFactor of its lifetime has passed and fetched anew at the next connection after that, so
// connections made late in a token's life do not carry one that expires at once, and established
// connections are left alone (kafka-go does not re-authenticate them; a broker that sets
// connections.max.reauth.ms closes them when their token expires, and the next one gets the new
// token). A failing endpoint is asked again with backoff until the caller's context ends; while
// it fails, a token not yet expired is still used.
type ClientCredentials struct {
	URL      string
	ClientID string
	Secret   func() (string, error) // read for every fetch, so a rotated secret is used at the next one
	Scope    string                 // space-separated; empty for the endpoint's default
	// Key names the config key of URL in errors, e.g. kafka.sasl.oauthbearer.token_endpoint_url.
	Key string
	// HTTP is the client of the endpoint; a client with a 10s timeout when nil.
	HTTP *http.Client
	// RefreshFactor is the part of a token's lifetime after which it is fetched anew; 0.8 when 0.
	RefreshFactor float64

	once    sync.Once
	turn    chan struct{} // held by the one fetch at a time; a channel, so that waiting honours ctx
	token   string
	refresh time.Time // fetch anew from then on
	expiry  time.Time // no use after then
}

// Token returns the current token, fetching a new one when the current one is due for refresh.
func (c *ClientCredentials) Token(ctx context.Context) (string, error) {
	// One fetch at a time: the connections opened at once share its token.
	c.once.Do(func() { c.turn = make(chan struct{}, 1) })
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("config key %s: waiting for a token: %w", c.Key, context.Cause(ctx))
	}
	defer func() { <-c.turn }()
	now := time.Now()
	if c.token != "" && now.Before(c.refresh) {
		return c.token, nil
	}
	backoff := 100 * time.Millisecond
	for {
		err := c.fetch(ctx)
		if err == nil {
			return c.token, nil
		}
		var final *refusedError
		if errors.As(err, &final) {
			return "", &AuthError{Err: err} // bad credentials: asking again gives the same answer
		}
		if c.token != "" && time.Now().Before(c.expiry) {
			return c.token, nil // the endpoint is down, the token still good: refresh at the next connection
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w (gave up: %v)", err, context.Cause(ctx))
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// refusedError is an answer of the endpoint that retrying does not change (400 or 401: wrong
// client id, secret or scope).
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

func (c *ClientCredentials) fetch(ctx context.Context) error {
	secret, err := c.Secret()
	if err != nil {
		return err
	}
	form := url.Values{"grant_type": {"client_credentials"}}
	if c.Scope != "" {
		form.Set("scope", c.Scope)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, strings.NewReader(form.Encode()))
	if err != nil {
		return fmt.Errorf("config key %s: %w", c.Key, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	// RFC 6749 section 2.3.1: the client id and secret form-encoded, then as HTTP Basic.
	req.SetBasicAuth(url.QueryEscape(c.ClientID), url.QueryEscape(secret))
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		// url.Error quotes the URL, never the form or the header.
		return fmt.Errorf("config key %s: token endpoint: %w", c.Key, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("config key %s: token endpoint %s: read the answer: %w", c.Key, redacted(c.URL), err)
	}
	var answer struct {
		AccessToken string          `json:"access_token"`
		ExpiresIn   json.RawMessage `json:"expires_in"`
		Error       string          `json:"error"`
		Description string          `json:"error_description"`
	}
	_ = json.Unmarshal(body, &answer)
	if resp.StatusCode != http.StatusOK {
		why := strings.TrimSpace(answer.Error + " " + answer.Description)
		if why == "" {
			why = "no OAuth error in the answer"
		}
		msg := fmt.Sprintf("config key %s: token endpoint %s answered %s (%s): check kafka.sasl.oauthbearer.client_id, client_secret_file and scope",
			c.Key, redacted(c.URL), resp.Status, why)
		if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnauthorized {
			return &refusedError{msg}
		}
		return errors.New(msg)
	}
	if answer.AccessToken == "" {
		return fmt.Errorf("config key %s: token endpoint %s answered without an access_token", c.Key, redacted(c.URL))
	}
	var seconds float64
	if err := json.Unmarshal(answer.ExpiresIn, &seconds); err != nil {
		var s string
		if json.Unmarshal(answer.ExpiresIn, &s) == nil {
			_, err = fmt.Sscan(s, &seconds)
		}
		if err != nil || seconds <= 0 {
			seconds = 3600 // RFC 6749 leaves expires_in optional; the broker still checks exp
		}
	}
	factor := c.RefreshFactor
	if factor <= 0 || factor >= 1 {
		factor = 0.8
	}
	life := time.Duration(seconds * float64(time.Second))
	c.token = answer.AccessToken
	c.expiry = start.Add(life)
	c.refresh = start.Add(time.Duration(float64(life) * factor))
	return nil
}

// redacted is rawURL as errors may show it: without a password in its user information (the
// endpoint's configured URL, which an operator may have written with one).
func redacted(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
