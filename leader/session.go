package leader

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/credentials"
)

// connect opens a session for the leader lock (or the probe beside it). A refusal retrying cannot
// fix (credentials, certificate, database) is ErrCredentials; any other failure is retried by the
// campaign.
func (e *Elector) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := credentials.PostgresConfig(e.cfg.DSN, e.cfg.PasswordFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCredentials, err)
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "outbox-relay"
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second // a blackholed server must not stall the campaign
	}
	// One round trip per statement (no prepare first): a statement's time is then one round trip
	// plus the server's work, which the lease arithmetic counts on.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		if line, ok := credentials.ExplainTLS(err, credentials.PostgresTLSKeys); ok {
			return nil, fmt.Errorf("%w: %s", ErrCredentials, line)
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code[:2] == "28":
			return nil, fmt.Errorf("%w (%s): %s", ErrCredentials, pgErr.Message, credentials.PostgresRefusalFix(pgErr.Message))
		case errors.As(err, &pgErr) && pgErr.Code == "3D000":
			return nil, fmt.Errorf("%w (%s): fix the database in pg_dsn", ErrCredentials, pgErr.Message)
		}
		return nil, fmt.Errorf("connect to PostgreSQL for the leader lock: %w", err)
	}
	if err := e.setKeepalives(ctx, conn); err != nil {
		closeQuietly(conn)
		return nil, err
	}
	return conn, nil
}

// setKeepalives makes PostgreSQL notice a peer that went silent on the lock session: keepalive
// probes after Lease of silence, one a second, three unanswered ones end the session; and
// tcp_user_timeout ends it when what the server sent goes unacknowledged for Lease. They are the
// lease's backstop where idle_session_timeout is missing (before PostgreSQL 14), and they work
// only on a real network path: a proxy or load balancer in between answers them itself. They are
// session settings any role may make, set after the connection so that an older server's
// unknown parameter does not refuse it.
func (e *Elector) setKeepalives(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	lease := e.cfg.Lease()
	idle := strconv.Itoa(int(math.Ceil(lease.Seconds())))
	sql := `SELECT set_config('tcp_keepalives_idle', $1, false), set_config('tcp_keepalives_interval', '1', false),
		set_config('tcp_keepalives_count', '3', false)`
	args := []any{idle}
	if serverMajor(conn) >= 12 {
		sql += `, set_config('tcp_user_timeout', $2, false)`
		args = append(args, strconv.FormatInt(lease.Milliseconds(), 10))
	}
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("set TCP keepalives on the leader-lock connection: %w", err)
	}
	return nil
}

// serverMajor is the connected server's major version, 0 when unknown.
func serverMajor(conn *pgx.Conn) int {
	v := conn.PgConn().ParameterStatus("server_version")
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, _ := strconv.Atoi(v[:end])
	return n
}

// closeQuietly closes a lock session, which releases any lock it holds, giving the server a few
// seconds to hear of it.
func closeQuietly(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn.Close(ctx)
}
