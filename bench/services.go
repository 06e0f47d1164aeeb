package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// Services are the PostgreSQL and Kafka every side of the benchmark shares.
type Services struct {
	PG    *devenv.Postgres
	Kafka *devenv.Kafka
	// Registry is the schema registry of side relay-avro; nil when no side needs one.
	Registry *devenv.Registry
	DSN      string // the benchmark's database
	owned    bool   // started by StartServices, so Close stops them
}

// pgSettings tune the throwaway cluster for throughput. devenv already sets fsync=off and
// full_page_writes=off; synchronous_commit stays on so commits mean what they mean in production.
var pgSettings = map[string]string{
	"shared_buffers":     "512MB",
	"wal_buffers":        "64MB",
	"max_wal_size":       "32GB", // no checkpoint in the middle of a side's drain
	"min_wal_size":       "2GB",
	"checkpoint_timeout": "1h",
	"autovacuum":         "off", // the outbox is insert-only here; vacuum would only add noise
	"wal_sender_timeout": "60s",
	// logical_decoding_work_mem stays at its default (64MB): the large transaction spills to disk
	// in the walsender as it would in production.
}

// ServiceOptions say which PostgreSQL and Kafka StartServices starts.
type ServiceOptions struct {
	KafkaHeapMB int
	PGVersion   string // PostgreSQL major version; empty: the server binaries on PATH
	Registry    bool   // start a schema registry (side relay-avro)
}

// StartServices starts a PostgreSQL cluster and a Kafka broker for one run.
func StartServices(ctx context.Context, opts ServiceOptions) (*Services, error) {
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Settings: pgSettings, Database: "bench", Version: opts.PGVersion})
	if err != nil {
		return nil, err
	}
	k, err := devenv.StartKafka(ctx, devenv.KafkaOptions{HeapMB: opts.KafkaHeapMB, Settings: map[string]string{
		"auto.create.topics.enable": "false", // every topic is created up front with the same partitions
		// A measured side's topics are deleted (topics.go): their logs go at once, while the bench
		// waits for the deletion, not a minute later in another side's measured window.
		"file.delete.delay.ms": "0",
	}})
	if err != nil {
		_ = pg.Close(context.Background())
		return nil, err
	}
	svc := &Services{PG: pg, Kafka: k, DSN: pg.DSN("bench"), owned: true}
	if opts.Registry {
		if svc.Registry, err = devenv.StartRegistry(ctx, devenv.RegistryOptions{}); err != nil {
			_ = svc.Close()
			return nil, err
		}
	}
	return svc, nil
}

// Close stops what StartServices started.
func (s *Services) Close() error {
	if !s.owned {
		return nil
	}
	ctx := context.Background()
	var reg error
	if s.Registry != nil {
		reg = s.Registry.Close(ctx)
	}
	return errors.Join(reg, s.Kafka.Close(ctx), s.PG.Close(ctx))
}

// aggregateTypes route the events to three topics per side.
var aggregateTypes = []string{"order", "customer", "shipment"}

// setupSQL creates the workload's helpers: one payload of about 300 bytes (jsonb text) per event,
// 1,000 aggregates whose type is fixed by their number, and a procedure that writes a backlog in
// transactions of 1 to 50 events without a client round trip per transaction.
const setupSQL = `
CREATE OR REPLACE FUNCTION bench_payload(a int, n bigint, sent bigint, warm bool) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
  SELECT jsonb_build_object('aggregate', 'agg-' || a, 'n', n, 'sent_ns', sent, 'warm', warm,
    'amount', round((n % 100000) / 100.0, 2), 'currency', 'EUR', 'note', repeat('x', 200))
$$;

CREATE OR REPLACE FUNCTION bench_type(a int) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT (ARRAY['order', 'customer', 'shipment'])[1 + a % 3]
$$;

-- bench_insert writes k events in the caller's transaction.
CREATE OR REPLACE FUNCTION bench_insert(k int, first bigint, sent bigint, warm bool) RETURNS void
LANGUAGE sql AS $$
  INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
  SELECT bench_type(a), 'agg-' || a, 'Happened', bench_payload(a, n, sent, warm),
         jsonb_build_object('tenant', 't' || (a % 10))
  FROM (SELECT floor(random() * 1000)::int AS a, n FROM generate_series(first, first + k - 1) AS n) AS s
$$;

-- bench_emit writes the same k events as bench_insert, as transactional logical decoding messages
-- with prefix (the table-free outbox): the content names its members like the table's columns,
-- and the id is generated like the table's default. count() makes the function emit them all.
CREATE OR REPLACE FUNCTION bench_emit(k int, first bigint, sent bigint, warm bool, prefix text) RETURNS void
LANGUAGE sql AS $$
  SELECT count(pg_logical_emit_message(true, prefix, jsonb_build_object('id', gen_random_uuid(),
           'aggregate_type', bench_type(a), 'aggregate_id', 'agg-' || a, 'event_type', 'Happened',
           'payload', bench_payload(a, n, sent, warm), 'headers', jsonb_build_object('tenant', 't' || (a % 10)))::text))
  FROM (SELECT floor(random() * 1000)::int AS a, n FROM generate_series(first, first + k - 1) AS n) AS s
$$;

-- bench_backlog writes total events in transactions of 1 to max_tx events: table rows, or with a
-- prefix, logical decoding messages.
CREATE OR REPLACE PROCEDURE bench_backlog(total bigint, max_tx int, prefix text DEFAULT NULL) LANGUAGE plpgsql AS $$
DECLARE
  written bigint := 0;
  k int;
BEGIN
  WHILE written < total LOOP
    k := least(total - written, 1 + floor(random() * max_tx)::int);
    IF prefix IS NULL THEN
      PERFORM bench_insert(k, written + 1, 0, false);
    ELSE
      PERFORM bench_emit(k, written + 1, 0, false, prefix);
    END IF;
    written := written + k;
    COMMIT;
  END LOOP;
END $$;
`

