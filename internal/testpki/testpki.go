// Package testpki makes certificate authorities and certificates for tests of the TLS paths: a CA,
// server certificates for an address, client certificates for a principal, and the broken ones an
// operator meets (another CA, an expired certificate, a certificate for another name). Keys are
// ECDSA P-256 in PKCS#8 PEM, which Go, PostgreSQL and Kafka's PEM key stores all read.
package testpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a self-signed certificate authority.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	CertPEM []byte
}

// NewCA makes a CA valid from an hour ago for a year.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"outbox-relay tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatalf("testpki: CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testpki: CA: %v", err)
	}
	return &CA{cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Leaf describes a certificate to issue. Zero NotBefore and NotAfter mean from an hour ago for a
// year.
type Leaf struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	Client     bool // a client certificate (extended key usage clientAuth) rather than a server's
	NotBefore  time.Time
	NotAfter   time.Time
}

// Pair is an issued certificate and its key, PEM.
type Pair struct {
	CertPEM []byte
	KeyPEM  []byte // PKCS#8
}

// Issue signs a certificate for l.
func (ca *CA) Issue(t testing.TB, l Leaf) Pair {
	t.Helper()
	key := newKey(t)
	notBefore, notAfter := l.NotBefore, l.NotAfter
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-time.Hour)
	}
	if notAfter.IsZero() {
		notAfter = time.Now().Add(365 * 24 * time.Hour)
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: l.CommonName},
		DNSNames:     l.DNSNames,
		IPAddresses:  l.IPs,
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatalf("testpki: issue %s: %v", l.CommonName, err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testpki: issue %s: %v", l.CommonName, err)
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}),
	}
}

// Localhost is the server certificate for 127.0.0.1 (by address only: "localhost" is not in it, so
// connecting by that name is a host name mismatch).
func (ca *CA) Localhost(t testing.TB) Pair {
	t.Helper()
	return ca.Issue(t, Leaf{CommonName: "127.0.0.1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
}

// Files is a pair written to disk.
type Files struct {
	Cert, Key string
}

// Write writes the pair to dir as name.crt and name.key (mode 0600).
func (p Pair) Write(t testing.TB, dir, name string) Files {
	t.Helper()
	f := Files{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
	writeFile(t, f.Cert, p.CertPEM)
	writeFile(t, f.Key, p.KeyPEM)
	return f
}

// WriteCA writes the CA certificate to dir/name.crt and returns its path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name+".crt")
	writeFile(t, path, ca.CertPEM)
	return path
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("testpki: %v", err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testpki: key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatalf("testpki: serial: %v", err)
	}
	return n
}
