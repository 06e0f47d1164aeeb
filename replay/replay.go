// Package replay publishes outbox rows still in the table again, through the relay's sink and its
// failure policy: events chosen by id, by aggregate (optionally a version range) or by creation
// time. Each record carries the header outbox.replay=true. It reads the table in a read-only
// transaction and never touches the replication slot, so it runs next to a streaming relay.
//
// A replay publishes exactly what was asked or nothing: when asked-for rows are no longer in the
// table (pruned), it refuses with the reason before publishing anything, unless told to publish what
// is left (Selection.Partial).
package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxrow"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Header marks a replayed record; its value is "true".
const Header = record.HeaderReplay

// SinkConfig returns the replay's sink configuration from the relay's, c: the replay header added
// (Run hands the sink its value as the last extra column of every event; with placements, it is
// placed as a header), and without Kafka transactions. A replay runs next to a streaming relay:
// a transactional producer with the relay's transactional id would fence it (InitProducerId bumps
// the epoch) and commit a position of its own under the relay's key, which the relay's next start
// would take up. Replayed records are plain idempotent records, visible to read_committed
// consumers at once, and duplicates by design (same id header).
func SinkConfig(c sink.Config) sink.Config {
	r := &c.Record
	r.ExtraHeaders = append(append([]string{}, r.ExtraHeaders...), Header)
	if r.ExtraPlacement != nil {
		r.ExtraPlacement = append(append([]record.Placement{}, r.ExtraPlacement...), record.PlaceHeader)
	}
	c.Transactions = nil
	return c
}

// Table says where the outbox rows are and how to read them (the relay's settings).
type Table struct {
	Schema, Name string
	Columns      decoder.Columns
	Extra        []string // extra_headers columns, in the sink's ExtraHeaders order
	Created      string   // creation time column; default "created_at"
	Order        string   // insertion sequence column; default "seq", falling back to Created
}

// Selection says which rows to publish again. Exactly one of EventIDs, Aggregate* and Since is
// the selection; versions and Until narrow theirs.
type Selection struct {
	EventIDs []string

	AggregateType, AggregateID string
	// FromVersion and ToVersion bound the aggregate's versions (inclusive); 0 leaves a bound open.
	FromVersion, ToVersion int64

	Since, Until time.Time // Until zero: up to now

	// Partial publishes what is left of a selection rows of which were pruned, instead of
	// refusing.
	Partial bool
	// DryRun counts and checks, and publishes nothing.
	DryRun bool
}

// Publisher is the sink: Publish hands an event over, ack is told when Kafka acknowledged it or
// the failure policy settled it.
type Publisher interface {
	Publish(ctx context.Context, ev *decoder.Event, ack sink.Acker) error
}

// Result is what a replay did.
type Result struct {
	Selected  int64 // rows that matched
	Published int64 // handed to the sink and settled (acknowledged or dead-lettered)
	Oldest    time.Time
	Newest    time.Time
}

