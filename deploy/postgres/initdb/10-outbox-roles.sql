-- Runs once, as the superuser, when the compose PostgreSQL initialises its data directory.
-- The same least-privilege setup as docs/operations.md ("A least-privilege role"), with demo
-- passwords: `app` owns the outbox table (outbox-relay migrate runs as it and creates the
-- publication); `outbox_relay` only streams. The compose `grant` service adds
-- GRANT SELECT ON public.outbox_events TO outbox_relay once migrate has created the table.
CREATE ROLE app LOGIN PASSWORD 'app';
GRANT CREATE ON DATABASE app TO app;
GRANT CREATE ON SCHEMA public TO app;

CREATE ROLE outbox_relay LOGIN REPLICATION PASSWORD 'outbox_relay';
GRANT CONNECT ON DATABASE app TO outbox_relay;
