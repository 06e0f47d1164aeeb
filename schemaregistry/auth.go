package schemaregistry

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/outbox-relay/outbox-relay/credentials"
)

// errCredentialFile marks a request that did not go out because a credential file could not be
// read: the registry is not at fault, but the stream waits all the same (a Secret being remounted).
var errCredentialFile = errors.New("credential file unreadable")

// checkURLs returns the base URLs without a trailing slash, refusing what cannot be a registry's
// base URL with a line naming the key and the fix.
func checkURLs(urls []string) ([]string, error) {
	if len(urls) == 0 {
		return nil, errors.New("config key schema_registry.urls: empty: name the registry's base URL, e.g. http://registry:8081")
	}
	out := make([]string, 0, len(urls))
	for _, raw := range urls {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil {
			// url's error quotes the input, which may hold a password: say only where it failed.
			return nil, errors.New("config key schema_registry.urls: an entry is not a URL: want http(s)://host:port[/path]")
		}
		if u.User != nil {
			return nil, fmt.Errorf("config key schema_registry.urls: %s://%s holds credentials: put the user in schema_registry.username and the password in a file named by schema_registry.password_file", u.Scheme, u.Host)
		}
		if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("config key schema_registry.urls: %q: want http(s)://host:port[/path]", raw)
		}
		if u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("config key schema_registry.urls: %q: a base URL has no query or fragment", raw)
		}
		out = append(out, strings.TrimRight(u.String(), "/"))
	}
	return out, nil
}

// authenticator sets the Authorization header of each request from files read at that moment, so
// a rotated password or token is used from the next request on without a restart.
type authenticator struct {
	username     string
	passwordFile string
	tokenFile    string
}

func newAuthenticator(o Options) (*authenticator, error) {
	a := &authenticator{username: o.Username, passwordFile: o.PasswordFile, tokenFile: o.BearerTokenFile}
	switch {
	case (a.username == "") != (a.passwordFile == ""):
		return nil, errors.New("config keys schema_registry.username and schema_registry.password_file go together: set both or neither")
	case a.passwordFile != "" && a.tokenFile != "":
		return nil, errors.New("config keys schema_registry.password_file and schema_registry.bearer_token_file: set one, not both")
	case strings.ContainsAny(a.username, ":\r\n"):
		return nil, errors.New("config key schema_registry.username: a basic-auth user name has no ':' and no line break")
	}
	// Read now, so a missing or empty file fails the start naming its key.
	if err := a.set(&http.Request{Header: http.Header{}}); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *authenticator) set(req *http.Request) error {
	switch {
	case a.passwordFile != "":
		pw, err := credentials.ReadSecret("schema_registry.password_file", a.passwordFile)
		if err != nil {
			return fmt.Errorf("%w: %w", errCredentialFile, err)
		}
		req.SetBasicAuth(a.username, pw)
	case a.tokenFile != "":
		token, err := credentials.ReadSecret("schema_registry.bearer_token_file", a.tokenFile)
		if err != nil {
			return fmt.Errorf("%w: %w", errCredentialFile, err)
		}
		if strings.ContainsAny(token, "\r\n") {
			return fmt.Errorf("%w: config key schema_registry.bearer_token_file: %s holds more than one line", errCredentialFile, a.tokenFile)
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return nil
}

// tlsConfig is the TLS configuration of https URLs: the CA bundle of CAFile (the system's roots
// without one), and a client certificate read again for every handshake (a renewed one is used
// from the next connection on). The CA bundle is read once, as for Kafka (credentials.KafkaTLS).
func tlsConfig(o Options) (*tls.Config, error) {
	out := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("config key schema_registry.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("config key schema_registry.ca_file: %s holds no PEM certificate", o.CAFile)
		}
		out.RootCAs = pool
	}
	if o.CertFile != "" || o.KeyFile != "" {
		load := func() (*tls.Certificate, error) {
			if o.CertFile == "" || o.KeyFile == "" {
				return nil, errors.New("config keys schema_registry.cert_file and schema_registry.key_file go together: set both or neither")
			}
			cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("config keys schema_registry.cert_file and schema_registry.key_file: %w", err)
			}
			return &cert, nil
		}
		if _, err := load(); err != nil {
			return nil, err
		}
		out.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return load() }
	}
	return out, nil
}