// ErrRefused marks a selection refused before anything was published.
var ErrRefused = errors.New("replay refused")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// Run checks the selection against the table, then publishes the selected rows in insertion
// order (see Table.order) and waits until every one is settled.
func Run(ctx context.Context, conn *pgx.Conn, t Table, sel Selection, pub Publisher) (Result, error) {
	if t.Schema == "" {
		t.Schema = "public"
	}
	if t.Created == "" {
		t.Created = "created_at"
	}
	if t.Order == "" {
		t.Order = "seq"
	}
	where, args, err := t.where(sel)
	if err != nil {
		return Result{}, err
	}
	// Timestamps in the format the decoder reads (columns.timestamp), whatever the database's
	// DateStyle: as the backfill and the stream read them.
	tx, err := outboxrow.Begin(ctx, conn, "")
	if err != nil {
		return Result{}, fmt.Errorf("replay: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	table := pgx.Identifier{t.Schema, t.Name}.Sanitize()
	order, err := t.prepare(ctx, tx, table, sel, where, args)
	if err != nil {
		return Result{}, err
	}
	reader := outboxrow.NewReader(decoder.Config{Columns: t.Columns, Extra: t.Extra}, t.Created)
	rows, err := reader.Query(ctx, tx, fmt.Sprintf("SELECT %s FROM %s WHERE %s ORDER BY %s", reader.Select(""), table, where, order),
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	if err != nil {
		return Result{}, fmt.Errorf("replay: read %s: %w", table, err)
	}
	defer rows.Close()
	return publish(ctx, rows, table, sel.DryRun, pub)
}

// prepare checks the columns a replay reads and the selection against what is left of the table,
// and returns the ORDER BY list.
func (t Table) prepare(ctx context.Context, tx pgx.Tx, table string, sel Selection, where string, args []any) (string, error) {
	if ok, err := outboxrow.HasColumn(ctx, tx, table, t.Created); err != nil {
		return "", fmt.Errorf("replay: %w", err)
	} else if !ok {
		return "", fmt.Errorf("replay: the outbox table %s has no column %q (columns.created_at): a replay reads each row's creation time from it, for the record timestamp and the time range; name the table's creation time column in columns.created_at, or add one (Debezium's outbox table has none)", table, t.Created)
	}
	hasSeq, err := outboxrow.HasColumn(ctx, tx, table, t.Order)
	if err != nil {
		return "", err
	}
	if err := t.check(ctx, tx, table, hasSeq, sel, where, args); err != nil {
		return "", err
	}
	byVersion := false
	if v := t.Columns.AggregateVersion; !hasSeq && v != "" {
		// Only numbers order versions: a version column of another type leaves the creation time.
		if byVersion, err = outboxrow.IsIntegerColumn(ctx, tx, table, v); err != nil {
			return "", fmt.Errorf("replay: %w", err)
		}
	}
	return t.order(hasSeq, byVersion), nil
}

// publish hands the rows of table to pub (none with dryRun), each with the replay header, and
// waits until every one is settled.
func publish(ctx context.Context, rows *outboxrow.Rows, table string, dryRun bool, pub Publisher) (Result, error) {
	var res Result
	var acks sink.AckGroup
	for rows.Next() {
		row := rows.Row()
		ev := row.Event
		if row.Unusable != nil {
			return res, fmt.Errorf("replay: event %s: %w", ev.ID, row.Unusable)
		}
		if created := row.Created; !created.IsZero() {
			if res.Oldest.IsZero() || created.Before(res.Oldest) {
				res.Oldest = created
			}
			if created.After(res.Newest) {
				res.Newest = created
			}
		}
		ev.Extra = append(ev.Extra[:len(ev.Extra):len(ev.Extra)], []byte("true")) // the replay header, last
		if ev.ExtraKinds != nil {
			ev.ExtraKinds = append(ev.ExtraKinds, decoder.KindBool)
		}
		res.Selected++
		if dryRun {
			continue
		}
		acks.Add()
		if err := pub.Publish(ctx, ev, &acks); err != nil {
			return res, fmt.Errorf("replay: after %d events: %w", res.Published, err)
		}
		res.Published++
	}
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("replay: read %s: %w", table, err)
	}
	if err := acks.Wait(ctx); err != nil {
		return res, fmt.Errorf("replay: waiting for Kafka to acknowledge: %w", err)
	}
	return res, nil
}

// Validate reports a selection that cannot run against t (none or several kinds, a version range
// without a version column, a range that ends before it starts), before anything is contacted.
func (t Table) Validate(sel Selection) error {
	_, _, err := t.where(sel)
	return err
}

// order is the ORDER BY list rows are published in. What matters is each aggregate's order (its
// events share a key, so a partition): the insertion order column (backfill_order) gives it where
// the table has one. Without it the creation time is what is left, and it may disagree with an
// aggregate's versions (equal within a transaction, clocks), so with byVersion (a numeric version
// column) each aggregate's events go in version order, aggregate after aggregate, and an event
// without a version goes after the versions created before it (the highest of them): the
// versioned ones stay in order, the others about where they were written (within one transaction,
// which shares a creation time, anywhere among its versioned events). That order sorts the whole
// selection before its first row, which a replay's selections afford (the backfill, reading the
// whole table, keeps the creation time order that streams from an index).
func (t Table) order(hasSeq, byVersion bool) string {
	col := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	c := t.Columns
	switch {
	case hasSeq:
		return col(t.Order) + ", " + col(c.ID)
	case byVersion:
		typ, id, v, created := col(c.AggregateType), col(c.AggregateID), col(c.AggregateVersion), col(t.Created)
		return fmt.Sprintf("%s, %s, coalesce(%s, max(%s) OVER (PARTITION BY %s, %s ORDER BY %s, %s), 0), %s, %s",
			typ, id, v, v, typ, id, created, col(c.ID), created, col(c.ID))
	default:
		return col(t.Created) + ", " + col(c.ID)
	}
}

// where builds the selection's condition.
func (t Table) where(sel Selection) (string, []any, error) {
	c := t.Columns
	col := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	kinds := 0
	if len(sel.EventIDs) > 0 {
		kinds++
	}
	if sel.AggregateType != "" || sel.AggregateID != "" {
		kinds++
	}
	if !sel.Since.IsZero() {
		kinds++
	}
	if kinds != 1 {
		return "", nil, errors.New("replay: choose one selection: event ids, an aggregate (type and id), or a time range (since)")
	}
	// Bounds that belong to another kind of selection would be ignored: refuse them instead, since
	// a replay wider than asked for publishes what the operator meant to leave alone.
	if (sel.FromVersion != 0 || sel.ToVersion != 0) && sel.AggregateType == "" && sel.AggregateID == "" {
		return "", nil, errors.New("replay: a version range (from/to version) selects within one aggregate: give its type and id, not event ids or a time range")
	}
	if !sel.Until.IsZero() && sel.Since.IsZero() {
		return "", nil, errors.New("replay: a time range needs its start (since); until alone would be ignored")
	}
	switch {
	case len(sel.EventIDs) > 0:
		return col(c.ID) + "::text = ANY($1::text[])", []any{sel.EventIDs}, nil
	case !sel.Since.IsZero():
		until := sel.Until
		if until.IsZero() {
			until = time.Now().Add(time.Hour) // rows created up to now, whatever the clocks say
		}
		if !until.After(sel.Since) {
			return "", nil, fmt.Errorf("replay: the time range ends (%s) before it starts (%s)", until.Format(time.RFC3339), sel.Since.Format(time.RFC3339))
		}
		return fmt.Sprintf("%s >= $1 AND %s < $2", col(t.Created), col(t.Created)), []any{sel.Since, until}, nil
	}
	if sel.AggregateType == "" || sel.AggregateID == "" {
		return "", nil, errors.New("replay: an aggregate needs both its type and its id")
	}
	w := fmt.Sprintf("%s = $1 AND %s = $2", col(c.AggregateType), col(c.AggregateID))
	args := []any{sel.AggregateType, sel.AggregateID}
	if sel.FromVersion != 0 || sel.ToVersion != 0 {
		if c.AggregateVersion == "" {
			return "", nil, errors.New("replay: a version range needs the aggregate version column (config key columns.aggregate_version)")
		}
		if sel.ToVersion != 0 && sel.ToVersion < sel.FromVersion {
			return "", nil, fmt.Errorf("replay: the version range ends (%d) before it starts (%d)", sel.ToVersion, sel.FromVersion)
		}
		if sel.FromVersion != 0 {
			args = append(args, sel.FromVersion)
			w += fmt.Sprintf(" AND %s >= $%d", col(c.AggregateVersion), len(args))
		}
		if sel.ToVersion != 0 {
			args = append(args, sel.ToVersion)
			w += fmt.Sprintf(" AND %s <= $%d", col(c.AggregateVersion), len(args))
		}
	}
	return w, args, nil
}

// check refuses a selection whose rows the table no longer has all of.
func (t Table) check(ctx context.Context, tx pgx.Tx, table string, hasSeq bool, sel Selection, where string, args []any) error {
	c := t.Columns
	col := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	switch {
	case len(sel.EventIDs) > 0:
		rows, err := tx.Query(ctx, fmt.Sprintf("SELECT %s::text FROM %s WHERE %s", col(c.ID), table, where), args...)
		if err != nil {
			return fmt.Errorf("replay: look up the events in %s: %w", table, err)
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("replay: look up the events in %s: %w", table, err)
		}
		have := make(map[string]bool, len(found))
		for _, id := range found {
			have[id] = true
		}
		var missing []string
		for _, id := range sel.EventIDs {
			if !have[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 && !sel.Partial {
			return refuse("%d of %d events are not in %s (pruned, or never written; ids are compared in the column's text form): %s",
				len(missing), len(sel.EventIDs), table, strings.Join(missing, ", "))
		}
	case !sel.Since.IsZero():
		// Rows older than the oldest one left may have been pruned. The insertion sequence tells:
		// it starts at 1, so a lowest seq above 1 means rows before it were deleted (or, rarely,
		// rolled back). Without it, any range starting before the oldest row is suspect.
		var oldest *time.Time
		var lowest *int64
		seq := "NULL::bigint"
		if hasSeq {
			seq = "min(" + col(t.Order) + ")::bigint"
		}
		if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT min(%s), %s FROM %s", col(t.Created), seq, table)).Scan(&oldest, &lowest); err != nil {
			return fmt.Errorf("replay: read the oldest row of %s: %w", table, err)
		}
		deleted := !hasSeq || lowest != nil && *lowest > 1
		if !sel.Partial && deleted && (oldest == nil || !oldest.Before(sel.Since)) {
			horizon := "the table is empty"
			if oldest != nil {
				horizon = "its oldest row was created at " + oldest.UTC().Format(time.RFC3339Nano)
			}
			if lowest != nil {
				horizon += fmt.Sprintf(" and has %s %d, so older rows were deleted", t.Order, *lowest)
			}
			return refuse("the range starts at %s, but %s: rows in the range may have been pruned (prune_older_than); replay from a later time, or pass --partial to publish what is left",
				sel.Since.UTC().Format(time.RFC3339), horizon)
		}
	default:
		if c.AggregateVersion == "" {
			return nil // nothing tells a pruned event of an unversioned aggregate
		}
		rows, err := tx.Query(ctx, fmt.Sprintf("SELECT DISTINCT %s FROM %s WHERE %s AND %s IS NOT NULL ORDER BY 1",
			col(c.AggregateVersion), table, where, col(c.AggregateVersion)), args...)
		if err != nil {
			return fmt.Errorf("replay: read the versions of %s/%s: %w", sel.AggregateType, sel.AggregateID, err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("replay: read the versions of %s/%s: %w", sel.AggregateType, sel.AggregateID, err)
		}
		if sel.Partial {
			return nil
		}
		if missing := missingVersions(versions, sel.FromVersion, sel.ToVersion); missing != "" {
			return refuse("versions %s of aggregate %s/%s are not in %s (pruned, or never written); pass --partial to publish what is left",
				missing, sel.AggregateType, sel.AggregateID, table)
		}
	}
	return nil
}

// missingVersions lists the versions from..to (from 1 and up to the highest present when a bound is
// open) that are not in have (sorted), as ranges: "1..3, 7".
func missingVersions(have []int64, from, to int64) string {
	if from == 0 {
		from = 1
	}
	if to == 0 {
		if len(have) == 0 {
			return fmt.Sprintf("%d and later", from)
		}
		to = have[len(have)-1]
	}
	var out []string
	next := from
	add := func(a, b int64) {
		if a == b {
			out = append(out, fmt.Sprint(a))
		} else {
			out = append(out, fmt.Sprintf("%d..%d", a, b))
		}
	}
	for _, v := range have {
		if v < next {
			continue
		}
		if v > next {
			add(next, min(v-1, to))
		}
		next = v + 1
		if next > to {
			break
		}
	}
	if next <= to {
		add(next, to)
	}
	return strings.Join(out, ", ")
}
