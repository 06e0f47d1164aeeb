package main

// SASL OAUTHBEARER against a real broker that validates signed JWTs with Kafka's own validator
// (OAuthBearerValidatorCallbackHandler) against a JWKS endpoint this test serves with keys it
// makes, and a token endpoint this test serves for the client-credentials grant. One broker for
// all the cases.

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/credentials"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/netproxy"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testpki"
)

const (
	oauthAudience     = "outbox-kafka"
	oauthIssuer       = "https://idp.example.test"
	oauthClientID     = "relay-client"
	oauthClientSecret = "oauth-client-secret-7e1d"
)

// identityProvider is the JWKS and token endpoints of the test: signing keys by kid, the kid that
// signs now, and how many tokens the token endpoint handed out.
type identityProvider struct {
	t       *testing.T
	mu      sync.Mutex
	keys    map[string]*rsa.PrivateKey
	signing string
	life    time.Duration // of the token endpoint's tokens
	fetches atomic.Int32
	jwks    *httptest.Server
	tokens  *httptest.Server
}

func newIdentityProvider(t *testing.T) *identityProvider {
	p := &identityProvider{t: t, keys: map[string]*rsa.PrivateKey{}, life: time.Hour}
	p.rotate("k1")
	p.jwks = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		var keys []map[string]string
		for kid, k := range p.keys {
			keys = append(keys, map[string]string{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
				"n": base64.RawURLEncoding.EncodeToString(k.N.Bytes()),
				"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(k.E)).Bytes())})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": keys})
	}))
	t.Cleanup(p.jwks.Close)
	p.tokens = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, secret, _ := r.BasicAuth()
		if r.Method != http.MethodPost || r.FormValue("grant_type") != "client_credentials" || id != oauthClientID || secret != oauthClientSecret {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
			return
		}
		p.fetches.Add(1)
		p.mu.Lock()
		life := p.life
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": p.token(p.current(), time.Now().Add(life)),
			"token_type": "Bearer", "expires_in": life.Seconds()})
	}))
	t.Cleanup(p.tokens.Close)
	return p
}

// rotate makes a new signing key kid and publishes it alone: tokens signed by the old key are
// refused from the broker's next JWKS refresh on.
func (p *identityProvider) rotate(kid string) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys = map[string]*rsa.PrivateKey{kid: k}
	p.signing = kid
}

func (p *identityProvider) current() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.signing
}

// token signs a JWT with key kid, or with a key the JWKS never published when kid is unknown.
func (p *identityProvider) token(kid string, exp time.Time) string {
	p.mu.Lock()
	key := p.keys[kid]
	p.mu.Unlock()
	if key == nil {
		var err error
		if key, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			p.t.Fatal(err)
		}
	}
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	now := time.Now()
	signed := enc(map[string]string{"alg": "RS256", "typ": "JWT", "kid": kid}) + "." +
		enc(map[string]any{"iss": oauthIssuer, "sub": "outbox-relay", "aud": oauthAudience, "iat": now.Add(-time.Minute).Unix(), "exp": exp.Unix(), "scope": "kafka"})
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		p.t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// oauthBroker starts a broker whose SASL_PLAINTEXT listener and SASL_SSL listeners OAUTH_TLS and
// OAUTH_PROXY accept OAUTHBEARER tokens that Kafka's validator checks against p's JWKS. OAUTH_PROXY
// sits behind a proxy the broker advertises, so that a case can cut the relay's connections: the
// relay then opens new ones, authenticated with the token it reads then.
func oauthBroker(t *testing.T, p *identityProvider, server testpki.Files) (*devenv.Kafka, *netproxy.Proxy) {
	port := freePort(t)
	proxy := netproxy.New(t, "127.0.0.1:"+strconv.Itoa(port))
	settings := map[string]string{
		"sasl.enabled.mechanisms":            "SCRAM-SHA-512,OAUTHBEARER",
		"sasl.oauthbearer.jwks.endpoint.url": p.jwks.URL,
		"sasl.oauthbearer.expected.audience": oauthAudience,
		"sasl.oauthbearer.expected.issuer":   oauthIssuer,
	}
	for _, l := range []string{"sasl_plaintext", "oauth_tls", "oauth_proxy"} {
		settings["listener.name."+l+".oauthbearer.sasl.jaas.config"] = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
		settings["listener.name."+l+".oauthbearer.sasl.server.callback.handler.class"] = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
	}
	start := time.Now()
	k := testenv.Kafka(t, devenv.KafkaOptions{
		// The SCRAM user only makes the SASL listeners; OAUTHBEARER is what the cases use.
		SCRAMUsers: map[string]string{"unused": "unused-scram-2c9a"},
		TLSListeners: []devenv.KafkaTLSListener{
			{Name: "OAUTH_TLS", CertFile: server.Cert, KeyFile: server.Key, SASL: true},
			{Name: "OAUTH_PROXY", CertFile: server.Cert, KeyFile: server.Key, SASL: true, Port: port, Advertised: proxy.Addr},
		},
		Settings: settings,
		// Kafka 4 fetches from no OAuth URL that is not listed.
		SystemProperties: map[string]string{"org.apache.kafka.sasl.oauthbearer.allowed.urls": p.jwks.URL},
	})
	t.Logf("broker with OAUTHBEARER started in %s", time.Since(start).Round(time.Millisecond))
	return k, proxy
}

