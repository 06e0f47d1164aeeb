-- What a lost slot's automatic recovery (on_slot_lost: recover) needs to find the gap in the outbox
-- table, and what it did. The relay records, as Kafka acknowledges them, the commit time and end
-- LSN of the last transaction whose events Kafka holds, every one before it included: the rows
-- committed after it are the events a lost slot would take with it. recovery_since marks a recovery
-- under way (a new slot whose gap is not yet published: a process that finds it set starts the
-- recovery again); the recovered_* columns describe the last one for `outbox-relay status`.
-- pruned_through is the newest creation time the relay's own pruning deleted, so that a recovery
-- knows whether the gap it is about to publish is still whole.
ALTER TABLE {{.Qualified "outbox_relay_slots"}}
    ADD COLUMN IF NOT EXISTS confirmed_commit_time timestamptz,
    ADD COLUMN IF NOT EXISTS confirmed_end_lsn     pg_lsn,
    ADD COLUMN IF NOT EXISTS recovery_since        timestamptz,
    ADD COLUMN IF NOT EXISTS recovery_from_creation boolean,
    ADD COLUMN IF NOT EXISTS recovered_at          timestamptz,
    ADD COLUMN IF NOT EXISTS recovered_events      bigint,
    ADD COLUMN IF NOT EXISTS recovered_from        timestamptz,
    ADD COLUMN IF NOT EXISTS recovered_rule        text,
    ADD COLUMN IF NOT EXISTS recovered_took        interval,
    ADD COLUMN IF NOT EXISTS pruned_through        timestamptz;