// setupDatabase creates the outbox table (the project's migrations), the helpers and the
// publication.
func setupDatabase(ctx context.Context, dsn, publication string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect to the bench database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events"}); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := conn.Exec(ctx, setupSQL); err != nil {
		return fmt.Errorf("bench helpers: %w", err)
	}
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE public.outbox_events WITH (publish = 'insert')",
		pgx.Identifier{publication}.Sanitize()))
	if err != nil {
		return fmt.Errorf("create publication: %w", err)
	}
	return nil
}

// recordLostSlot makes slot a lost one: the ledger says the relay created it and Kafka acknowledged
// every transaction committed until now, and no such slot exists.
func recordLostSlot(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	_, err := pool.Exec(ctx, `INSERT INTO public.outbox_relay_slots (slot, consistent_lsn, confirmed_commit_time)
		VALUES ($1, pg_current_wal_lsn(), clock_timestamp())`, slot)
	if err != nil {
		return fmt.Errorf("record lost slot %s in the ledger: %w", slot, err)
	}
	return nil
}

func createSlot(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	if _, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		return fmt.Errorf("create slot %s: %w", slot, err)
	}
	return nil
}

// dropSlot frees the WAL a finished side no longer needs; it waits for the slot's walsender to go.
func dropSlot(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", slot)
		if err != nil {
			return fmt.Errorf("drop slot %s: %w", slot, err)
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drop slot %s: still active after 30s", slot)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// currentLSN is the WAL position after everything committed so far.
func currentLSN(ctx context.Context, pool *pgxpool.Pool) (uint64, error) {
	var lsn uint64
	err := pool.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::bigint").Scan(&lsn)
	return lsn, err
}

// slotState returns the slot's confirmed flush LSN and the pid of its walsender (0 when idle).
func slotState(ctx context.Context, pool *pgxpool.Pool, slot string) (confirmed uint64, pid int, err error) {
	var c *uint64
	var p *int32
	err = pool.QueryRow(ctx, `SELECT (confirmed_flush_lsn - '0/0')::bigint, active_pid FROM pg_replication_slots
		WHERE slot_name = $1`, slot).Scan(&c, &p)
	if err != nil {
		return 0, 0, fmt.Errorf("slot %s: %w", slot, err)
	}
	if c != nil {
		confirmed = *c
	}
	if p != nil {
		pid = int(*p)
	}
	return confirmed, pid, nil
}

// waitSlotActive waits until a client streams the slot.
func waitSlotActive(ctx context.Context, pool *pgxpool.Pool, slot string, c runner, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, pid, err := slotState(ctx, pool, slot)
		if err != nil {
			return err
		}
		if pid != 0 {
			return nil
		}
		if c.exited() {
			return c.failure()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s not streamed within %s; %s", slot, timeout, c.logTail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// pgRecvLogical finds pg_recvlogical: on PATH, or with the server binaries Debian keeps off PATH.
func pgRecvLogical() (string, error) {
	if p, err := exec.LookPath("pg_recvlogical"); err == nil {
		return p, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.Reverse(dirs) // newest major first
	for _, d := range dirs {
		if p := filepath.Join(d, "pg_recvlogical"); isExecutable(p) {
			return p, nil
		}
	}
	return "", errors.New("pg_recvlogical not found: install postgresql-client (make tools does)")
}

// isExecutable: LookPath with a slash in the name checks that very file.
func isExecutable(path string) bool {
	_, err := exec.LookPath(path)
	return err == nil
}
