package credentials

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// KafkaTLS is kafka.tls.*.
type KafkaTLS struct {
	Enabled            bool
	CAFile             string // empty: the system roots
	CertFile, KeyFile  string // a client certificate for mutual TLS; both or neither
	InsecureSkipVerify bool
}

// Config returns the TLS configuration of every connection to the brokers, nil when TLS is off.
// It reads the files now, so a missing or malformed one fails the start naming its key. The client
// certificate and key are read again for every handshake, so a renewed certificate (cert-manager
// renews them in place) is used from the next connection on. The CA bundle is read once: Go
// verifies against a fixed pool, and the only way around that (InsecureSkipVerify and a check of
// one's own) would lose the broker's name when it is an IP address; a new CA takes a restart.
// The sink's connections and its readiness probes share this configuration.
func (k KafkaTLS) Config() (*tls.Config, error) {
	if !k.Enabled {
		return nil, nil
	}
	out := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: k.InsecureSkipVerify}
	if k.CAFile != "" && !k.InsecureSkipVerify {
		pool, err := readCA(k.CAFile)
		if err != nil {
			return nil, err
		}
		out.RootCAs = pool
	}
	if k.CertFile != "" || k.KeyFile != "" {
		if _, err := loadKeyPair(k.CertFile, k.KeyFile); err != nil {
			return nil, err
		}
		out.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return loadKeyPair(k.CertFile, k.KeyFile)
		}
	}
	return out, nil
}

func readCA(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config key kafka.tls.ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("config key kafka.tls.ca_file: %s holds no PEM certificate", path)
	}
	return pool, nil
}

func loadKeyPair(certFile, keyFile string) (*tls.Certificate, error) {
	if certFile == "" || keyFile == "" {
		return nil, fmt.Errorf("config keys kafka.tls.cert_file and kafka.tls.key_file go together: set both or neither")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("config keys kafka.tls.cert_file and kafka.tls.key_file: %w", err)
	}
	return &cert, nil
}

// KafkaSASL is kafka.sasl.*.
type KafkaSASL struct {
	Mechanism    string // "", PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER
	Username     string
	Password     string
	PasswordFile string // read for every authentication; instead of Password
	OAuthBearer  OAuthBearer
}

// OAuthBearer is kafka.sasl.oauthbearer.*: a token from a file, or from a token endpoint with the
// client-credentials grant.
type OAuthBearer struct {
	TokenFile        string // read for every authentication
	TokenEndpointURL string
	ClientID         string
	ClientSecretFile string // read for every fetch of a token
	Scope            string
}

// KafkaMechanism returns the SASL mechanism of every connection to the brokers, nil without SASL.
// With a password file, the file is read now (a missing one fails the start naming its key) and
// again for every connection's authentication, so a rotated password is used from the next
// connection on.
func KafkaMechanism(c KafkaSASL) (sasl.Mechanism, error) {
	if c.Mechanism == "" {
		return nil, nil
	}
	if c.Mechanism == "OAUTHBEARER" {
		return oauthMechanism(c.OAuthBearer)
	}
	build, err := mechanism(c.Mechanism)
	if err != nil {
		return nil, err
	}
	if c.PasswordFile == "" {
		return build(c.Username, c.Password)
	}
	pw, err := ReadSecret("kafka.sasl.password_file", c.PasswordFile)
	if err != nil {
		return nil, err
	}
	if _, err := build(c.Username, pw); err != nil {
		return nil, err
	}
	return &filePassword{name: c.Mechanism, user: c.Username, file: c.PasswordFile, build: build}, nil
}

type mechanismFunc func(user, password string) (sasl.Mechanism, error)

func mechanism(name string) (mechanismFunc, error) {
	switch name {
	case "PLAIN":
		return func(user, password string) (sasl.Mechanism, error) {
			return plain.Mechanism{Username: user, Password: password}, nil
		}, nil
	case "SCRAM-SHA-256", "SCRAM-SHA-512":
		algo := scram.SHA256
		if name == "SCRAM-SHA-512" {
			algo = scram.SHA512
		}
		return func(user, password string) (sasl.Mechanism, error) {
			m, err := scram.Mechanism(algo, user, password)
			if err != nil {
				// SASLprep refuses some characters; the error does not quote the password.
				return nil, fmt.Errorf("config key kafka.sasl.mechanism %s: %w", name, err)
			}
			return m, nil
		}, nil
	}
	return nil, fmt.Errorf("config key kafka.sasl.mechanism: unsupported %q: want PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER", name)
}

// filePassword is a SASL mechanism whose password is read from a file at the start of every
// authentication (kafka-go starts one per new connection).
type filePassword struct {
	name, user, file string
	build            mechanismFunc
}

func (m *filePassword) Name() string { return m.name }

func (m *filePassword) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	pw, err := ReadSecret("kafka.sasl.password_file", m.file)
	if err != nil {
		return nil, nil, err
	}
	mech, err := m.build(m.user, pw)
	if err != nil {
		return nil, nil, err
	}
	return mech.Start(ctx)
}

// KafkaTLSKeys names what fixes a TLS failure of a connection to a broker.
var KafkaTLSKeys = TLSKeys{
	Peer:    "the broker",
	CA:      "kafka.tls.ca_file",
	Cert:    "kafka.tls.cert_file and kafka.tls.key_file",
	Address: "kafka_brokers",
	Enabled: "kafka.tls.enabled",
}
