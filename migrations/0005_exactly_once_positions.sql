-- Exactly-once delivery keeps its position in Kafka (positions_topic), not here. The ledger only
-- records that a position was committed there for the slot, under which transactional id and in
-- which topic, so that a start which finds none can tell a first start from a lost position (the
-- topic deleted, or its record removed by a retention policy) and refuse, instead of publishing
-- again what Kafka already holds.
ALTER TABLE {{.Qualified "outbox_relay_slots"}}
    ADD COLUMN IF NOT EXISTS kafka_transactional_id text,
    ADD COLUMN IF NOT EXISTS kafka_positions_topic  text,
    ADD COLUMN IF NOT EXISTS kafka_position_since   timestamptz;
