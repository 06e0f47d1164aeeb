package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// RelationRef is a relation the replication stream named, as its Relation message describes it.
type RelationRef struct {
	OID           uint32
	Schema, Table string
	Columns       []string
}

// BelongsToOutbox decides whether a relation in the stream that is not named like the outbox is
// part of it: a leaf partition (at any depth) of a partitioned outbox, which pgoutput names for WAL
// written while the publication did not publish via the partition root. It asks today's catalog on
// an ordinary connection: a relation under the outbox is the outbox's (even if the stream's
// definition lacks a column: its rows then go to the failure policy). A relation that no longer
// hangs under the outbox cannot be proved either way; it is treated as the outbox's (with a
// warning) when it has every outbox column and is not published in its own right, because skipping
// it could lose events without a trace while publishing it costs at worst foreign rows on the
// outbox topics. The publication normally holds only the outbox, so this runs rarely.
//
// A relation with the outbox's OID is the outbox whatever the stream calls it (a table renamed
// and renamed back, or a schema renamed: the check stops the relay on the latter). A transient
// error (the database restarting) is retried here, each try bounded by classifyTimeout, until ctx
// ends; only an error retrying cannot fix is returned.
func (s *Stream) BelongsToOutbox(ctx context.Context, rel RelationRef) (bool, error) {
	if known := s.guard.oid.Load(); known != 0 && rel.OID == known {
		return true, nil
	}
	for attempt := 0; ; attempt++ {
		ours, err := s.classifier.belongs(ctx, s, rel)
		if err == nil || IsFatal(err) || ctx.Err() != nil {
			return ours, err
		}
		delay := backoff(attempt)
		s.log.Warn("cannot classify a relation in the replication stream; retrying (the stream waits meanwhile)",
			zap.Uint32("oid", rel.OID), zap.String("relation", rel.Schema+"."+rel.Table), zap.Error(err), zap.Duration("retry_in", delay))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// classifyTimeout bounds one attempt to classify a relation.
const classifyTimeout = 10 * time.Second

// classifier holds the connection BelongsToOutbox asks on, kept between Relation messages (a
// publication with many tables sends many) and closed when the context it was opened for ends.
type classifier struct {
	mu   sync.Mutex
	conn *pgx.Conn
	stop func() bool // unregisters the close at the end of the context
	// epoch and cluster are the server the connection was opened for (horizon.server): after a
	// failover it may still reach the old one, so a new server means a new connection.
	epoch   uint64
	cluster string
}

func (c *classifier) belongs(ctx context.Context, s *Stream, rel RelationRef) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, classifyTimeout)
	defer cancel()
	epoch, cluster := s.guard.server()
	if c.conn != nil && (epoch != c.epoch || cluster != c.cluster) {
		c.stop()
		c.conn.Close(context.WithoutCancel(ctx))
		c.conn = nil
	}
	if c.conn == nil || c.conn.IsClosed() {
		conn, err := s.cfg.Connect(actx)
		if err != nil {
			return false, classifyConnect(err, "classifying a relation")
		}
		if cluster != "" {
			if err := sameClusterAs(actx, conn.PgConn(), cluster, "classifying a relation"); err != nil {
				conn.Close(context.WithoutCancel(ctx))
				return false, err
			}
		}
		c.conn, c.epoch, c.cluster = conn, epoch, cluster
		c.stop = context.AfterFunc(ctx, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			conn.Close(context.Background())
			if c.conn == conn {
				c.conn = nil
			}
		})
	}
	ours, err := s.classify(actx, c.conn, rel)
	if err != nil && !IsFatal(err) {
		c.stop()
		c.conn.Close(context.WithoutCancel(ctx))
		c.conn = nil
	}
	return ours, err
}

// classify is one attempt of BelongsToOutbox.
func (s *Stream) classify(ctx context.Context, conn *pgx.Conn, rel RelationRef) (bool, error) {
	name := pgx.Identifier{rel.Schema, rel.Table}.Sanitize()
	// Published in its own right: listed (or an ancestor other than the outbox is), its schema
	// published (PostgreSQL 15 on), or FOR ALL TABLES.
	schemas := ""
	if serverMajor(conn.PgConn().ParameterStatus("server_version")) >= 15 {
		schemas = `
				OR EXISTS (SELECT 1 FROM pg_publication_namespace n JOIN pg_class c ON c.relnamespace = n.pnnspid
					WHERE n.pnpubid = p.oid AND c.oid <> coalesce(to_regclass($2)::oid, 0)
					AND (c.oid = $1::oid OR c.oid IN (SELECT relid FROM pg_partition_ancestors($1::oid::regclass))))`
	}
	var exists, inOutbox, publishedItself bool
	err := conn.QueryRow(ctx, `SELECT
			EXISTS (SELECT 1 FROM pg_class WHERE oid = $1::oid),
			EXISTS (SELECT 1 FROM pg_partition_ancestors($1::oid::regclass) a WHERE a.relid = to_regclass($2)),
			EXISTS (SELECT 1 FROM pg_publication p WHERE p.pubname = $3 AND (p.puballtables OR EXISTS (
				SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid <> coalesce(to_regclass($2)::oid, 0)
					AND (r.prrelid = $1::oid OR r.prrelid IN (SELECT relid FROM pg_partition_ancestors($1::oid::regclass))))`+schemas+`))`,
		rel.OID, s.cfg.qualifiedTable(), s.cfg.Publication).Scan(&exists, &inOutbox, &publishedItself)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code[:2] == "42" { // a privilege or the query: retrying cannot fix it
		return false, fatalf("classify relation %s (OID %d) in the replication stream: %w (the relay's role needs USAGE on the outbox's schema)", name, rel.OID, err)
	}
	if err != nil {
		return false, fmt.Errorf("classify relation %s (OID %d) in the replication stream: %w", name, rel.OID, err)
	}
	switch {
	case inOutbox:
		s.log.Info("relation in the stream is a partition of the outbox (WAL written while the publication did not publish via the partition root)",
			zap.String("relation", name), zap.Uint32("oid", rel.OID))
		return true, nil
	case !hasColumns(rel.Columns, s.cfg.Columns):
		// Not a partition of the outbox today, and not decodable as an outbox row.
		s.log.Info("relation in the stream is not the outbox: it is not a partition of it and lacks outbox columns; its rows are skipped",
			zap.String("relation", name), zap.Uint32("oid", rel.OID), zap.Strings("columns", rel.Columns))
		return false, nil
	case exists && publishedItself:
		s.log.Info("relation in the stream is another table of the publication, not the outbox; its rows are skipped",
			zap.String("relation", name), zap.Uint32("oid", rel.OID), zap.String("publication", s.cfg.Publication))
		return false, nil
	}
	s.log.Warn("relation in the stream has the outbox's columns but is no longer a partition of it (detached or dropped since) and is not published in its own right: treating its rows as outbox events",
		zap.String("relation", name), zap.Uint32("oid", rel.OID), zap.Bool("exists", exists), zap.String("outbox", s.cfg.qualifiedTable()))
	return true, nil
}

// OutboxOID is the outbox table's OID as the relay found it at its first session (0 before).
func (s *Stream) OutboxOID() uint32 { return s.guard.oid.Load() }

func hasColumns(have, want []string) bool {
	for _, c := range want {
		if !slices.Contains(have, c) {
			return false
		}
	}
	return true
}
