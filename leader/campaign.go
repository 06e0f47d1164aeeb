package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// Campaign stands by until this instance holds the lock, and returns the leadership term. It
// returns an error only when ctx ends, PostgreSQL refuses the credentials, or the connection goes
// through a pooler in transaction mode (ErrTransactionPooler): retrying cannot fix those; an
// unreachable server is retried.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	c := &campaign{e: e}
	defer c.drop()
	for {
		if t, err := c.attempt(ctx); t != nil || err != nil {
			return t, err
		}
		select {
		case <-time.After(e.cfg.RetryInterval):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// campaign is one Campaign's state between attempts: its sessions, the holder it has seen, and
// what it has told the operator, so that each condition is logged once while it lasts.
type campaign struct {
	e *Elector
	// conn is the session that asks for the lock; probe is a second one, kept open alongside, that
	// makes sure the lock taken is conn's own (see verifySession).
	conn, probe *pgx.Conn
	announced   bool    // conn holds the candidate lock
	previous    *Holder // the session seen holding the lock while this instance stood by

	waitingLogged, downLogged, unfitLogged bool
}

// attempt is one round of a standby: connect when it is not connected, ask whether this instance
// could work as leader, and try the lock. It returns the term when it took the lock, an error
// when the campaign must end, and neither when the next round comes after RetryInterval.
func (c *campaign) attempt(ctx context.Context) (*Term, error) {
	if c.conn == nil {
		if err := c.connect(ctx); err != nil {
			return nil, err
		}
	}
	if c.conn == nil {
		return nil, nil
	}
	fit, err := c.mayLead(ctx)
	if err != nil || !fit || c.conn == nil {
		return nil, err
	}
	return c.tryLock(ctx)
}

// connect opens the campaign's two sessions. Only ctx's end and refused credentials end the
// campaign; an unreachable server leaves the campaign unconnected, reported to OnStandby and
// logged once until it answers again.
func (c *campaign) connect(ctx context.Context) error {
	e := c.e
	conn, err := e.connect(ctx)
	var probe *pgx.Conn
	if err == nil {
		if probe, err = e.connect(ctx); err != nil {
			closeQuietly(conn)
		}
	}
	switch {
	case ctx.Err() != nil:
		if err == nil {
			// Both opened as ctx ended: nobody else would close them.
			closeQuietly(conn)
			closeQuietly(probe)
		}
		return ctx.Err()
	case errors.Is(err, ErrCredentials):
		return err
	case err != nil:
		e.cfg.OnStandby(false)
		if !c.downLogged {
			e.log.Warn("standby cannot reach PostgreSQL; retrying", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			c.downLogged = true
		}
	default:
		c.conn, c.probe = conn, probe
	}
	return nil
}

// mayLead asks BeforeLock whether this instance could work as leader (always, without one), and
// holds the candidate lock while it could and has seen another instance lead, so that the leader
// counts it (Term.Standbys). A failed announcement drops the sessions. The error is ctx's only.
func (c *campaign) mayLead(ctx context.Context) (bool, error) {
	e := c.e
	if e.cfg.BeforeLock == nil {
		return true, nil
	}
	unfit := e.cfg.BeforeLock(ctx, c.previous != nil)
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if unfit != nil {
		// Still a standby connected to PostgreSQL: OnStandby stays as last reported.
		if !c.unfitLogged {
			e.log.Warn("standby: not trying to take the leader lock while this instance could not work as leader; checking again every retry interval",
				zap.String("slot", e.cfg.Slot), zap.Error(unfit), zap.Duration("retry_interval", e.cfg.RetryInterval))
			c.unfitLogged = true
		}
	} else if c.unfitLogged {
		e.log.Info("standby: this instance could work as leader again; competing for the leader lock", zap.String("slot", e.cfg.Slot))
		c.unfitLogged = false
	}
	if err := e.announce(ctx, c.conn, unfit == nil && c.previous != nil, &c.announced); err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		c.reconnect("leader lock: announcing this standby failed; reconnecting", err)
	}
	return unfit == nil, nil
}

// tryLock asks for the lock once. Taken and verified, it begins the term; held by another
// instance, this one stands by; a pooler in transaction mode ends the campaign.
func (c *campaign) tryLock(ctx context.Context) (*Term, error) {
	e := c.e
	sent := time.Now()
	got, pid, err := e.tryLock(ctx, c.conn)
	if err == nil && got {
		sent, err = e.verifySession(ctx, c.conn, c.probe, pid)
	}
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.Is(err, ErrTransactionPooler):
		if got {
			e.unlockPooled(c.conn, pid)
		}
		return nil, err
	case err != nil:
		// The outcome is unknown; closing the session releases the lock if it was granted.
		c.reconnect("leader lock attempt failed; reconnecting", err)
		return nil, nil
	case got:
		return c.begin(ctx, sent, pid)
	}
	c.standBy(ctx)
	return nil, nil
}

// begin starts the term on the session that took the lock, which the term then owns.
func (c *campaign) begin(ctx context.Context, sent time.Time, pid int32) (*Term, error) {
	t, err := c.e.begin(ctx, c.conn, sent, c.previous, pid)
	if err == nil {
		c.conn = nil // the term owns it now
		return t, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	// The session may be gone, and the lock with it: closing it makes sure, and the next attempt
	// starts over.
	c.reconnect("took the leader lock but lost the answer of its session while ending the previous leader's walsender; reconnecting", err)
	return nil, nil
}

// standBy records that another instance holds the lock, and which session (whose walsender this
// one ends should it take over), logging the first sighting.
func (c *campaign) standBy(ctx context.Context) {
	e := c.e
	e.cfg.OnStandby(true)
	c.downLogged = false
	hctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	h, held, err := LockHolder(hctx, c.conn, e.cfg.Slot)
	cancel()
	if err == nil && held {
		c.previous = rememberHolder(c.previous, h)
	}
	if !c.waitingLogged {
		fields := []zap.Field{zap.String("slot", e.cfg.Slot), zap.Duration("retry_interval", e.cfg.RetryInterval)}
		if err == nil && held {
			fields = append(fields, zap.Int32("leader_pid", h.PID), zap.String("leader_application_name", h.ApplicationName),
				zap.String("leader_client", h.ClientAddr))
		}
		e.log.Info("standby: another instance holds the leader lock; waiting to take over", fields...)
		c.waitingLogged = true
	}
}

// reconnect drops the sessions after a failure that leaves their state unknown, so that the next
// attempt starts over on new ones.
func (c *campaign) reconnect(msg string, err error) {
	c.drop()
	c.e.cfg.OnStandby(false)
	c.e.log.Warn(msg, zap.Error(err), zap.Duration("retry_in", c.e.cfg.RetryInterval))
}

// drop closes the sessions, which releases any lock they hold.
func (c *campaign) drop() {
	for _, conn := range []*pgx.Conn{c.conn, c.probe} {
		if conn != nil {
			closeQuietly(conn)
		}
	}
	c.conn, c.probe, c.announced = nil, nil, false
}

// announce makes conn hold the candidate lock (want) or not, when it does not already.
func (e *Elector) announce(ctx context.Context, conn *pgx.Conn, want bool, announced *bool) error {
	if want == *announced {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	q := "SELECT pg_advisory_unlock_shared($1)"
	if want {
		q = "SELECT pg_try_advisory_lock_shared($1)"
	}
	if _, err := conn.Exec(ctx, q, candidateKey(e.cfg.Slot)); err != nil {
		return fmt.Errorf("%s: %w", q, err)
	}
	*announced = want
	return nil
}
