-- outbox_shard(aggregate_id, shards): the shard of a sharded outbox (docs/scaling.md) an
-- aggregate's events go to, chosen as Kafka's Java producer chooses a partition for a key:
-- toPositive(murmur2(utf8(aggregate_id))) % shards, murmur2 being Kafka's Utils.murmur2 (seed
-- 0x9747b28c). Every event of an aggregate must go to the same shard, so call it with the same
-- shards everywhere; changing shards moves aggregates (docs/scaling.md, resharding).
-- The 32-bit arithmetic runs in bigint: a value below 2^32 times m (below 2^31) stays below 2^63,
-- and "& 4294967295" keeps the low 32 bits, as Java's int overflow does.
CREATE OR REPLACE FUNCTION outbox_shard(aggregate_id text, shards integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    data bytea := convert_to(aggregate_id, 'UTF8');
    len integer := length(data);
    m constant bigint := 1540483477; -- 0x5bd1e995
    h bigint := 2538058380 # len;    -- the seed 0x9747b28c xor the length
    k bigint;
    i integer := 0;
BEGIN
    IF shards < 1 THEN
        RAISE EXCEPTION 'outbox_shard: shards must be 1 or more, got %', shards
            USING HINT = 'pass the number of outbox shards the relays stream (docs/scaling.md)';
    END IF;
    WHILE i + 4 <= len LOOP
        k := get_byte(data, i)::bigint | (get_byte(data, i + 1)::bigint << 8)
            | (get_byte(data, i + 2)::bigint << 16) | (get_byte(data, i + 3)::bigint << 24);
        k := (k * m) & 4294967295;
        k := k # (k >> 24);
        k := (k * m) & 4294967295;
        h := ((h * m) & 4294967295) # k;
        i := i + 4;
    END LOOP;
    IF len - i = 3 THEN
        h := h # (get_byte(data, i + 2)::bigint << 16);
    END IF;
    IF len - i >= 2 THEN
        h := h # (get_byte(data, i + 1)::bigint << 8);
    END IF;
    IF len - i >= 1 THEN
        h := ((h # get_byte(data, i)::bigint) * m) & 4294967295;
    END IF;
    h := h # (h >> 13);
    h := (h * m) & 4294967295;
    h := h # (h >> 15);
    RETURN ((h & 2147483647) % shards)::integer;
END
$$;
