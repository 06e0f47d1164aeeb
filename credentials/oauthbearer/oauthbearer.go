// Package oauthbearer is the SASL OAUTHBEARER mechanism (RFC 7628) for kafka-go, which has none:
// the client's first message carries a bearer token, and a broker that refuses it answers with a
// JSON error that this package turns into an error naming the broker's status. Where the token
// comes from is the caller's: a Token function asked once per authentication (kafka-go starts
// one per new connection), so a token read from a file or fetched from an OAuth token endpoint
// is fresh at every connection.
//
// Tokens never appear in what this package returns.
package oauthbearer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// AuthError is a token the broker will not take (refused, expired, or none to be had): it reads
// as its own message and is a kafka.SASLAuthenticationFailed, so that the relay treats it as
// refused credentials (fatal at the start, retried in place while streaming).
type AuthError struct {
	Err error
	// Status is the broker's RFC 7628 status (e.g. invalid_token); empty when the token was not
	// sent (expired, or the token endpoint refused the client).
	Status string
}

// KeyRollover reports whether err is a broker's refusal of a token as invalid: what a broker
// answers while it fetches its identity provider's keys for a token signed by a key it has not
// seen yet (Kafka's validator fetches them then, and refuses that token meanwhile).
func KeyRollover(err error) bool {
	var ae *AuthError
	return errors.As(err, &ae) && ae.Status == "invalid_token"
}

func (e *AuthError) Error() string { return e.Err.Error() }

// Unwrap is both the cause and kafka.SASLAuthenticationFailed.
func (e *AuthError) Unwrap() []error { return []error{e.Err, kafka.SASLAuthenticationFailed} }

// Token returns the bearer token of one authentication.
type Token func(ctx context.Context) (string, error)

// Mechanism is OAUTHBEARER with tokens from Token. Refused, when set, wraps the broker's refusal
// so that the error names what fixes it (the config key the token comes from).
type Mechanism struct {
	Token   Token
	Refused func(status string) error
}

// Name is the mechanism's SASL name.
func (Mechanism) Name() string { return "OAUTHBEARER" }

// Start sends the client's first message: the GS2 header without an authorization identity, then
// the auth key-value pair (RFC 7628 section 3.1).
func (m Mechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	tok, err := m.Token(ctx)
	if err != nil {
		return nil, nil, err
	}
	if tok == "" || strings.ContainsAny(tok, "\x01 \r\n") {
		return nil, nil, fmt.Errorf("oauthbearer: the token is empty or holds a space, a line break or a control character: not a bearer token")
	}
	return session{refused: m.Refused}, []byte("n,,\x01auth=Bearer " + tok + "\x01\x01"), nil
}

type session struct{ refused func(status string) error }

// Next reads the broker's answer: nothing when it accepted the token, its error JSON when not
// (RFC 7628 section 3.2.2). The exchange is not finished with the %x01 the RFC asks for: the
// connection is closed at once, and the broker's answer to %x01 would only repeat the refusal
// without the status.
func (s session) Next(_ context.Context, challenge []byte) (bool, []byte, error) {
	if len(challenge) == 0 {
		return true, nil, nil
	}
	var answer struct {
		Status string `json:"status"`
		Scope  string `json:"scope"`
	}
	status := "unreadable error"
	if json.Unmarshal(challenge, &answer) == nil && answer.Status != "" {
		status = answer.Status
		if answer.Scope != "" {
			status += ", scope " + answer.Scope
		}
	}
	if s.refused != nil {
		return false, nil, &AuthError{Err: s.refused(status), Status: answer.Status}
	}
	return false, nil, &AuthError{Err: fmt.Errorf("oauthbearer: the broker refused the token (%s)", status), Status: answer.Status}
}
