-- Polling mode (source: poll): what a relay that reads the outbox table, rather than the WAL,
-- keeps on each row. Applied only by `outbox-relay migrate --source poll` (and by a relay with
-- source: poll); the WAL mode never needs it.
--
--   processed_at  when Kafka acknowledged the row (or the dead-letter topic took it); NULL while
--                 pending. Only rows with it set are ever pruned.
--   attempts      publishes Kafka refused for good (a permanent error); transient errors (a broker
--                 outage) never count.
--   retry_after   not claimed before this time (exponential backoff with jitter after a refusal);
--                 'infinity' marks a dead letter: refused poll_max_attempts times.
--   last_error    the last refusal, for the operator.
--
-- Existing rows are pending: a table switched from the WAL mode is published again unless its
-- published rows are marked first (docs/operations.md, "Switching between wal and poll").
--
-- Adding the columns takes an ACCESS EXCLUSIVE lock for a moment (no rewrite: the default is a
-- constant); like the seq migration it waits 5s at most behind a long reader, then fails and is
-- retried rather than stalling every writer queued behind it.
SET LOCAL lock_timeout = '5s';

ALTER TABLE {{.Table}}
    ADD COLUMN IF NOT EXISTS attempts     integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS processed_at timestamptz,
    ADD COLUMN IF NOT EXISTS retry_after  timestamptz,
    ADD COLUMN IF NOT EXISTS last_error   text;

-- The queue: pending rows in seq order. The poller claims from its head; the index stays as small
-- as the backlog however large the table grows.
CREATE INDEX IF NOT EXISTS {{.Name "pending_idx"}} ON {{.Table}} (seq) WHERE processed_at IS NULL;
-- Dead letters, for the view and the dead-letter gauge, without scanning the table.
CREATE INDEX IF NOT EXISTS {{.Name "dead_letter_idx"}} ON {{.Table}} (seq) WHERE retry_after = 'infinity';

-- Rows refused poll_max_attempts times. With on_failure: dead-letter they were then published to
-- the dead-letter topic (processed_at set); with halt they are still pending and stop the relays.
-- `outbox-relay retry --dead-letters` makes them pending again.
CREATE OR REPLACE VIEW {{.DeadLetterView}} AS
    SELECT * FROM {{.Table}} WHERE retry_after = 'infinity';

-- Wake-up: one notification per INSERT statement (not per row), delivered at commit, on the
-- channel named like the table. A relay LISTENs and polls at once; it also polls every
-- poll_interval, for notifications missed while it reconnected. NOTIFY serialises committing
-- transactions that send one; at thousands of commits per second, drop this trigger and lower
-- poll_interval instead (docs/operations.md).
CREATE OR REPLACE FUNCTION {{.Qualified .NotifyFunction}}() RETURNS trigger LANGUAGE plpgsql AS $notify$
BEGIN
    PERFORM pg_notify({{.ChannelLiteral}}, '');
    RETURN NULL;
END
$notify$;
DROP TRIGGER IF EXISTS outbox_relay_notify ON {{.Table}};
CREATE TRIGGER outbox_relay_notify AFTER INSERT ON {{.Table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Qualified .NotifyFunction}}();
