package poll

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxrow"
)

// seqColumn is the insertion sequence the claim orders by: the identity column that migration
// 0003 adds (migrate --source poll applies it too).
const seqColumn = "seq"

// scanFactor: a claim looks at this many batches' worth of the queue's head, so that while other
// workers hold the aggregates at the very head, this one still finds a batch of its own behind them.
const scanFactor = 4

// maxWindows bounds how far one claim looks along the queue when nothing in a window can be
// taken (every row's aggregate is another worker's, or waits behind an earlier row of its own in
// backoff): each window is twice the previous one, so four reach 60 batches past the head.
const maxWindows = 4

// queries holds the SQL of one table, built once.
type queries struct {
	cfg                                 Config
	reader                              outboxrow.Reader // the row's event, as the backfill reads it
	table                               string
	claimSQL, windowSQL, verifySQL      string
	doneSQL, refuseSQL, statsSQL        string
	aggType, aggID, seq, created, ident string
}

func newQueries(cfg Config) queries {
	q := queries{cfg: cfg, table: pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()}
	ident := func(c string) string { return pgx.Identifier{c}.Sanitize() }
	q.aggType, q.aggID, q.seq, q.created = ident(cfg.Columns.AggregateType), ident(cfg.Columns.AggregateID), ident(seqColumn), ident(cfg.CreatedColumn)
	q.ident = ident(cfg.Columns.ID)
	q.reader = outboxrow.NewReader(decoder.Config{Columns: cfg.Columns, Extra: cfg.Extra}, cfg.CreatedColumn)
	// The advisory lock's key: a class for this table (so two outbox tables do not share aggregate
	// locks) and a hash of the aggregate. Two aggregates with one hash only take turns. The
	// aggregate columns are read as text, as the WAL mode reads them, whatever their type (uuid,
	// an enum): the key concatenates them, and verify compares them as strings.
	aggKey := "hashtext(coalesce(c.agg_type, '') || '/' || coalesce(c.agg_id, ''))"
	due := "(retry_after IS NULL OR retry_after <= now() OR retry_after = 'infinity')"
	// cand: the head of the queue, materialised so the locks below are tried on these rows only.
	// mine: the first $2 of them whose aggregate this transaction can lock; an aggregate another
	// worker holds is skipped whole. The rows are then locked; SKIP LOCKED passes over a row some
	// other session holds (verify then drops the rest of its aggregate), and the re-check of
	// processed_at on the row's newest version drops a row a worker marked since the snapshot.
	// The rows are fetched by their seqs as an array, not joined against mine: statistics taken
	// while the queue was empty (autovacuum's usual view of a healthy queue) make the planner
	// expect one pending row and join in a nested loop that compares every pending row with every
	// claimed one, which in a backlog costs more per claim than the claim brings.
	q.claimSQL = fmt.Sprintf(`WITH cand AS MATERIALIZED (
		SELECT %[2]s AS seq, %[3]s::text AS agg_type, %[4]s::text AS agg_id FROM %[1]s
		WHERE processed_at IS NULL AND %[5]s AND %[2]s > $3 ORDER BY %[2]s LIMIT $1
	), mine AS MATERIALIZED (
		SELECT c.seq FROM cand c WHERE pg_try_advisory_xact_lock(hashtext(%[6]s), %[7]s) LIMIT $2
	)
	SELECT %[8]s, t.%[2]s, t.retry_after = 'infinity', coalesce(t.last_error, '')
	FROM %[1]s t WHERE t.%[2]s = ANY (ARRAY(SELECT seq FROM mine)) AND t.processed_at IS NULL
	ORDER BY t.%[2]s FOR UPDATE OF t SKIP LOCKED`,
		q.table, q.seq, q.aggType, q.aggID, due, quote("outbox-relay:"+cfg.Schema+"."+cfg.Table), aggKey,
		q.reader.Select("t"))
	// The extent of the window a claim looked at: how many due rows it held, and the last one's seq.
	q.windowSQL = fmt.Sprintf(`SELECT count(*), coalesce(max(seq), 0) FROM (
		SELECT %[2]s AS seq FROM %[1]s WHERE processed_at IS NULL AND %[3]s AND %[2]s > $1 ORDER BY %[2]s LIMIT $2) w`,
		q.table, q.seq, due)
	// A fresh snapshot, taken after the locks: every row pending now with a seq up to the batch's
	// last, whoever holds it.
	q.verifySQL = fmt.Sprintf(`SELECT %[2]s, %[3]s::text, %[4]s::text FROM %[1]s WHERE processed_at IS NULL AND %[2]s <= $1 ORDER BY %[2]s`,
		q.table, q.seq, q.aggType, q.aggID)
	q.doneSQL = fmt.Sprintf(`UPDATE %[1]s SET processed_at = now() WHERE %[2]s = ANY($1) AND processed_at IS NULL`, q.table, q.seq)
	// attempts on the right is the value before this update: the first retry waits RetryBackoff
	// (times the jitter, 0.5 to 1), each further one twice as long, up to maxBackoff.
	q.refuseSQL = fmt.Sprintf(`UPDATE %[1]s t SET attempts = t.attempts + 1, last_error = f.err,
		retry_after = CASE WHEN t.attempts + 1 >= $3 THEN 'infinity'::timestamptz
			ELSE now() + least($5::float8, $4::float8 * power(2, least(t.attempts, 30))) * (0.5 + random() / 2) * interval '1 millisecond' END
	FROM unnest($1::bigint[], $2::text[]) AS f(seq, err)
	WHERE t.%[2]s = f.seq AND t.processed_at IS NULL
	RETURNING t.%[2]s, t.retry_after = 'infinity'`, q.table, q.seq)
	q.statsSQL = fmt.Sprintf(`SELECT
		(SELECT count(*) FROM %[1]s WHERE processed_at IS NULL),
		coalesce((SELECT extract(epoch FROM now() - %[3]s) FROM %[1]s
			WHERE processed_at IS NULL AND retry_after IS DISTINCT FROM 'infinity' ORDER BY %[2]s LIMIT 1), 0),
		(SELECT count(*) FROM %[1]s WHERE retry_after = 'infinity')`, q.table, q.seq, q.created)
	return q
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

var errMissingColumn = errors.New("missing column")

// check verifies the table has what polling needs: the migration's columns and the mapped ones.
func (q queries) check(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `SELECT attname::text FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, q.table)
	if err != nil {
		return fmt.Errorf("read the columns of %s: %w", q.table, err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read the columns of %s: %w", q.table, err)
	}
	if len(have) == 0 {
		return fmt.Errorf("%w: the outbox table %s does not exist: run outbox-relay migrate --source poll", ErrNotMigrated, q.table)
	}
	set := make(map[string]bool, len(have))
	for _, c := range have {
		set[c] = true
	}
	for _, c := range []string{seqColumn, "attempts", "processed_at", "retry_after", "last_error"} {
		if !set[c] {
			return fmt.Errorf("%w: %s has no column %q: run outbox-relay migrate --source poll (source: poll needs its migration)", ErrNotMigrated, q.table, c)
		}
	}
	c := q.cfg.Columns
	mapped := map[string]string{"columns.id": c.ID, "columns.aggregate_type": c.AggregateType, "columns.aggregate_id": c.AggregateID,
		"columns.event_type": c.EventType, "columns.payload": c.Payload, "columns.headers": c.Headers, "columns.created_at": q.cfg.CreatedColumn,
		"columns.aggregate_version": c.AggregateVersion, "columns.timestamp": c.Timestamp, "columns.tracing_span_context": c.TracingSpanContext}
	for key, col := range mapped {
		if col != "" && !set[col] {
			return fmt.Errorf("%w: the outbox table %s has no column %q (config key %s)", errMissingColumn, q.table, col, key)
		}
	}
	for _, col := range q.cfg.Extra {
		if !set[col] {
			return fmt.Errorf("%w: the outbox table %s has no column %q (config key extra_headers)", errMissingColumn, q.table, col)
		}
	}
	return nil
}

// row is one claimed outbox row.
type row struct {
	seq       int64
	ev        *decoder.Event
	dead      bool   // refused MaxAttempts times: for the failure policy
	lastError string // why it was refused last
	unusable  error  // the row cannot be published as it is (decoder.Change.Unusable): for the failure policy
}

// aggKey is the ordering domain: aggregate type and id, NULL apart from empty.
type aggKey struct {
	typ, id          string
	nullType, nullID bool
}

// claim locks a batch in tx and returns it in seq order. busy reports that pending rows were seen
// but none could be claimed (their aggregates are other workers').
//
// When nothing in the window at the queue's head can be taken, the claim looks further along, so
// that one aggregate with a long queue cannot hold up every other: its rows may fill the window
// while another worker holds it, or while they wait behind its row in backoff. The rows and locks
// of a window that gave nothing stay with the transaction, which only delays them.
func (q queries) claim(ctx context.Context, tx pgx.Tx, batch int) (rows []row, busy bool, err error) {
	after, window, claimed := int64(math.MinInt64), batch*scanFactor, false
	for round := 0; ; round++ {
		got, err := q.claimWindow(ctx, tx, after, window, batch)
		if err != nil {
			return nil, false, err
		}
		if len(got) > 0 {
			claimed = true
			kept, err := q.verify(ctx, tx, got)
			if err != nil || len(kept) > 0 {
				return kept, false, err
			}
		}
		var n int
		var last int64
		if err := tx.QueryRow(ctx, q.windowSQL, pgx.QueryExecModeSimpleProtocol, after, window).Scan(&n, &last); err != nil {
			return nil, false, fmt.Errorf("claim: %w", err)
		}
		if round == 0 && n == 0 {
			return nil, false, nil // nothing is due
		}
		if round > 0 || claimed {
			// Rows were claimed and all wait behind earlier rows of their aggregates (in backoff
			// or held), or the claim looked past the head and found every aggregate taken: trying
			// again at once would scan the same rows to find the same. A new row's notification
			// wakes the worker sooner than the poll interval.
			if n < window || round == maxWindows-1 {
				return nil, false, nil
			}
		} else if n < window {
			break // the head, all of it held by other workers: a short wait (busy) and again
		}
		after, window = last, window*2
	}
	// Whether the queue's head was empty or all taken: one cheap look decides how long to wait.
	var head bool
	if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE processed_at IS NULL AND (retry_after IS NULL OR retry_after <= now()))", q.table)).Scan(&head); err != nil {
		return nil, false, fmt.Errorf("claim: %w", err)
	}
	return nil, head, nil
}

// claimWindow is one claim of at most batch rows among the window due rows after seq after.
func (q queries) claimWindow(ctx context.Context, tx pgx.Tx, after int64, window, batch int) (rows []row, err error) {
	res, err := q.reader.Query(ctx, tx, q.claimSQL, pgx.QueryExecModeSimpleProtocol, window, batch, after)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	defer res.Close()
	for res.Next() {
		// The same event as the WAL mode's and the backfill's of the row; its creation time is
		// what the end-to-end latency is measured from.
		got := res.Row()
		got.Event.RawSize = got.Size
		r := row{ev: got.Event, unusable: got.Unusable}
		if r.seq, err = strconv.ParseInt(string(got.Rest[0]), 10, 64); err != nil {
			return nil, fmt.Errorf("claim: seq %q: %w", got.Rest[0], err)
		}
		r.dead = string(got.Rest[1]) == "t"
		r.lastError = string(got.Rest[2])
		rows = append(rows, r)
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return rows, nil
}

// verify keeps of rows (in seq order) those that no pending row of their aggregate outside rows
// precedes, reading with a snapshot taken after the claim's locks: such a row is in backoff, was
// locked by some other session, or was released by another worker while the claim ran. Dropped
// rows stay locked until the transaction ends, which only delays them.
func (q queries) verify(ctx context.Context, tx pgx.Tx, rows []row) ([]row, error) {
	mine := make(map[int64]bool, len(rows))
	for _, r := range rows {
		mine[r.seq] = true
	}
	res, err := tx.Query(ctx, q.verifySQL, rows[len(rows)-1].seq)
	if err != nil {
		return nil, fmt.Errorf("claim: verify: %w", err)
	}
	defer res.Close()
	blocked := make(map[aggKey]bool)
	keep := make(map[int64]bool, len(rows))
	for res.Next() {
		var seq int64
		var typ, id *string
		if err := res.Scan(&seq, &typ, &id); err != nil {
			return nil, fmt.Errorf("claim: verify: %w", err)
		}
		k := aggKey{nullType: typ == nil, nullID: id == nil}
		if typ != nil {
			k.typ = *typ
		}
		if id != nil {
			k.id = *id
		}
		switch {
		case !mine[seq]:
			blocked[k] = true // every later row of the aggregate waits for this one
		case !blocked[k]:
			keep[seq] = true
		}
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("claim: verify: %w", err)
	}
	kept := rows[:0]
	for _, r := range rows {
		if keep[r.seq] {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// stats is what the gauges show.
type tableStats struct {
	pending, dead int64
	oldestAge     time.Duration
}

func (q queries) stats(ctx context.Context, conn *pgx.Conn) (tableStats, error) {
	var st tableStats
	var age float64
	if err := conn.QueryRow(ctx, q.statsSQL).Scan(&st.pending, &age, &st.dead); err != nil {
		return st, err
	}
	st.oldestAge = time.Duration(age * float64(time.Second))
	return st, nil
}
