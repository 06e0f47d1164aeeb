-- An insertion sequence orders the backfill: created_at is the transaction's start (equal for
-- every row of a transaction, and transactions start in another order than they commit) and ids
-- are random, so neither orders the events of one aggregate. seq is assigned as rows are inserted;
-- when the writers of one aggregate serialise on it (the normal case), that is commit order.
--
-- Adding the column takes an ACCESS EXCLUSIVE lock on the table. Queued behind a transaction that
-- reads the table, that request would stall every insert queued behind it in turn, for as long as
-- the reader lasts; so it waits 5s at most, and then the migration fails, changing nothing, and is
-- retried (Apply says so).
SET LOCAL lock_timeout = '5s';

DO $seq$
DECLARE
    typ regtype;
BEGIN
    SELECT atttypid::regtype INTO typ FROM pg_attribute
    WHERE attrelid = {{.TableLiteral}}::regclass AND attname = 'seq' AND attnum > 0 AND NOT attisdropped;
    IF typ IS NOT NULL THEN
        -- A table of the user's own that has it already (the README told them how to add one):
        -- kept as it is, numbers and all.
        IF typ NOT IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype) THEN
            RAISE EXCEPTION 'the outbox table % has a column seq of type %, which cannot be the backfill''s insertion sequence: rename that column, then run migrate again (it adds seq bigint GENERATED ALWAYS AS IDENTITY)', {{.TableLiteral}}, typ;
        END IF;
        RETURN;
    END IF;

    -- The column is added empty, filled for the rows already in the table, and only then made an
    -- identity: ADD COLUMN ... GENERATED ALWAYS AS IDENTITY would number existing rows in physical
    -- order, which after deletes (pruning) and space reuse is not insertion order, and PostgreSQL
    -- before 17 refuses it on a partitioned table. Existing rows are numbered in created_at order,
    -- ties (one transaction) in physical order, which is insertion order for rows a transaction
    -- wrote together unless their pages were recycled in between. This rewrites every row under
    -- the exclusive lock: prune a large outbox first. The UPDATE is decoded like any other: a
    -- publication that publishes UPDATEs of the table sends it to its subscribers (the relay's own
    -- publishes INSERTs only, and the relay ignores UPDATEs), and needs a replica identity for it
    -- (the primary key) or the UPDATE fails. An empty table skips it.
    ALTER TABLE {{.Table}} ADD COLUMN seq bigint;
    IF EXISTS (SELECT 1 FROM {{.Table}}) THEN
        UPDATE {{.Table}} AS t SET seq = o.n
        FROM (SELECT tableoid, ctid, row_number() OVER (ORDER BY created_at, tableoid, ctid) AS n FROM {{.Table}}) AS o
        WHERE t.tableoid = o.tableoid AND t.ctid = o.ctid;
    END IF;
    ALTER TABLE {{.Table}} ALTER COLUMN seq SET NOT NULL;
    -- GENERATED ALWAYS: writers cannot set it, so it cannot lie about insertion order (the outbox
    -- package and the relay never write it). COPY is the exception: it writes what it is given, so
    -- a COPY into the table names its columns, leaving seq out.
    ALTER TABLE {{.Table}} ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY;
    PERFORM setval(pg_get_serial_sequence({{.TableLiteral}}, 'seq'), max(seq)) FROM {{.Table}} HAVING max(seq) IS NOT NULL;
END
$seq$;

-- The backfill reads in seq order: through this index rather than by sorting the whole table. On
-- a partitioned table, each partition gets one.
CREATE INDEX IF NOT EXISTS {{.Name "seq_idx"}} ON {{.Table}} (seq);
