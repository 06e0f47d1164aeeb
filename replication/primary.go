package replication

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// primaryCheckTimeout bounds checkPrimary: a primary that does not answer must not hold up a
// session that streams from the standby.
const primaryCheckTimeout = 5 * time.Second

// checkPrimary refuses a primary_dsn that leads to a standby or to another database cluster than
// pg_dsn's (systemID, "" when the role may not read it), decoding on a standby. Either way the
// slot ledger's writes, the heartbeats and the leader lock would go where they do nothing for this
// slot: writes refused one by one (warnings that read as a passing outage), or written into another
// cluster, whose heartbeats never reach the standby's slot. Both are a configuration mistake,
// refused at the start in one line. A primary that cannot be reached is not refused: the standby
// streams on, and the ledger's writes and heartbeats warn until it is back.
func (s *Stream) checkPrimary(ctx context.Context, systemID string) error {
	if s.cfg.PrimaryDSN == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, primaryCheckTimeout)
	defer cancel()
	conn, err := s.cfg.ConnectPrimary(ctx)
	if err != nil {
		s.log.Warn("cannot reach the primary (primary_dsn) to check it: the slot ledger's writes and heartbeats fail until it is back", zap.Error(err))
		return nil
	}
	defer conn.Close(context.WithoutCancel(ctx))
	results, err := conn.PgConn().Exec(ctx, "SELECT pg_catalog.pg_is_in_recovery()").ReadAll()
	if err != nil {
		s.log.Warn("cannot ask the primary (primary_dsn) whether it is a standby", zap.Error(err))
		return nil
	}
	if len(results) == 1 && len(results[0].Rows) == 1 && string(results[0].Rows[0][0]) == "t" {
		return fatalf("primary_dsn leads to a standby (the server at %s is in recovery), which refuses the slot ledger's writes and the heartbeats: make primary_dsn lead to the primary of the standby pg_dsn leads to (a primary_dsn listing several hosts needs target_session_attrs=read-write), and restart",
			conn.PgConn().Conn().RemoteAddr())
	}
	if systemID == "" {
		return nil
	}
	primaryID, err := systemIdentifier(ctx, conn.PgConn())
	if err != nil {
		s.log.Debug("cannot read the system identifier on primary_dsn", zap.Error(err))
		return nil
	}
	if primaryID != systemID {
		return fatalf("primary_dsn leads to another database cluster (system identifier %s) than pg_dsn (%s): the heartbeats written there never reach the slot, and the slot ledger would be written there. Make primary_dsn lead to the primary of the standby pg_dsn leads to, and restart",
			primaryID, systemID)
	}
	return nil
}