// authenticate opens a fresh connection to addr with the relay's OAUTHBEARER mechanism for c and
// asks for metadata: one authentication.
func authenticate(ctx context.Context, addr string, c credentials.OAuthBearer, tlsOn bool, caFile string) error {
	mech, err := credentials.KafkaMechanism(credentials.KafkaSASL{Mechanism: "OAUTHBEARER", OAuthBearer: c})
	if err != nil {
		return err
	}
	tlsCfg, err := credentials.KafkaTLS{Enabled: tlsOn, CAFile: caFile}.Config()
	if err != nil {
		return err
	}
	tr := &kafka.Transport{SASL: mech, TLS: tlsCfg, DialTimeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	_, err = (&kafka.Client{Addr: kafka.TCP(addr), Transport: tr, Timeout: 10 * time.Second}).
		Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
	return err
}

func TestOAuthBearerAgainstABrokerThatValidatesJWTs(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "outbox-relay test CA")
	caFile := ca.WriteCA(t, dir, "ca")
	p := newIdentityProvider(t)
	k, proxy := oauthBroker(t, p, ca.Localhost(t).Write(t, dir, "server"))
	pg := testenv.SharedPostgres(t)
	secretFile := filepath.Join(dir, "client-secret")
	writeSecret(t, secretFile, oauthClientSecret)
	ctx := context.Background()
	noSecrets := func(t *testing.T, what, out string, tokens ...string) {
		t.Helper()
		for _, s := range append(tokens, oauthClientSecret) {
			if strings.Contains(out, s) {
				t.Errorf("%s reveals a token or secret:\n%s", what, out)
			}
		}
	}

	t.Run("a token file over SASL_PLAINTEXT streams end to end", func(t *testing.T) {
		t.Parallel() // after the sequential cases, with the signing key they leave
		f := newHAFixture(t, pg, k.Brokers(), 2)
		tokenFile := filepath.Join(t.TempDir(), "token")
		tok := p.token(p.current(), time.Now().Add(time.Hour))
		writeSecret(t, tokenFile, tok)
		r := f.start("relay-oauth-file", map[string]string{"OUTBOX_KAFKA_BROKERS": k.SASLBrokers(),
			"OUTBOX_KAFKA_SASL_MECHANISM": "OAUTHBEARER", "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_FILE": tokenFile})
		logOnFailure(t, f, r)
		f.waitStreamer(t, r, haStartTimeout)
		writeEvents(t, f, 20, "oauth")
		t.Logf("token file: %s", f.verify(t, k.Brokers()))
		r.stop(t)
		noSecrets(t, "relay output", r.Output(), tok)
	})

	t.Run("an expired token in the file while streaming is logged naming the key, retried, and the relay resumes with nothing lost when the file is fixed", func(t *testing.T) {
		t.Parallel() // after the sequential cases, with the signing key they leave
		f := newHAFixture(t, pg, k.Brokers(), 2)
		tokenFile := filepath.Join(t.TempDir(), "token")
		good := p.token(p.current(), time.Now().Add(time.Hour))
		writeSecret(t, tokenFile, good)
		r := f.start("relay-oauth-reconnect", map[string]string{"OUTBOX_KAFKA_BROKERS": proxy.Addr,
			"OUTBOX_KAFKA_TLS_ENABLED": "true", "OUTBOX_KAFKA_TLS_CA_FILE": caFile,
			"OUTBOX_KAFKA_SASL_MECHANISM": "OAUTHBEARER", "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_FILE": tokenFile})
		logOnFailure(t, f, r)
		f.waitStreamer(t, r, haStartTimeout)
		writeEvents(t, f, 20, "before")
		t.Logf("before: %s", f.verify(t, k.Brokers()))

		expired := p.token(p.current(), time.Now().Add(-time.Minute))
		writeSecret(t, tokenFile, expired)
		proxy.Cut() // every new connection reads the expired token
		writeEvents(t, f, 20, "while expired")
		l := r.waitLog(t, 30*time.Second, "error", "kafka refused the relay's credentials")
		msg, _ := l["error"].(string)
		for _, want := range []string{"kafka.sasl.oauthbearer.token_file", "expired", "write a fresh token"} {
			if !strings.Contains(msg, want) {
				t.Errorf("the retried error lacks %q: %v", want, l)
			}
		}
		t.Logf("while the token is expired: %s", msg)

		fresh := p.token(p.current(), time.Now().Add(time.Hour))
		writeSecret(t, tokenFile, fresh)
		writeEvents(t, f, 20, "after")
		t.Logf("after the file is fixed: %s", f.verify(t, k.Brokers()))
		r.stop(t)
		noSecrets(t, "relay output", r.Output(), good, expired, fresh)
	})

	t.Run("the client-credentials grant over SASL_SSL streams end to end", func(t *testing.T) {
		f := newHAFixture(t, pg, k.Brokers(), 2)
		r := f.start("relay-oauth-cc", map[string]string{"OUTBOX_KAFKA_BROKERS": k.ListenerAddr("OAUTH_TLS"),
			"OUTBOX_KAFKA_TLS_ENABLED": "true", "OUTBOX_KAFKA_TLS_CA_FILE": caFile,
			"OUTBOX_KAFKA_SASL_MECHANISM":                      "OAUTHBEARER",
			"OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": p.tokens.URL,
			"OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_ID":          oauthClientID,
			"OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE": secretFile,
			"OUTBOX_KAFKA_SASL_OAUTHBEARER_SCOPE":              "kafka"})
		logOnFailure(t, f, r)
		f.waitStreamer(t, r, haStartTimeout)
		writeEvents(t, f, 20, "oauth-cc")
		t.Logf("client credentials: %s", f.verify(t, k.Brokers()))
		r.stop(t)
		noSecrets(t, "relay output", r.Output())
	})

	t.Run("a token is fetched again before it expires, once for many connections", func(t *testing.T) {
		p.mu.Lock()
		p.life = 4 * time.Second
		p.mu.Unlock()
		t.Cleanup(func() { p.mu.Lock(); p.life = time.Hour; p.mu.Unlock() })
		mech, err := credentials.KafkaMechanism(credentials.KafkaSASL{Mechanism: "OAUTHBEARER", OAuthBearer: credentials.OAuthBearer{
			TokenEndpointURL: p.tokens.URL, ClientID: oauthClientID, ClientSecretFile: secretFile}})
		if err != nil {
			t.Fatal(err)
		}
		connect := func() {
			t.Helper()
			tr := &kafka.Transport{SASL: mech, DialTimeout: 5 * time.Second}
			defer tr.CloseIdleConnections()
			if _, err := (&kafka.Client{Addr: kafka.TCP(k.SASLBrokers()), Transport: tr, Timeout: 10 * time.Second}).
				Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}}); err != nil {
				t.Fatal(err)
			}
		}
		before, first := p.fetches.Load(), time.Now()
		for range 5 {
			connect()
		}
		if got := p.fetches.Load() - before; got != 1 {
			t.Fatalf("5 connections within a token's life fetched %d tokens, want 1", got)
		}
		// Past 80% of the 4s lifetime, but before expiry, the next connection fetches anew.
		time.Sleep(time.Until(first.Add(3300 * time.Millisecond))) // the token's age is the condition; nothing to wait on
		connect()
		if got := p.fetches.Load() - before; got != 2 {
			t.Fatalf("a connection past 80%% of the token's life made %d fetches in all, want 2", got)
		}
	})

	t.Run("a relay started with a token signed by a rotated key streams end to end once the broker has fetched the new key", func(t *testing.T) {
		// Kafka's validator fetches the JWKS again when a token names a key it has not seen, and
		// refuses that token meanwhile: the relay tries again for a few seconds rather than
		// calling the token wrong. OAUTH_TLS last saw tokens signed by k1.
		p.rotate("k2")
		f := newHAFixture(t, pg, k.Brokers(), 2)
		tokenFile := filepath.Join(t.TempDir(), "token")
		tok := p.token("k2", time.Now().Add(time.Hour))
		writeSecret(t, tokenFile, tok)
		r := f.start("relay-oauth-rotated", map[string]string{"OUTBOX_KAFKA_BROKERS": k.ListenerAddr("OAUTH_TLS"),
			"OUTBOX_KAFKA_TLS_ENABLED": "true", "OUTBOX_KAFKA_TLS_CA_FILE": caFile,
			"OUTBOX_KAFKA_SASL_MECHANISM": "OAUTHBEARER", "OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_FILE": tokenFile})
		logOnFailure(t, f, r)
		f.waitStreamer(t, r, haStartTimeout)
		writeEvents(t, f, 20, "rotated")
		t.Logf("rotated key: %s", f.verify(t, k.Brokers()))
		if l := r.findLog("warn", "fetching new signing keys"); l != nil {
			t.Logf("the broker refused the first token signed by k2: %v", l["error"])
		}
		r.stop(t)
		noSecrets(t, "relay output", r.Output(), tok)
	})

	fatal := []struct {
		name  string
		token func() string // the token file's; nil: the client-credentials grant with a wrong secret
		want  []string
	}{
		{"an expired token ends the start with one line naming the key and the fix", func() string {
			return p.token(p.current(), time.Now().Add(-time.Minute))
		}, []string{"kafka.sasl.oauthbearer.token_file", "expired", "write a fresh token"}},
		{"a token signed by an unknown key ends the start with one line naming the key and the fix", func() string {
			return p.token("unknown", time.Now().Add(time.Hour))
		}, []string{"kafka.sasl.oauthbearer.token_file", "refused the token", "invalid_token", "write a token the broker accepts"}},
		// The token endpoint's refusal: no token file; the wrong secret goes to the endpoint.
		{"a client secret the token endpoint refuses ends the start with one line naming the keys", nil,
			[]string{"kafka.sasl.oauthbearer.token_endpoint_url", "401", "invalid_client", "client_secret_file"}},
	}
	for _, c := range fatal {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newHAFixture(t, pg, k.Brokers(), 1)
			env := map[string]string{"OUTBOX_KAFKA_BROKERS": k.SASLBrokers(), "OUTBOX_KAFKA_SASL_MECHANISM": "OAUTHBEARER"}
			tok := "oauth-wrong-secret-5a0c"
			if c.token != nil {
				tokenFile := filepath.Join(t.TempDir(), "token")
				tok = c.token()
				writeSecret(t, tokenFile, tok)
				env["OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_FILE"] = tokenFile
			} else {
				wrong := filepath.Join(t.TempDir(), "client-secret")
				writeSecret(t, wrong, tok)
				env["OUTBOX_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL"] = p.tokens.URL
				env["OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_ID"] = oauthClientID
				env["OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE"] = wrong
			}
			code, out := relayproc.Run(t, relayproc.Options{Env: f.env("relay-oauth-bad", env)}, fatalBound)
			if code != 1 {
				t.Fatalf("exit status %d, want 1:\n%s", code, out)
			}
			last := out[strings.LastIndex(strings.TrimRight(out, "\n"), "\n")+1:]
			for _, want := range c.want {
				if !strings.Contains(last, want) {
					t.Errorf("last line lacks %q: %s", want, last)
				}
			}
			noSecrets(t, "relay output", out, tok)
			t.Logf("fatal line: %s", strings.TrimSpace(last))
		})
	}
}
