-- Effects outside the database, one row per operation. The intent is recorded (pending) in the
-- consumer's transaction with the business change; the effect is performed after that commit with
-- idempotency_key, and its outcome recorded (done). A row still pending after a crash is reconciled
-- with the provider (did the operation with this key happen?) instead of being performed again.
CREATE TABLE IF NOT EXISTS {{.Ops}} (
    consumer        text        NOT NULL DEFAULT '',
    idempotency_key text        NOT NULL,
    event_id        text        NOT NULL,
    effect          text        NOT NULL,
    request         jsonb,
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    outcome         text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz,
    PRIMARY KEY (consumer, idempotency_key)
);

CREATE INDEX IF NOT EXISTS {{.OpsIndex}} ON {{.Ops}} (consumer, event_id) WHERE state = 'pending'
