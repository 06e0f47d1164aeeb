package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// Selection says which rows Retry makes pending again. IDs and DeadLetters may be combined (a row
// matching either is reset); Since and Until narrow both to rows created in [Since, Until).
type Selection struct {
	IDs         []string // event ids (the id column, compared as text)
	DeadLetters bool     // every row in the dead-letter view
	Since       time.Time
	Until       time.Time
}

// Retry is the manual retry path: it makes the selected rows pending again with a clean slate
// (attempts 0, no backoff, processed_at cleared, so a dead letter already sent to the dead-letter
// topic or an event already published goes out again; last_error is kept for the record), wakes
// the polling relays, and returns how many rows it reset. It runs in one transaction.
func Retry(ctx context.Context, conn *pgx.Conn, cfg Config, sel Selection) (int64, error) {
	cfg.setDefaults()
	if len(sel.IDs) == 0 && !sel.DeadLetters {
		return 0, errors.New("retry: nothing selected: give event ids or the dead letters")
	}
	q := newQueries(cfg)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := q.check(ctx, tx.Conn()); err != nil {
		return 0, err
	}
	var which []string
	args := []any{}
	if len(sel.IDs) > 0 {
		args = append(args, sel.IDs)
		which = append(which, fmt.Sprintf("%s::text = ANY($%d::text[])", q.ident, len(args)))
	}
	if sel.DeadLetters {
		which = append(which, "retry_after = 'infinity'")
	}
	where := []string{"(" + strings.Join(which, " OR ") + ")"}
	if !sel.Since.IsZero() {
		args = append(args, sel.Since)
		where = append(where, fmt.Sprintf("%s >= $%d", q.created, len(args)))
	}
	if !sel.Until.IsZero() {
		args = append(args, sel.Until)
		where = append(where, fmt.Sprintf("%s < $%d", q.created, len(args)))
	}
	tag, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET attempts = 0, retry_after = NULL, processed_at = NULL WHERE %s`,
		q.table, strings.Join(where, " AND ")), args...)
	if err != nil {
		return 0, fmt.Errorf("retry: reset rows of %s: %w", q.table, err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", migrations.Channel(cfg.Table)); err != nil {
		return 0, fmt.Errorf("retry: wake the relays: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// Status is the table's queue at a glance (`outbox-relay status` with source poll).
type Status struct {
	Table                string   `json:"table"`
	Pending              int64    `json:"pending_rows"`
	OldestPendingSeconds float64  `json:"oldest_pending_seconds"` // dead letters aside
	InBackoff            int64    `json:"in_backoff"`
	DeadLetters          int64    `json:"dead_letters"`
	DeadPending          int64    `json:"dead_letters_pending"` // under the halt policy: they stop the relays
	OK                   bool     `json:"ok"`
	Problems             []string `json:"problems"`
}

// ReadStatus reads the queue's state; a table not migrated for polling is a problem, not an error.
func ReadStatus(ctx context.Context, conn *pgx.Conn, cfg Config) (Status, error) {
	cfg.setDefaults()
	q := newQueries(cfg)
	st := Status{Table: cfg.Schema + "." + cfg.Table, Problems: []string{}}
	if err := q.check(ctx, conn); err != nil {
		if errors.Is(err, ErrNotMigrated) || errors.Is(err, errMissingColumn) {
			st.Problems = append(st.Problems, err.Error())
			return st, nil
		}
		return st, err
	}
	ts, err := q.stats(ctx, conn)
	if err != nil {
		return st, fmt.Errorf("read the queue of %s: %w", q.table, err)
	}
	st.Pending, st.DeadLetters, st.OldestPendingSeconds = ts.pending, ts.dead, ts.oldestAge.Seconds()
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE retry_after > now() AND retry_after <> 'infinity'),
		count(*) FILTER (WHERE retry_after = 'infinity') FROM %s WHERE processed_at IS NULL`, q.table)).Scan(&st.InBackoff, &st.DeadPending); err != nil {
		return st, fmt.Errorf("read the queue of %s: %w", q.table, err)
	}
	if st.DeadPending > 0 {
		st.Problems = append(st.Problems, fmt.Sprintf("%d dead letters are pending (on_failure: halt stops the relays on them): fix the cause, then outbox-relay retry --dead-letters", st.DeadPending))
	}
	st.OK = len(st.Problems) == 0
	return st, nil
}
