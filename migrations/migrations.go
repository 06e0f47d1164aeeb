// Package migrations creates the outbox table. The SQL files are embedded in the binary, applied in
// order, once each, and recorded in outbox_relay_migrations next to the table. The files in poll/
// add what the polling mode (source: poll) keeps on each row; only ApplyPoll applies them, so a
// table relayed from the WAL never gets them.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed *.sql
var files embed.FS

// pollFiles are the polling mode's migrations, numbered from 1001 so they never share a version
// with the common ones in the ledger.
//
//go:embed poll/*.sql
var pollFiles embed.FS

// Target names the outbox table the migrations create.
type Target struct {
	Schema string
	Table  string
	// NoTable applies only what the relay itself needs (the slot ledger, in Schema), not the
	// outbox table: for an outbox of logical decoding messages only. The table's migrations are
	// applied by a later run without it.
	NoTable bool
}

// tableMigrations are the versions that create or change the outbox table itself; the others
// belong to the relay (its slot ledger).
var tableMigrations = map[int]bool{1: true, 3: true}

// migration is one embedded SQL file, named NNNN_description.sql.
type migration struct {
	version int
	name    string
	sql     string
}

func load(fsys fs.FS) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %s: name must start with a number and an underscore", e.Name())
		}
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// render fills a migration's template: {{.Table}} is the outbox table, {{.Name "suffix"}} an
// object name derived from it.
func (m migration) render(t Target) (string, error) {
	tmpl, err := template.New(m.name).Parse(m.sql)
	if err != nil {
		return "", fmt.Errorf("migration %s: %w", m.name, err)
	}
	var b strings.Builder
	err = tmpl.Execute(&b, vars{t})
	if err != nil {
		return "", fmt.Errorf("migration %s: %w", m.name, err)
	}
	return b.String(), nil
}

// vars is what a migration template sees.
type vars struct{ t Target }

// Table is the schema-qualified, quoted outbox table.
func (v vars) Table() string { return pgx.Identifier{v.t.Schema, v.t.Table}.Sanitize() }

// TableLiteral is Table as an SQL string literal, for functions that take a relation name as text.
func (v vars) TableLiteral() string { return "'" + strings.ReplaceAll(v.Table(), "'", "''") + "'" }

// Qualified is another object in the outbox table's schema.
func (v vars) Qualified(name string) string { return pgx.Identifier{v.t.Schema, name}.Sanitize() }

// Name is an object name derived from the table's, e.g. an index.
func (v vars) Name(suffix string) string { return pgx.Identifier{v.t.Table + "_" + suffix}.Sanitize() }

// DeadLetterView is the polling mode's view of dead letters, schema-qualified and quoted.
func (v vars) DeadLetterView() string {
	return pgx.Identifier{v.t.Schema, DeadLetterView(v.t.Table)}.Sanitize()
}

// NotifyFunction names the trigger function that wakes polling relays.
func (v vars) NotifyFunction() string { return v.t.Table + "_notify" }

// ChannelLiteral is the NOTIFY channel as an SQL string literal.
func (v vars) ChannelLiteral() string {
	return "'" + strings.ReplaceAll(Channel(v.t.Table), "'", "''") + "'"
}

// DeadLetterView is the name of the polling mode's dead-letter view for an outbox table:
// outbox_dead_letters for the default outbox_events, <table>_dead_letters for any other, so two
// outbox tables in one schema get a view each.
func DeadLetterView(table string) string {
	if table == "outbox_events" {
		return "outbox_dead_letters"
	}
	return table + "_dead_letters"
}

// Channel is the channel the polling mode's trigger notifies after each INSERT statement into the
// outbox table: the table's name (at most 63 bytes, like a channel name).
func Channel(table string) string { return table }

// Apply runs the migrations not yet recorded, each in its own transaction, and returns the names of
// those it applied. Concurrent callers serialise on an advisory lock.
func Apply(ctx context.Context, conn *pgx.Conn, t Target) ([]string, error) {
	ms, err := load(files)
	if err != nil {
		return nil, err
	}
	return apply(ctx, conn, t, ms)
}

// ApplyPoll is Apply plus the polling mode's migrations (poll/): the columns, indexes, view and
// trigger a relay with source: poll needs.
func ApplyPoll(ctx context.Context, conn *pgx.Conn, t Target) ([]string, error) {
	ms, err := load(files)
	if err != nil {
		return nil, err
	}
	sub, err := fs.Sub(pollFiles, "poll")
	if err != nil {
		return nil, err
	}
	poll, err := load(sub)
	if err != nil {
		return nil, err
	}
	return apply(ctx, conn, t, append(ms, poll...))
}

func apply(ctx context.Context, conn *pgx.Conn, t Target, ms []migration) ([]string, error) {
	ledger := pgx.Identifier{t.Schema, "outbox_relay_migrations"}.Sanitize()
	_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %s;
		CREATE TABLE IF NOT EXISTS %s (
			target     text        NOT NULL,
			version    integer     NOT NULL,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (target, version)
		)`, pgx.Identifier{t.Schema}.Sanitize(), ledger))
	if err != nil {
		return nil, fmt.Errorf("create migrations table %s: %w", ledger, err)
	}
	target := t.Schema + "." + t.Table
	var applied []string
	for _, m := range ms {
		if t.NoTable && tableMigrations[m.version] {
			continue
		}
		done, err := applyOne(ctx, conn, ledger, target, m, t)
		if err != nil {
			return applied, err
		}
		if done {
			applied = append(applied, m.name)
		}
	}
	return applied, nil
}

func applyOne(ctx context.Context, conn *pgx.Conn, ledger, target string, m migration, t Target) (bool, error) {
	sql, err := m.render(t)
	if err != nil {
		return false, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	// One migrator at a time per database; the key is arbitrary but fixed.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(7201730150)"); err != nil {
		return false, fmt.Errorf("lock migrations: %w", err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE target = $1 AND version = $2)", ledger),
		target, m.version).Scan(&exists); err != nil {
		return false, fmt.Errorf("read migrations table: %w", err)
	}
	if exists {
		return false, nil
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available: the migration's lock_timeout
			return false, fmt.Errorf("migration %s: other sessions held a lock on the outbox table for longer than the migration waits (a long transaction, or an open cursor, reads or writes it); nothing was changed: retry, at a quieter moment if it happens again: %w", m.name, err)
		}
		return false, fmt.Errorf("migration %s: %w", m.name, err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (target, version, name) VALUES ($1, $2, $3)", ledger),
		target, m.version, m.name); err != nil {
		return false, fmt.Errorf("record migration %s: %w", m.name, err)
	}
	return true, tx.Commit(ctx)
}
