package sink

import (
	"time"

	"github.com/segmentio/kafka-go"
)

// newClient is the one way the sink reaches cfg's brokers: the producers' long-lived client, the
// readiness probes (a fresh one per attempt: a pooled transport would answer from state cached
// while the brokers were down), the standby's reachability probe and the positions read of a relay
// that has no sink yet. Every connection is encrypted and authenticated the same way, Config.TLS
// and Config.SASL, built once by the credentials package (which reads the client certificate and
// the password file again for every connection). timeout bounds one request. The caller closes
// the transport's idle connections when it is done with the client.
func newClient(cfg Config, timeout time.Duration) (*kafka.Client, *kafka.Transport) {
	transport := &kafka.Transport{
		ClientID:    cfg.ClientID,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
		DialTimeout: 5 * time.Second,
		IdleTimeout: 30 * time.Second,
		// A short TTL also bounds how long an error cached during an outage outlives the outage.
		MetadataTTL: 5 * time.Second,
	}
	return &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: transport, Timeout: timeout}, transport
}
