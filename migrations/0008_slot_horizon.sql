-- The horizon recorded with the last acknowledged commit (on_slot_lost: recover): the xmin of a
-- snapshot PostgreSQL took while the WAL's insert position was at or before the acknowledged end
-- LSN. Every transaction with a lower id had ended by then, so its commit precedes the
-- acknowledged point and Kafka holds its events; the rows of a lost slot's gap were all written by
-- transactions with this id or a later one, however long they ran, whether they waited on a lock
-- or were prepared (two-phase commit). A full 64-bit transaction id (xid8), so wraparound cannot
-- confuse it.
ALTER TABLE {{.Qualified "outbox_relay_slots"}}
    ADD COLUMN IF NOT EXISTS confirmed_xmin xid8;
