package credentials

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
)

// TLSKeys names, for one kind of connection, the peer and the settings that fix its TLS failures.
type TLSKeys struct {
	Peer    string // "the broker"
	CA      string // the CA bundle the peer's certificate is checked against
	Cert    string // the client certificate and key
	Address string // where the name checked against the certificate comes from
	Enabled string // what turns TLS on or off
}

// ExplainTLS returns one line saying what is wrong with a TLS connection and which setting fixes
// it, for the failures retrying cannot fix: a certificate the relay does not trust (unknown
// authority, expired, for another name), a client certificate the peer refused or wanted, a peer
// that does not speak TLS there. ok is false for anything else (a network error is retried).
func ExplainTLS(err error, k TLSKeys) (line string, ok bool) {
	if err == nil {
		return "", false
	}
	var (
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		verify   *tls.CertificateVerificationError
		record   tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &unknown):
		return fmt.Sprintf("%s's certificate is signed by an authority the relay does not trust (%s): set %s to the CA bundle that signed it",
			k.Peer, describeUnknown(unknown), k.CA), true
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return fmt.Sprintf("%s's certificate has expired or is not valid yet (%s): renew it (the relay checks it against %s)",
			k.Peer, invalid.Error(), k.CA), true
	case errors.As(err, &invalid):
		return fmt.Sprintf("%s's certificate is not valid (%s): reissue it, or set %s to the CA bundle that matches it",
			k.Peer, invalid.Error(), k.CA), true
	case errors.As(err, &hostname):
		return fmt.Sprintf("%s's certificate is not for the name the relay connected to (%s): connect by a name the certificate holds (%s), or reissue it for this one",
			k.Peer, hostname.Error(), k.Address), true
	case errors.As(err, &verify):
		return fmt.Sprintf("cannot verify %s's certificate (%s): check %s", k.Peer, verify.Err, k.CA), true
	case errors.As(err, &record):
		return fmt.Sprintf("%s does not speak TLS at that address (%s): turn TLS off with %s, or use its TLS port in %s",
			k.Peer, record.Error(), k.Enabled, k.Address), true
	}
	if alert, ok := remoteAlert(err); ok {
		switch alert {
		case "certificate required":
			return fmt.Sprintf("%s requires a client certificate (tls: %s): set %s", k.Peer, alert, k.Cert), true
		case "bad certificate", "unknown certificate authority", "unsupported certificate", "certificate revoked",
			"certificate expired", "certificate unknown", "access denied":
			return fmt.Sprintf("%s refused the relay's client certificate, or wanted one (tls: %s): set %s to a certificate it trusts, and its key",
				k.Peer, alert, k.Cert), true
		case "handshake failure", "protocol version not supported", "insufficient security":
			return fmt.Sprintf("%s refused the TLS handshake (tls: %s): it shares no TLS version or cipher suite with the relay (TLS 1.2 or later)",
				k.Peer, alert), true
		}
	}
	return "", false
}

// remoteAlert returns the TLS alert the peer sent, as crypto/tls words it ("bad certificate"): it
// reports one as a net.OpError "remote error" whose error is an unexported alert type.
func remoteAlert(err error) (string, bool) {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return "", false
	}
	alert, ok := strings.CutPrefix(op.Err.Error(), "tls: ")
	return alert, ok
}

// describeUnknown names the issuer the relay did not trust: x509's own message says only "unknown
// authority".
func describeUnknown(e x509.UnknownAuthorityError) string {
	if e.Cert == nil {
		return e.Error()
	}
	return fmt.Sprintf("%s, issued by %q", e.Error(), e.Cert.Issuer.String())
}
