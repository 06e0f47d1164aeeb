package config

// The in-flight window max_in_flight_events: auto means. Exactly-once acknowledges events only
// once their Kafka transaction commits, and every commit is a pause in production: in a backlog a
// transaction grows to half the window (the sink keeps the other half for the next one, filling
// while it commits), and larger ones drain faster (0.67-0.70 of at-least-once's rate with a 10,000
// window, 0.78-0.89 with 40,000: docs/benchmarks.md).
const (
	autoInFlight            = 10000
	autoInFlightExactlyOnce = 40000
	autoTransactionMax      = autoInFlightExactlyOnce / 2
)

// resolveDefaults gives the keys whose default depends on other keys their value. validate's
// checks see the resolved values.
func (c *Config) resolveDefaults(from func(key string) string) {
	c.resolveAuto()
	if c.Source == "poll" && from("leader_election") == "default" {
		// Pollers share the table (each aggregate is claimed by one at a time), so several run at
		// once unless the operator asks for a single active one.
		c.LeaderElection = false
	}
}

// resolveAuto gives the keys set to auto their value for the delivery mode.
func (c *Config) resolveAuto() {
	if c.MaxInFlight == 0 {
		c.MaxInFlight = autoInFlight
		if c.Delivery == DeliveryExactlyOnce {
			c.MaxInFlight = autoInFlightExactlyOnce
		}
	}
	if c.TransactionMaxEvents == 0 {
		c.TransactionMaxEvents = max(1, min(c.MaxInFlight/2, autoTransactionMax))
	}
}
