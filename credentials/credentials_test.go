package credentials_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/credentials"
	"github.com/outbox-relay/outbox-relay/credentials/oauthbearer"
	"github.com/outbox-relay/outbox-relay/internal/testpki"
)

func TestReadSecretTakesTheFileWithoutItsLineBreakAndRefusesWhatIsNoPassword(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	big := strings.Repeat("x", 64<<10+1)
	for _, tc := range []struct {
		name, content, want, wantErr string
	}{
		{name: "a bare password is the password", content: "s3cret", want: "s3cret"},
		{name: "a trailing newline is dropped", content: "s3cret\n", want: "s3cret"},
		{name: "a trailing CRLF is dropped", content: "s3cret\r\n", want: "s3cret"},
		{name: "spaces are part of the password", content: " s3 cret \n", want: " s3 cret "},
		{name: "an empty file is an error", content: "\n", wantErr: "is empty"},
		{name: "a huge file is an error", content: big, wantErr: "not a password file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := credentials.ReadSecret("pg_password_file", write("f", tc.content))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "pg_password_file") {
					t.Fatalf("error %v, want one naming pg_password_file with %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), strings.TrimSpace(tc.content)) && strings.TrimSpace(tc.content) != "" {
					t.Errorf("error quotes the file's content: %v", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("a missing file names the key and the path", func(t *testing.T) {
		_, err := credentials.ReadSecret("kafka.sasl.password_file", filepath.Join(dir, "missing"))
		if err == nil || !strings.Contains(err.Error(), "kafka.sasl.password_file") || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("error %v", err)
		}
	})
}

func TestPostgresConfigReadsThePasswordFileEveryTime(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pw")
	dsn := "postgres://relay@db.example.com:5432/app?sslmode=verify-full&sslrootcert=system"
	for _, pw := range []string{"first-password", "rotated-password"} {
		if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := credentials.PostgresConfig(dsn, file)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Password != pw || cfg.User != "relay" || cfg.Host != "db.example.com" || cfg.TLSConfig == nil {
			t.Fatalf("config user %q host %q password %q tls %v, want password %q", cfg.User, cfg.Host, cfg.Password, cfg.TLSConfig != nil, pw)
		}
	}
	if _, err := credentials.PostgresConfig("postgres://relay:in-the-dsn@db:5432/app", ""); err != nil {
		t.Fatalf("without a file the DSN's password is used: %v", err)
	}
	_, err := credentials.PostgresConfig("postgres://relay:hunter22@db:bad-port/app", "")
	if err == nil || !strings.Contains(err.Error(), "pg_dsn") || strings.Contains(err.Error(), "hunter22") {
		t.Fatalf("a bad DSN: %v, want an error naming pg_dsn without the password", err)
	}
}

func TestTheSASLPasswordFileIsReadForEveryAuthentication(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("first-password"), 0o600); err != nil {
		t.Fatal(err)
	}
	mech, err := credentials.KafkaMechanism(credentials.KafkaSASL{Mechanism: "PLAIN", Username: "relay", PasswordFile: file})
	if err != nil {
		t.Fatal(err)
	}
	for _, pw := range []string{"first-password", "rotated-password"} {
		if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// PLAIN's first message is "\x00user\x00password": what the broker would check.
		_, ir, err := mech.Start(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if string(ir) != "\x00relay\x00"+pw {
			t.Fatalf("PLAIN sent %q, want the password %q from the file as it is now", ir, pw)
		}
	}
	if mech.Name() != "PLAIN" {
		t.Errorf("name %q", mech.Name())
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if _, err := credentials.KafkaMechanism(credentials.KafkaSASL{Mechanism: "SCRAM-SHA-512", Username: "relay", PasswordFile: file}); err == nil ||
		!strings.Contains(err.Error(), "kafka.sasl.password_file") {
		t.Fatalf("a missing file at start: %v, want an error naming kafka.sasl.password_file", err)
	}
}

// tlsServer accepts TLS connections with the certificate that cert returns at the time, completes
// each handshake and closes.
func tlsServer(t *testing.T, cert func() testpki.Pair, clientCAs *x509.CertPool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p := cert()
			kp, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
			if err != nil {
				c.Close()
				continue
			}
			cfg := &tls.Config{Certificates: []tls.Certificate{kp}}
			if clientCAs != nil {
				cfg.ClientCAs, cfg.ClientAuth = clientCAs, tls.RequireAndVerifyClientCert
			}
			go func() {
				s := tls.Server(c, cfg)
				_ = s.SetDeadline(time.Now().Add(10 * time.Second))
				if s.Handshake() == nil {
					_, _ = s.Write([]byte("ok"))
				}
				s.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// dial connects like kafka-go does: the configuration cloned with the host as ServerName. It
// reads a byte, which is where a TLS 1.3 client learns that the server refused its certificate.
func dial(addr, serverName string, cfg *tls.Config) error {
	cfg = cfg.Clone()
	cfg.ServerName = serverName
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 2))
	return err
}

func TestKafkaTLSSendsTheClientCertificateAsItIsAtEachHandshake(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	addr := tlsServer(t, func() testpki.Pair { return ca.Localhost(t) }, pool)
	caFile := ca.WriteCA(t, dir, "ca")
	// First a certificate of a CA the server does not trust, then a good one in the same files.
	client := testpki.NewCA(t, "stranger").Issue(t, testpki.Leaf{CommonName: "relay", Client: true}).Write(t, dir, "client")
	cfg, err := credentials.KafkaTLS{Enabled: true, CAFile: caFile, CertFile: client.Cert, KeyFile: client.Key}.Config()
	if err != nil {
		t.Fatal(err)
	}
	err = dial(addr, "127.0.0.1", cfg)
	if line, ok := credentials.ExplainTLS(err, credentials.KafkaTLSKeys); !ok || !strings.Contains(line, "kafka.tls.cert_file") {
		t.Fatalf("a refused client certificate: %v, explained %q %v", err, line, ok)
	}
	ca.Issue(t, testpki.Leaf{CommonName: "relay", Client: true}).Write(t, dir, "client")
	if err := dial(addr, "127.0.0.1", cfg); err != nil {
		t.Fatalf("after the client certificate was renewed: %v", err)
	}
	if _, err := (credentials.KafkaTLS{Enabled: true, CertFile: client.Cert, KeyFile: filepath.Join(dir, "nope")}).Config(); err == nil ||
		!strings.Contains(err.Error(), "kafka.tls.key_file") {
		t.Fatalf("a missing key file at start: %v", err)
	}
}

func TestEveryBadCertificateIsExplainedInOneLineNamingTheKeyToFix(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	caFile := ca.WriteCA(t, dir, "ca")
	expired := ca.Issue(t, testpki.Leaf{CommonName: "127.0.0.1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	for _, tc := range []struct {
		name       string
		serverCert testpki.Pair
		addr       string
		serverName string
		caFile     string
		want       []string
	}{
		{name: "a certificate of another CA names the CA bundle", serverCert: testpki.NewCA(t, "other").Localhost(t), serverName: "127.0.0.1",
			want: []string{"authority the relay does not trust", `issued by "CN=other`, "kafka.tls.ca_file"}},
		{name: "an expired certificate says so", serverCert: expired, serverName: "127.0.0.1",
			want: []string{"has expired", "renew it", "kafka.tls.ca_file"}},
		{name: "a certificate for another name names the addresses", serverCert: ca.Localhost(t), serverName: "localhost",
			want: []string{"not for the name", "localhost", "kafka_brokers"}},
		{name: "a server without TLS names the switch", addr: plain.Addr().String(), serverName: "127.0.0.1",
			want: []string{"does not speak TLS", "kafka.tls.enabled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.addr
			if addr == "" {
				addr = tlsServer(t, func() testpki.Pair { return tc.serverCert }, nil)
			}
			cfg, err := credentials.KafkaTLS{Enabled: true, CAFile: caFile}.Config()
			if err != nil {
				t.Fatal(err)
			}
			err = dial(addr, tc.serverName, cfg)
			line, ok := credentials.ExplainTLS(err, credentials.KafkaTLSKeys)
			if !ok {
				t.Fatalf("%v: not explained", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q lacks %q", line, w)
				}
			}
			if strings.Contains(line, "\n") {
				t.Errorf("more than one line: %q", line)
			}
			t.Logf("%s", line)
		})
	}
	t.Run("a network error is not a TLS problem", func(t *testing.T) {
		if _, ok := credentials.ExplainTLS(&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, credentials.KafkaTLSKeys); ok {
			t.Error("a refused connection was explained as a TLS problem: it must be retried")
		}
	})
}

// The broker's refusal of a token from the token endpoint names the endpoint, without a password
// an operator wrote into its URL.
func TestARefusedEndpointTokenNamesTheEndpointWithoutItsPassword(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := credentials.KafkaMechanism(credentials.KafkaSASL{Mechanism: "OAUTHBEARER", OAuthBearer: credentials.OAuthBearer{
		TokenEndpointURL: "https://relay:url-secret@idp.example/token", ClientID: "relay", ClientSecretFile: secret}})
	if err != nil {
		t.Fatal(err)
	}
	ob, ok := m.(oauthbearer.Mechanism)
	if !ok || ob.Refused == nil {
		t.Fatalf("mechanism %T without a Refused message", m)
	}
	msg := ob.Refused("invalid_token").Error()
	if !strings.Contains(msg, "idp.example/token") || strings.Contains(msg, "url-secret") {
		t.Fatalf("%q: want the endpoint named without its password", msg)
	}
}
