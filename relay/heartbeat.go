package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// heartbeatPrefix marks the relay's own logical decoding messages.
const heartbeatPrefix = "outbox-relay-heartbeat"

// heartbeat writes a non-transactional logical decoding message every interval. It gives the
// stream a position to confirm when the outbox is quiet: on a database whose own tables are idle
// while other databases of the cluster write WAL, keepalives alone would leave the slot behind.
func (w *walSource) heartbeat(ctx context.Context, interval time.Duration) {
	var conn *pgx.Conn
	// Run waits for this goroutine, so closing must not hang on a silent server.
	closeConn := func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		conn.Close(closeCtx)
		conn = nil
	}
	defer func() {
		if conn != nil {
			closeConn()
		}
	}()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if conn == nil {
			c, err := w.cfg.Replication.ConnectPrimary(ctx) // a standby cannot write WAL: its primary does, and the standby replays it
			if err != nil {
				w.log.Warn("heartbeat: cannot connect", zap.Error(err))
				continue
			}
			conn = c
		}
		if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, '')", heartbeatPrefix); err != nil {
			if ctx.Err() == nil {
				w.log.Warn("heartbeat failed", zap.Error(err))
			}
			closeConn()
		}
	}
}
