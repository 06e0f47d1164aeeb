package replication

// Which server a connection reached. Every connection the relay opens may reach another server
// than the others (a multi-host pg_dsn, a host name that moves), so each one that judges the slot
// or the outbox table asks for itself; the answer is read here, in one way per kind of
// connection, and compared with the one identity the stream holds (Stream.identity, set by
// identify on the replication connection; horizon.cluster for the checks that follow it).

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// identifySystem asks a replication connection's server who it is (IDENTIFY_SYSTEM): its
// database cluster and timeline, and its end of WAL.
func identifySystem(ctx context.Context, conn *pgconn.PgConn) (Identity, pglogrepl.LSN, error) {
	res, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Identity{}, 0, fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	return Identity{SystemID: res.SystemID, Timeline: uint32(res.Timeline)}, res.XLogPos, nil
}

// IdentifySystem asks the server conf leads to who it is, on a replication connection of its own
// (conf is not changed), for a caller that needs the identity before any stream runs (the
// exactly-once transactional id). A Stream compares its own sessions' servers itself.
func IdentifySystem(ctx context.Context, conf *pgconn.Config) (Identity, error) {
	cfg := conf.Copy()
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return Identity{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	id, _, err := identifySystem(ctx, conn)
	return id, err
}

// systemIdentifier reads the database cluster an ordinary connection reached. pg_control_system()
// is executable by PUBLIC by default; where it was revoked, the error says so, and the caller
// relies on the replication connection's IDENTIFY_SYSTEM instead.
func systemIdentifier(ctx context.Context, conn *pgconn.PgConn) (string, error) {
	res, err := conn.Exec(ctx, "SELECT system_identifier::text FROM pg_control_system()").ReadAll()
	if err != nil {
		return "", fmt.Errorf("read the system identifier: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return "", fmt.Errorf("read the system identifier: %d results, want one row", len(res))
	}
	return string(res[0].Rows[0][0]), nil
}

// sameClusterAs refuses a connection (used by who) to another database cluster than want, the
// stream's; a role that may not read pg_control_system is not refused.
func sameClusterAs(ctx context.Context, c *pgconn.PgConn, want, who string) error {
	got, err := systemIdentifier(ctx, c)
	if err != nil {
		return nil
	}
	if got != want {
		return fatalf("pg_dsn leads to different database clusters: %s reached system identifier %s while the replication stream is on %s (a multi-host pg_dsn or a DNS name that moved): point pg_dsn at one cluster's primary and restart",
			who, got, want)
	}
	return nil
}
