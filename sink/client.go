package sink

import (
	"time"

	"github.com/segmentio/kafka-go"
)

// dialTimeout bounds a connection's TCP and TLS handshake, and its SASL authentication.
const dialTimeout = 5 * time.Second

// NewClient is the one way the relay reaches cfg's brokers: the producers' long-lived client, the
// readiness probes (a fresh one per attempt: a pooled transport would answer from state cached
// while the brokers were down), the standby's reachability probe, the positions read of a relay
// that has no sink yet, and the subcommands that talk to Kafka (status, redrive). Every
// connection is encrypted and authenticated the same way, Config.TLS and Config.SASL, built once
// by the credentials package (which reads the client certificate and the password file again for
// every connection). Only cfg's Brokers, TLS, SASL and ClientID are used; timeout bounds one
// request. The caller closes the transport's idle connections when it is done with the client.
func NewClient(cfg Config, timeout time.Duration) (*kafka.Client, *kafka.Transport) {
	transport := &kafka.Transport{
		ClientID:    cfg.ClientID,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
		DialTimeout: dialTimeout,
		IdleTimeout: 30 * time.Second,
		// A short TTL also bounds how long an error cached during an outage outlives the outage.
		MetadataTTL: 5 * time.Second,
	}
	return &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: transport, Timeout: timeout}, transport
}

// NewDialer is NewClient's encryption, authentication and client id for a connection of its own
// to one partition's leader, for reading a topic from given offsets (redrive reads the
// dead-letter topic and its ledger so).
func NewDialer(cfg Config) *kafka.Dialer {
	return &kafka.Dialer{ClientID: cfg.ClientID, TLS: cfg.TLS, SASLMechanism: cfg.SASL, Timeout: dialTimeout}
}
