-- Which relay process streamed each slot last (host/pid/random, written when a leadership term
-- starts streaming). A term that finds the slot confirmed beyond what its own process confirmed
-- tells from it whether another relay streamed the slot meanwhile (a takeover) or whether someone
-- advanced, or dropped and recreated, the slot behind the relay's back (it stops: the events in
-- between were never streamed).
ALTER TABLE {{.Qualified "outbox_relay_slots"}}
    ADD COLUMN IF NOT EXISTS streamed_by    text,
    ADD COLUMN IF NOT EXISTS streamed_since timestamptz;
