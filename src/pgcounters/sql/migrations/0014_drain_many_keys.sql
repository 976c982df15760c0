-- pgcounters schema, version 14: a drain whose cost does not grow with the
-- number of distinct keys, and a ranking that does not tax every update.
--
-- * Named counters were ranked (top-N) through an index on (target_id, value).
--   An index on the value makes every change of a value a new index entry in
--   both of the table's indexes (no heap-only update is possible), and it is
--   what most of a drain batch over many distinct keys spent. The ranking now
--   goes through a coarse "rank band" of the value, a stored generated column:
--   an update that keeps a value in its band (most of them) is heap-only and
--   touches no index at all. A top-N read takes the bands from the top until it
--   holds N rows, then orders those rows by value: the same result as before.
-- * The column part of a drain locks and applies each parent table in one
--   statement per counter instead of a locking pass, an array round trip
--   through PL/pgSQL and an UPDATE that searched the locked keys.

-- ---------------------------------------------------------------------------
-- Rank bands
-- ---------------------------------------------------------------------------

-- The band of a value: 0 for -16 .. 15, then one band per power of two (16 ..
-- 31 is band 1, 32 .. 63 band 2, ... up to 59), mirrored below zero (-32 ..
-- -17 is band -1). Monotonic: a greater value never has a lower band, so the N
-- greatest values are among the rows of the N first rows' bands. A young key's
-- first increments stay in band 0; a key's band changes about once per
-- doubling of its value. width_bucket is a binary search in C over the
-- thresholds; a stored generated column is right for every writer of the table
-- (drain, add_direct, recount, hand-written SQL) without any of them knowing.
-- The table is rewritten once (a new stored column): ACCESS EXCLUSIVE for the
-- time it takes to copy pgcounters.counters.
ALTER TABLE pgcounters.counters
    ADD COLUMN band smallint GENERATED ALWAYS AS ((
        CASE WHEN value >= 0 THEN 1 ELSE -1 END
        * width_bucket(CASE WHEN value >= 0 THEN value ELSE -(value + 1) END, '{
            16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072,
            262144, 524288, 1048576, 2097152, 4194304, 8388608, 16777216, 33554432, 67108864,
            134217728, 268435456, 536870912, 1073741824, 2147483648, 4294967296, 8589934592,
            17179869184, 34359738368, 68719476736, 137438953472, 274877906944, 549755813888,
            1099511627776, 2199023255552, 4398046511104, 8796093022208, 17592186044416,
            35184372088832, 70368744177664, 140737488355328, 281474976710656, 562949953421312,
            1125899906842624, 2251799813685248, 4503599627370496, 9007199254740992,
            18014398509481984, 36028797018963968, 72057594037927936, 144115188075855872,
            288230376151711744, 576460752303423488, 1152921504606846976, 2305843009213693952,
            4611686018427387904
        }'::bigint[])
    )::smallint) STORED;

DROP INDEX pgcounters.counters_top;

-- top-N of one counter: ORDER BY band DESC, value DESC, key is the order by value
-- (the band is monotonic in it); this index gives the bands from the top, an
-- incremental sort orders the rows of each band, and the scan stops after the band
-- that holds the N-th row (see queries.sql, top_named)
CREATE INDEX counters_rank ON pgcounters.counters (target_id, band DESC);

-- no parallel plans on this table: for a large counter the planner would start
-- workers for the top-N scan above (about 13 ms of start-up against 0.13 ms for the
-- plain index scan, measured over 1M keys); nothing else reads it in bulk but
-- recount and verify, one counter at a time in the background
ALTER TABLE pgcounters.counters SET (parallel_workers = 0);

-- ---------------------------------------------------------------------------
-- The column part of a drain batch
-- ---------------------------------------------------------------------------

