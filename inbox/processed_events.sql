-- The consumer's ledger of handled events. Handle inserts (consumer, event_id) in the consumer's
-- own transaction, next to its business change: the primary key makes a redelivered or concurrently
-- delivered event a no-op, and a rolled-back transaction takes its row with it, so the event is
-- handled again on redelivery.
--
-- consumer lets several consumers (services, or one service's independent projections) share the
-- table, each handling every event once. event_id is text so ids that are not UUIDs work too.
-- processed_at lets old rows be pruned once redelivery of their events is no longer possible
-- (prune.Prune with Column "processed_at").
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     text        NOT NULL DEFAULT '',
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

CREATE INDEX IF NOT EXISTS {{.Index}} ON {{.Table}} (processed_at)
