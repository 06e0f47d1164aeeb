-- The last aggregate version each consumer applied, one row per aggregate. Consumer.Handle locks
-- the aggregate's row in the consumer's transaction (an upsert, so the first event of an aggregate
-- locks too) before it compares the delivered version with the applied one: concurrent deliveries
-- of one aggregate take turns, and each sees what the one before it committed.
CREATE TABLE IF NOT EXISTS {{.Versions}} (
    consumer       text        NOT NULL DEFAULT '',
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
)