-- _drain_columns of version 8, same arguments and results: apply the column
-- part of a batch. For each counter (parent tables in name order, drainers
-- taking turns on a table as before), one statement locks the parent rows of
-- its keys without waiting (in key order), adds the summed deltas to the rows
-- it locked, and puts the deltas of rows that another transaction holds back
-- into the queue (one delta per key, as old as its oldest); the deltas of rows
-- that no longer exist are discarded. The rows are found once by key (an index
-- scan), the keys never go through a PL/pgSQL array. A data error (a sum out of
-- the bigint range, a key that does not cast) aborts the statement: the batch
-- then takes the careful path of drain_queue, as before.
CREATE OR REPLACE FUNCTION pgcounters._drain_columns(
    p_columns pgcounters.batch_delta[], p_unlogged boolean,
    OUT keys bigint, OUT busy bigint, OUT first_requeued bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text := CASE WHEN p_unlogged THEN 'queue_unlogged' ELSE 'queue' END;
    t pgcounters.targets;
    v_table text;
    v_applied bigint;
    v_busy bigint;
    v_first bigint;
BEGIN
    keys := 0;
    busy := 0;
    FOR t IN
        SELECT g.* FROM pgcounters.targets AS g
         WHERE g.id IN (SELECT d.target_id FROM unnest(p_columns) AS d)
         ORDER BY g.target_schema, g.target_table, g.id
    LOOP
        IF v_table IS DISTINCT FROM format('%I.%I', t.target_schema, t.target_table) THEN
            v_table := format('%I.%I', t.target_schema, t.target_table);
            -- drainers take turns on a table (tables in name order, so they cannot wait
            -- for each other in a cycle): without this, a second drainer finds every row
            -- the first one holds busy and puts its deltas back. A drainer holding this
            -- lock waits for nothing (SKIP LOCKED below), so the wait is always short.
            PERFORM pg_advisory_xact_lock(hashtext('pgcounters.parents'), hashtext(v_table));
        END IF;
        PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
        EXECUTE format($q$
            WITH d AS MATERIALIZED (
                SELECT b.key::%1$s AS key, min(b.key) AS text_key, sum(b.delta) AS delta,
                       sum(b.n) AS n, min(b.created_at) AS created_at
                  FROM unnest($1::pgcounters.batch_delta[]) AS b
                 WHERE b.target_id = $2
                 GROUP BY 1
            ), locked AS MATERIALIZED (
                SELECT x.%2$I AS key FROM %3$s AS x
                 WHERE x.%2$I = ANY (ARRAY(SELECT d.key FROM d))
                 ORDER BY x.%2$I
                   FOR NO KEY UPDATE OF x SKIP LOCKED
            ), applied AS (
                UPDATE %3$s AS x SET %4$I = coalesce(x.%4$I, 0) + %6$s
                  FROM d JOIN locked AS l ON l.key = d.key
                 WHERE x.%2$I = d.key
                RETURNING 1
            ), held AS MATERIALIZED (
                SELECT d.* FROM d
                 WHERE NOT EXISTS (SELECT 1 FROM locked AS l WHERE l.key = d.key)
                   AND EXISTS (SELECT 1 FROM %3$s AS x WHERE x.%2$I = d.key)
            ), back AS (
                INSERT INTO pgcounters.%5$I (target_id, key, delta, created_at)
                SELECT $2, ARRAY[h.text_key]::text, h.delta::bigint, h.created_at
                  FROM held AS h
                 ORDER BY h.key
                RETURNING id
            )
            SELECT (SELECT count(*) FROM applied),
                   (SELECT coalesce(sum(h.n), 0) FROM held AS h)::bigint,
                   (SELECT min(b.id) FROM back AS b)
            $q$,
            t.key_types[1]::regtype, t.target_key_column, v_table, t.target_column, v_queue,
            -- a sum of decimals: the deltas are units of 10^-scale (version 13)
            CASE WHEN t.scale IS NULL THEN 'd.delta::bigint'
                 ELSE format('pgcounters.unscaled(d.delta, %s)', t.scale) END)
        INTO v_applied, v_busy, v_first
        USING p_columns, t.id;
        PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
        keys := keys + v_applied;
        busy := busy + v_busy;
        first_requeued := least(first_requeued, v_first);
    END LOOP;
END;
$$;
