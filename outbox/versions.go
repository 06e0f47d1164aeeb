package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
)

// versionTable hands out aggregate versions from a counter table: one row per aggregate holding
// the last version given out.
type versionTable struct {
	table string // quoted
	ddl   string
	bump  string
}

func newVersionTable(name string) (*versionTable, error) {
	table, err := parseTable(name)
	if err != nil {
		return nil, fmt.Errorf("outbox: VersionTable: %w", err)
	}
	return &versionTable{
		table: table,
		ddl: `CREATE TABLE IF NOT EXISTS ` + table + ` (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    version        bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
)`,
		// One statement for every aggregate of the batch. Rows are locked in (type, id) order, so
		// two transactions that write the same aggregates never wait for each other in a circle
		// (a deadlock). Under READ COMMITTED, a second writer of an aggregate waits for the first
		// to end and then counts on from the version it committed (or from the old one, if it
		// rolled back): versions are gapless and never given out twice.
		bump: `INSERT INTO ` + table + ` AS c (aggregate_type, aggregate_id, version)
SELECT t, i, n FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(t, i, n) ORDER BY t, i
ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET version = c.version + excluded.version
RETURNING aggregate_type, aggregate_id, version`,
	}, nil
}

// CreateVersionTable creates Config.VersionTable if it does not exist. The table's owner, or a
// role with INSERT, SELECT and UPDATE on it, is what writers need.
func (w *Writer) CreateVersionTable(ctx context.Context, db Execer) error {
	if w.versions == nil {
		return errors.New("outbox: CreateVersionTable: the Writer has no Config.VersionTable")
	}
	if _, err := db.Exec(ctx, w.versions.ddl); err != nil {
		return fmt.Errorf("outbox: create %s: %w", w.versions.table, err)
	}
	return nil
}

// CreateVersionTableSQL is CreateVersionTable for database/sql.
func (w *Writer) CreateVersionTableSQL(ctx context.Context, db SQLExecer) error {
	if w.versions == nil {
		return errors.New("outbox: CreateVersionTableSQL: the Writer has no Config.VersionTable")
	}
	if _, err := db.ExecContext(ctx, w.versions.ddl); err != nil {
		return fmt.Errorf("outbox: create %s: %w", w.versions.table, err)
	}
	return nil
}

type aggregateKey struct{ typ, id string }

// assign returns a copy of events with AggregateVersion set: the events of one aggregate get
// consecutive versions in slice order, after the last one the counter table gave out. It queries
// through pgxTx or, when that is nil, sqlTx.
func (v *versionTable) assign(ctx context.Context, pgxTx Execer, sqlTx SQLExecer, events []Event) ([]Event, error) {
	counts, keys, err := countByAggregate(events)
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return events, nil
	}
	last, err := v.bumpCounters(ctx, pgxTx, sqlTx, counts, keys)
	if err != nil {
		return nil, err
	}
	out := make([]Event, len(events))
	for i, e := range events {
		k := aggregateKey{e.AggregateType, e.AggregateID}
		top, ok := last[k]
		if !ok {
			return nil, fmt.Errorf("outbox: %s returned no version for aggregate %s/%s", v.table, k.typ, k.id)
		}
		// The first of the aggregate's events in this call gets top-count+1, the last top.
		e.AggregateVersion = top - counts[k] + 1
		counts[k]--
		out[i] = e
	}
	return out, nil
}

// countByAggregate counts events per aggregate, and lists the aggregates in (type, id) order: the
// order the counter rows are locked in.
func countByAggregate(events []Event) (map[aggregateKey]int64, []aggregateKey, error) {
	counts := make(map[aggregateKey]int64)
	var keys []aggregateKey
	for i, e := range events {
		if e.AggregateVersion != 0 {
			return nil, nil, fmt.Errorf("outbox: event %d sets AggregateVersion, but the Writer assigns versions (Config.VersionTable): leave it 0", i)
		}
		k := aggregateKey{e.AggregateType, e.AggregateID}
		if counts[k] == 0 {
			keys = append(keys, k)
		}
		counts[k]++
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].typ < keys[j].typ || keys[i].typ == keys[j].typ && keys[i].id < keys[j].id
	})
	return counts, keys, nil
}

// bumpCounters adds each aggregate's count to its counter row in one statement, through pgxTx or,
// when that is nil, sqlTx, and returns the last version each aggregate now has.
func (v *versionTable) bumpCounters(ctx context.Context, pgxTx Execer, sqlTx SQLExecer, counts map[aggregateKey]int64, keys []aggregateKey) (map[aggregateKey]int64, error) {
	failed := func(err error) error {
		return fmt.Errorf("outbox: take the next versions of %d aggregates from %s: %w", len(keys), v.table, err)
	}
	types, ids, ns := make([]string, len(keys)), make([]string, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		types[i], ids[i], ns[i] = k.typ, k.id, counts[k]
	}
	last := make(map[aggregateKey]int64, len(keys))
	scan := func(next func() bool, row func(dst ...any) error) error {
		for next() {
			var k aggregateKey
			var version int64
			if err := row(&k.typ, &k.id, &version); err != nil {
				return err
			}
			last[k] = version
		}
		return nil
	}
	switch q := pgxTx.(type) {
	case nil:
		sq, ok := sqlTx.(interface {
			QueryContext(context.Context, string, ...any) (*sql.Rows, error)
		})
		if !ok {
			return nil, fmt.Errorf("outbox: assigning versions needs a transaction that can query (*sql.Tx), got %T", sqlTx)
		}
		rows, err := sq.QueryContext(ctx, v.bump, types, ids, ns)
		if err != nil {
			return nil, failed(err)
		}
		err = scan(rows.Next, rows.Scan)
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = rows.Err()
		}
		if err != nil {
			return nil, failed(err)
		}
		return last, nil
	case interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	}:
		rows, err := q.Query(ctx, v.bump, types, ids, ns)
		if err != nil {
			return nil, failed(err)
		}
		err = scan(rows.Next, rows.Scan)
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if err != nil {
			return nil, failed(err)
		}
		return last, nil
	default:
		return nil, fmt.Errorf("outbox: assigning versions needs a transaction that can query (pgx.Tx), got %T", pgxTx)
	}
}
