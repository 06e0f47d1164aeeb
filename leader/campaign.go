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
	// conn is the session that asks for the lock; probe is a second one, kept open alongside, that
	// makes sure the lock taken is conn's own (see verifySession).
	var conn, probe *pgx.Conn
	announced := false // conn holds the candidate lock
	drop := func() {
		for _, c := range []*pgx.Conn{conn, probe} {
			if c != nil {
				closeQuietly(c)
			}
		}
		conn, probe, announced = nil, nil, false
	}
	defer func() { drop() }()
	waitingLogged, downLogged, unfitLogged := false, false, false
	var previous *Holder // the session seen holding the lock while this instance stood by
	for {
		if conn == nil {
			c, err := e.connect(ctx)
			var p *pgx.Conn
			if err == nil {
				if p, err = e.connect(ctx); err != nil {
					closeQuietly(c)
				}
			}
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, ErrCredentials):
				return nil, err
			case err != nil:
				e.cfg.OnStandby(false)
				if !downLogged {
					e.log.Warn("standby cannot reach PostgreSQL; retrying", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
					downLogged = true
				}
			default:
				conn, probe = c, p
			}
		}
		var unfit error
		if conn != nil && e.cfg.BeforeLock != nil {
			unfit = e.cfg.BeforeLock(ctx, previous != nil)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if unfit != nil {
				// Still a standby connected to PostgreSQL: OnStandby stays as last reported.
				if !unfitLogged {
					e.log.Warn("standby: not trying to take the leader lock while this instance could not work as leader; checking again every retry interval",
						zap.String("slot", e.cfg.Slot), zap.Error(unfit), zap.Duration("retry_interval", e.cfg.RetryInterval))
					unfitLogged = true
				}
			} else if unfitLogged {
				e.log.Info("standby: this instance could work as leader again; competing for the leader lock", zap.String("slot", e.cfg.Slot))
				unfitLogged = false
			}
			if err := e.announce(ctx, conn, unfit == nil && previous != nil, &announced); err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				drop()
				e.cfg.OnStandby(false)
				e.log.Warn("leader lock: announcing this standby failed; reconnecting", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			}
		}
		if conn != nil && unfit == nil {
			sent := time.Now()
			got, pid, err := e.tryLock(ctx, conn)
			if err == nil && got {
				sent, err = e.verifySession(ctx, conn, probe, pid)
			}
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, ErrTransactionPooler):
				if got {
					e.unlockPooled(conn, pid)
				}
				return nil, err
			case err != nil:
				// The outcome is unknown; closing the session releases the lock if it was granted.
				drop()
				e.cfg.OnStandby(false)
				e.log.Warn("leader lock attempt failed; reconnecting", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			case got:
				t, err := e.begin(ctx, conn, sent, previous, pid)
				if err == nil {
					conn = nil // the term owns it now
					return t, nil
				}
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				// The session may be gone, and the lock with it: closing it makes sure, and the
				// next attempt starts over.
				drop()
				e.cfg.OnStandby(false)
				e.log.Warn("took the leader lock but lost the answer of its session while ending the previous leader's walsender; reconnecting",
					zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			default:
				e.cfg.OnStandby(true)
				downLogged = false
				hctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
				h, held, err := LockHolder(hctx, conn, e.cfg.Slot)
				cancel()
				if err == nil && held {
					previous = rememberHolder(previous, h)
				}
				if !waitingLogged {
					fields := []zap.Field{zap.String("slot", e.cfg.Slot), zap.Duration("retry_interval", e.cfg.RetryInterval)}
					if err == nil && held {
						fields = append(fields, zap.Int32("leader_pid", h.PID), zap.String("leader_application_name", h.ApplicationName),
							zap.String("leader_client", h.ClientAddr))
					}
					e.log.Info("standby: another instance holds the leader lock; waiting to take over", fields...)
					waitingLogged = true
				}
			}
		}
		select {
		case <-time.After(e.cfg.RetryInterval):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
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
