package schemaregistry

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// Health is what the client last learnt of the registry.
type Health struct {
	// Up is false from a request that found the registry unavailable (IsUnavailable) until one
	// that got an answer.
	Up bool
	// Since is when Up last changed (the client's creation at first).
	Since time.Time
	// Reason is the error that took it down, one line without credentials; "" while up.
	Reason string
}

// Health returns what the client last learnt of the registry.
func (c *Client) Health() Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.health
}

// record updates health and the metrics with a request's outcome. A request ended by its caller's
// context says nothing of the registry.
func (c *Client) record(ctx context.Context, err error) {
	outcome := "ok"
	if err != nil {
		cls := classOf(err)
		if cls == 0 {
			if ctx.Err() != nil {
				return
			}
			cls = Unavailable
		}
		outcome = cls.String()
	}
	if c.m != nil {
		c.m.Requests.WithLabelValues(outcome).Inc()
	}
	up := outcome != Unavailable.String()
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.health.Up
	switch {
	case up && !was:
		c.health = Health{Up: true, Since: time.Now()}
		c.log.Info("schema registry available again", zap.Strings("urls", c.urls))
	case !up && was:
		c.health = Health{Up: false, Since: time.Now(), Reason: err.Error()}
		c.log.Warn("schema registry unavailable: events that need a schema not in the cache wait until it answers",
			zap.Strings("urls", c.urls), zap.String("reason", err.Error()))
	case !up:
		c.health.Reason = err.Error()
	}
	if c.m != nil {
		if up {
			c.m.Up.Set(1)
		} else {
			c.m.Up.Set(0)
		}
	}
	if !up && !c.probing && !c.closed {
		c.probing = true
		c.probeWG.Add(1)
		go c.probe()
	}
}

// probe asks the registry, with growing pauses, until it answers or the client is closed: health
// comes back with the registry even when nothing else asks it (every schema the stream needs is
// cached, or nothing flows).
func (c *Client) probe() {
	defer c.probeWG.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	pause := probeFirst
	for {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			c.probing = false
			c.mu.Unlock()
			return
		case <-time.After(pause):
		}
		_ = c.Check(ctx)
		c.mu.Lock()
		if c.health.Up || c.closed {
			c.probing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		pause = min(2*pause, probeMax)
	}
}

// Status is the registry at a glance, for `outbox-relay status`.
type Status struct {
	URLs  []string  `json:"urls"`
	Up    bool      `json:"up"`
	Since time.Time `json:"since"`
	// Error is why it is down (one line, no credentials); "" while up.
	Error string `json:"error,omitempty"`
}

// Status asks the registry now (Check) and returns what that found.
func (c *Client) Status(ctx context.Context) Status {
	err := c.Check(ctx)
	h := c.Health()
	st := Status{URLs: c.URLs(), Up: err == nil, Since: h.Since}
	if err != nil {
		st.Error = err.Error()
	}
	return st
}
