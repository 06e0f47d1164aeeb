package credentials

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/segmentio/kafka-go/sasl"

	"github.com/outbox-relay/outbox-relay/credentials/oauthbearer"
)

// oauthMechanism is OAUTHBEARER with the token from c.TokenFile, read again for every
// authentication, or from c.TokenEndpointURL's client-credentials grant. The file, or the secret
// file, is read now, so a missing one fails the start naming its key.
func oauthMechanism(c OAuthBearer) (sasl.Mechanism, error) {
	switch {
	case c.TokenFile != "" && c.TokenEndpointURL != "":
		return nil, fmt.Errorf("config keys kafka.sasl.oauthbearer.token_file and kafka.sasl.oauthbearer.token_endpoint_url are both set: keep one")
	case c.TokenFile != "":
		if _, err := ReadSecret("kafka.sasl.oauthbearer.token_file", c.TokenFile); err != nil {
			return nil, err
		}
		const key = "kafka.sasl.oauthbearer.token_file"
		return oauthbearer.Mechanism{
			Token: func(context.Context) (string, error) {
				tok, err := ReadSecret(key, c.TokenFile)
				if err != nil {
					return "", err
				}
				if exp, ok := jwtExpiry(tok); ok && !time.Now().Before(exp) {
					return "", &oauthbearer.AuthError{Err: fmt.Errorf("config key %s: the token in %s expired at %s: write a fresh token to the file (it is read again at every connection)",
						key, c.TokenFile, exp.UTC().Format(time.RFC3339))}
				}
				return tok, nil
			},
			Refused: func(status string) error {
				return fmt.Errorf("config key %s: the broker refused the token in %s (%s): write a token the broker accepts (signed by its identity provider, for its audience) to the file (it is read again at every connection)",
					key, c.TokenFile, status)
			},
		}, nil
	case c.TokenEndpointURL != "":
		if c.ClientID == "" || c.ClientSecretFile == "" {
			return nil, fmt.Errorf("config key kafka.sasl.oauthbearer.token_endpoint_url is set, so kafka.sasl.oauthbearer.client_id and kafka.sasl.oauthbearer.client_secret_file are required")
		}
		if _, err := ReadSecret("kafka.sasl.oauthbearer.client_secret_file", c.ClientSecretFile); err != nil {
			return nil, err
		}
		const key = "kafka.sasl.oauthbearer.token_endpoint_url"
		src := &oauthbearer.ClientCredentials{URL: c.TokenEndpointURL, ClientID: c.ClientID, Scope: c.Scope, Key: key,
			Secret: func() (string, error) {
				return ReadSecret("kafka.sasl.oauthbearer.client_secret_file", c.ClientSecretFile)
			}}
		return oauthbearer.Mechanism{
			Token: src.Token,
			Refused: func(status string) error {
				return fmt.Errorf("config key %s: the broker refused the token from %s (%s): the identity provider's tokens are not what the broker expects (audience, issuer, scope: kafka.sasl.oauthbearer.scope)",
					key, redactedURL(c.TokenEndpointURL), status)
			},
		}, nil
	}
	return nil, fmt.Errorf("config key kafka.sasl.mechanism is OAUTHBEARER, so kafka.sasl.oauthbearer.token_file or kafka.sasl.oauthbearer.token_endpoint_url is required")
}

// jwtExpiry reads the exp claim of a JWT without checking its signature (the broker does): only
// to say plainly that a token has expired. ok is false for a token that is not a JWT.
func jwtExpiry(tok string) (time.Time, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(int64(*claims.Exp), 0), true
}

// redactedURL is rawURL without a password in its user information, for errors.
func redactedURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
