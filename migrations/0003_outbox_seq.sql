-- An insertion sequence orders the backfill: created_at is the transaction's start (equal for
-- every row of a transaction, and transactions start in another order than they commit) and ids
-- are random, so neither orders the events of one aggregate. seq is assigned as rows are inserted;
-- when the writers of one aggregate serialise on it (the normal case), that is commit order.
--
-- The column is added empty, filled for the rows already in the table, and only then made an
-- identity: ADD COLUMN ... GENERATED ALWAYS AS IDENTITY would number existing rows in physical
-- order, which after deletes (pruning) and space reuse is not insertion order, and PostgreSQL
-- before 17 refuses it on a partitioned table. Existing rows are numbered in created_at order,
-- ties (one transaction) in physical order, which is insertion order for rows a transaction
-- wrote together unless their pages were recycled in between. This rewrites every row under an
-- exclusive lock on the table: prune a large outbox first.
ALTER TABLE {{.Table}} ADD COLUMN seq bigint;

UPDATE {{.Table}} AS t SET seq = o.n
FROM (SELECT tableoid, ctid, row_number() OVER (ORDER BY created_at, tableoid, ctid) AS n FROM {{.Table}}) AS o
WHERE t.tableoid = o.tableoid AND t.ctid = o.ctid;

ALTER TABLE {{.Table}} ALTER COLUMN seq SET NOT NULL;
-- GENERATED ALWAYS: writers cannot set it, so it cannot lie about insertion order (the outbox
-- package and the relay never write it).
ALTER TABLE {{.Table}} ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY;

SELECT setval(pg_get_serial_sequence({{.TableLiteral}}, 'seq'), max(seq)) FROM {{.Table}} HAVING max(seq) IS NOT NULL;
