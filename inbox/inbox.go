// Package inbox makes a Kafka consumer's database changes idempotent by event id: the consumer half
// of the outbox pattern. The relay delivers every event at least once, so a consumer may see one
// twice (after a relay crash, or when its own offsets were not committed); Handle records the event
// id in a processed_events table inside the consumer's transaction and runs the business change
// only when the id is new.
//
// Read with isolation.level=read_committed (kafka-go: ReaderConfig.IsolationLevel =
// kafka.ReadCommitted). With the relay's delivery: exactly-once, a read_committed consumer that
// filters aborted transactions (Java, librdkafka, franz-go) sees each event once from the relay;
// kafka-go's Reader stops at what is committed but still returns the records of aborted
// transactions (and the transactions' commit markers: skip those with TransactionMarker), and a
// consumer's own redeliveries remain, so the inbox is what makes the database change exactly once
// in every case.
//
//	store, _ := inbox.New(inbox.Config{Consumer: "billing"})
//	for {
//		m, err := reader.FetchMessage(ctx) // kafka-go, with a GroupID and IsolationLevel: kafka.ReadCommitted
//		...
//		id, err := inbox.EventID(m)
//		...
//		_, err = store.Process(ctx, pool, id, func(ctx context.Context, tx pgx.Tx) error {
//			return applyPayment(ctx, tx, m.Value)
//		})
//		if err != nil { ... retry the same message; do not commit its offset ... }
//		err = reader.CommitMessages(ctx, m) // only after the transaction committed
//	}
//
// Why it is exactly-once for the database: the id row and the business change commit or roll back
// together. A second delivery finds the row and does nothing. A concurrent second delivery (another
// consumer instance, before a rebalance settles) blocks on the first transaction's uncommitted row:
// if the first commits, the second sees the conflict and does nothing; if it rolls back, the second
// handles the event. Under READ COMMITTED (PostgreSQL's default) that is all; under REPEATABLE READ
// or SERIALIZABLE the second transaction may instead fail with a serialization error (SQLSTATE
// 40001), which is safe and should be retried like any serialization failure.
//
// Consumer (consumer.go) goes further with events that carry an aggregate_version header: it tells
// each delivery new, duplicate, stale or gap against the version applied, routes it by event type
// and schema_version through a Registry of handlers and upcasters, and performs effects outside
// the database once (effects.go). Store.Migrate creates its tables too.
package inbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
)

//go:embed processed_events.sql aggregate_versions.sql operations.sql
var schemaFS embed.FS

var schemaTmpl = template.Must(template.ParseFS(schemaFS, "*.sql"))

// DefaultTable is the ledger table: unqualified, so it lives in the first schema of the
// consumer's search_path.
const DefaultTable = "processed_events"

// Config says which ledger a Store uses. Zero values get the defaults noted.
type Config struct {
	// Table is "table" or "schema.table"; each part is quoted, so it is taken literally. Default
	// DefaultTable.
	Table string
	// Consumer names the consumer, so several can share the table and each handle every event
	// once. Default "" (one consumer per table).
	Consumer string
	// VersionTable records, per aggregate, the last version the consumer applied (Consumer uses
	// it to tell new, duplicate, stale and missed events apart). Default DefaultVersionTable.
	VersionTable string
	// OperationTable records effects outside the database (Event.Intend). Default
	// DefaultOperationTable.
	OperationTable string
}

// Default names of the tables next to the ledger; unqualified like DefaultTable.
const (
	DefaultVersionTable   = "inbox_aggregate_versions"
	DefaultOperationTable = "inbox_operations"
)

// Store records handled events in one ledger table for one consumer. It is safe for concurrent use.
type Store struct {
	consumer string
	table    string // quoted
	index    string // quoted, unqualified (an index lives in its table's schema)
	insert   string
	versions string // quoted
	ops      string // quoted
	opsIndex string // quoted, unqualified
}

