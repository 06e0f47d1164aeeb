-- The server the relay last streamed each slot from: IDENTIFY_SYSTEM's system identifier (which
-- database cluster) and timeline (which history of it; a promoted standby starts a new one). A
-- different system identifier means the slot is not the one the relay streamed: it refuses. A new
-- timeline means a failover: positions learned on the old one are never confirmed to the new one.
ALTER TABLE {{.Qualified "outbox_relay_slots"}}
    ADD COLUMN IF NOT EXISTS system_identifier text,
    ADD COLUMN IF NOT EXISTS timeline          bigint;
