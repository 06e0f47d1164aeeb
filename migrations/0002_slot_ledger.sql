-- The relay's memory of the slots it created. A slot recorded here that no longer exists was lost
-- (dropped, or invalidated for lack of WAL): the relay then refuses to create a fresh one, which
-- would silently skip every event committed in the gap. The backfill columns record that the
-- first-start backfill (backfill: true) completed, so a restart does not repeat it.
CREATE TABLE IF NOT EXISTS {{.Qualified "outbox_relay_slots"}} (
    slot                  text        PRIMARY KEY,
    consistent_lsn        pg_lsn,
    created_at            timestamptz NOT NULL DEFAULT now(),
    backfill_events       bigint,
    backfill_completed_at timestamptz
);