// New checks cfg.
func New(cfg Config) (*Store, error) {
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.VersionTable == "" {
		cfg.VersionTable = DefaultVersionTable
	}
	if cfg.OperationTable == "" {
		cfg.OperationTable = DefaultOperationTable
	}
	var parts [3][]string
	for i, name := range []string{cfg.Table, cfg.VersionTable, cfg.OperationTable} {
		parts[i] = strings.Split(name, ".")
		if p := parts[i]; len(p) > 2 || p[0] == "" || p[len(p)-1] == "" {
			return nil, fmt.Errorf("inbox: table %q: want table or schema.table", name)
		}
	}
	table := pgx.Identifier(parts[0]).Sanitize()
	ops := parts[2]
	return &Store{
		consumer: cfg.Consumer,
		table:    table,
		index:    pgx.Identifier{parts[0][len(parts[0])-1] + "_processed_at_idx"}.Sanitize(),
		insert:   "INSERT INTO " + table + " (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
		versions: pgx.Identifier(parts[1]).Sanitize(),
		ops:      pgx.Identifier(ops).Sanitize(),
		opsIndex: pgx.Identifier{ops[len(ops)-1] + "_pending_idx"}.Sanitize(),
	}, nil
}

// Execer runs a statement: pgx.Tx, *pgx.Conn and *pgxpool.Pool satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLExecer is database/sql's counterpart: *sql.DB, *sql.Conn and *sql.Tx satisfy it.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// migrateLock serialises concurrent Migrate calls (CREATE TABLE IF NOT EXISTS is not safe against
// itself). The key is arbitrary but fixed.
const migrateLock = 7201730151

func (s *Store) migrationSQL() (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT pg_advisory_xact_lock(%d);\n", migrateLock)
	names := map[string]string{"Table": s.table, "Index": s.index, "Versions": s.versions, "Ops": s.ops, "OpsIndex": s.opsIndex}
	for _, f := range []string{"processed_events.sql", "aggregate_versions.sql", "operations.sql"} {
		if err := schemaTmpl.ExecuteTemplate(&b, f, names); err != nil {
			return "", err
		}
		b.WriteString(";\n")
	}
	return b.String(), nil
}

// Migrate creates the ledger table, the version and operation tables and their indexes if they do
// not exist. It runs as one statement
// batch (one implicit transaction), so it is atomic and safe to call at every start.
func (s *Store) Migrate(ctx context.Context, db Execer) error {
	q, err := s.migrationSQL()
	if err != nil {
		return err
	}
	// No arguments: pgx sends it with the simple protocol, which allows several statements.
	if _, err := db.Exec(ctx, q); err != nil {
		return fmt.Errorf("inbox: create %s: %w", s.table, err)
	}
	return nil
}

// MigrateSQL is Migrate for database/sql (the pgx stdlib driver).
func (s *Store) MigrateSQL(ctx context.Context, db SQLExecer) error {
	q, err := s.migrationSQL()
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("inbox: create %s: %w", s.table, err)
	}
	return nil
}

// ErrNoEventID is returned for an empty event id: without one, duplicates cannot be told apart.
var ErrNoEventID = errors.New("inbox: empty event id")

// Handle records eventID in tx and, when it was not recorded before, runs apply in the same
// transaction. It reports whether apply ran. When apply fails, Handle returns its error and the
// caller must roll tx back: that also removes the id, so a redelivery tries again. (Committing
// after an error would record the id without the change.)
func (s *Store) Handle(ctx context.Context, tx pgx.Tx, eventID string, apply func(context.Context, pgx.Tx) error) (processed bool, err error) {
	if eventID == "" {
		return false, ErrNoEventID
	}
	tag, err := tx.Exec(ctx, s.insert, s.consumer, eventID)
	if err != nil {
		return false, fmt.Errorf("inbox: record event %s: %w", eventID, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil // handled before
	}
	if err := apply(ctx, tx); err != nil {
		return false, fmt.Errorf("inbox: handle event %s: %w", eventID, err)
	}
	return true, nil
}

// HandleSQL is Handle for database/sql.
func (s *Store) HandleSQL(ctx context.Context, tx *sql.Tx, eventID string, apply func(context.Context, *sql.Tx) error) (processed bool, err error) {
	if eventID == "" {
		return false, ErrNoEventID
	}
	res, err := tx.ExecContext(ctx, s.insert, s.consumer, eventID)
	if err != nil {
		return false, fmt.Errorf("inbox: record event %s: %w", eventID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("inbox: record event %s: %w", eventID, err)
	}
	if n == 0 {
		return false, nil
	}
	if err := apply(ctx, tx); err != nil {
		return false, fmt.Errorf("inbox: handle event %s: %w", eventID, err)
	}
	return true, nil
}

// Beginner starts a transaction: *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Process runs Handle in a transaction of its own and commits it, rolling back when anything
// fails. Commit the message's Kafka offset only after Process returns nil.
func (s *Store) Process(ctx context.Context, db Beginner, eventID string, apply func(context.Context, pgx.Tx) error) (processed bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		processed, err = s.Handle(ctx, tx, eventID, apply)
		return err
	})
	if err != nil {
		return false, err
	}
	return processed, nil
}

