-- The outbox table. A service inserts one row per event in the same transaction as its business
-- change; the relay reads the INSERTs from the WAL, so rows may be deleted right after (or in the
-- same transaction) without losing events.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb,
    headers        jsonb,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- Pruning deletes old rows in batches by age.
CREATE INDEX IF NOT EXISTS {{.Name "created_at_idx"}} ON {{.Table}} (created_at);