var defaultStore, _ = New(Config{})

// Migrate creates the default ledger table (DefaultTable, for the default consumer).
func Migrate(ctx context.Context, db Execer) error { return defaultStore.Migrate(ctx, db) }

// MigrateSQL is Migrate for database/sql.
func MigrateSQL(ctx context.Context, db SQLExecer) error { return defaultStore.MigrateSQL(ctx, db) }

// Handle is Store.Handle with the default table and consumer.
func Handle(ctx context.Context, tx pgx.Tx, eventID string, apply func(context.Context, pgx.Tx) error) (bool, error) {
	return defaultStore.Handle(ctx, tx, eventID, apply)
}

// HandleSQL is Store.HandleSQL with the default table and consumer.
func HandleSQL(ctx context.Context, tx *sql.Tx, eventID string, apply func(context.Context, *sql.Tx) error) (bool, error) {
	return defaultStore.HandleSQL(ctx, tx, eventID, apply)
}

// Process is Store.Process with the default table and consumer.
func Process(ctx context.Context, db Beginner, eventID string, apply func(context.Context, pgx.Tx) error) (bool, error) {
	return defaultStore.Process(ctx, db, eventID, apply)
}

// HeaderID is the header that carries the event id (the relay's, and Debezium's outbox router's).
const HeaderID = "id"

// TransactionMarker reports whether m is a transaction's commit or abort marker, which kafka-go's
// Reader returns as an ordinary message on topics written in Kafka transactions (the relay's
// delivery: exactly-once), whatever its IsolationLevel. Java, librdkafka and franz-go consumers
// never show them. A marker is no event: skip it and commit its offset like any other.
//
// Kafka writes a marker as the only record of a control batch, with a 4-byte key (version 0, type
// 0 for abort or 1 for commit), a 6-byte value (version 0, coordinator epoch) and no headers;
// kafka-go drops the batch's control flag, so those bytes are what tells. The relay's records
// always carry the id header (unless builtin_headers leaves it out), so none looks like a marker.
func TransactionMarker(m kafka.Message) bool {
	k, v := m.Key, m.Value
	return len(m.Headers) == 0 && len(k) == 4 && k[0] == 0 && k[1] == 0 && k[2] == 0 && k[3] <= 1 &&
		len(v) == 6 && v[0] == 0 && v[1] == 0
}

// EventID returns a Kafka message's event id from its id header. If the header occurs more than
// once the last one wins, as with Java's Headers.lastHeader. A value that is a JSON string (what
// Kafka Connect writes when its header converter is the JsonConverter) is unquoted, so records from
// a Debezium deployment and from the relay give the same id. A record without the header that is
// a CloudEvent (structured or binary) has the CloudEvent's id.
func EventID(m kafka.Message) (string, error) {
	if v, _ := header(m, HeaderID); v != "" {
		return v, nil
	}
	ce, err := ParseCloudEvent(m)
	if err != nil {
		return "", err
	}
	return eventID(m, ce)
}

// eventID is EventID for a record whose CloudEvent, if any, was read already.
func eventID(m kafka.Message, ce *CloudEvent) (string, error) {
	v, _ := header(m, HeaderID)
	if v == "" && ce != nil {
		v = ce.ID
	}
	if v == "" {
		return "", fmt.Errorf("inbox: message %s/%d@%d has no %q header and is no CloudEvent: %w", m.Topic, m.Partition, m.Offset, HeaderID, ErrNoEventID)
	}
	return v, nil
}
