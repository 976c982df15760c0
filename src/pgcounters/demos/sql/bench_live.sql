-- Statements of the `soak` and `exact-read-live` benchmarks.

-- name: soak_parent
-- The parent table of the soak's counter column (created by the benchmark, dropped after).
CREATE TABLE bench_soak_parent (
    id bigint PRIMARY KEY,
    n  bigint NOT NULL DEFAULT 0
);

-- name: soak_fill_parent
-- The parent rows the soak's counter column counts into.
INSERT INTO bench_soak_parent (id) SELECT generate_series(1, %(rows)s::integer);

-- name: soak_drop_parent
-- Drop the soak's parent table.
DROP TABLE IF EXISTS bench_soak_parent CASCADE;

-- name: pgbench_soak
-- One transaction of the soak: an increment of a named counter (10,000 keys) and of a
-- counter column (1,000 parent rows), through the SQL interface.
\set k random(1, 10000)
\set p random(1, 1000)
BEGIN;
SELECT pgcounters.incr('bench.soak', ARRAY[:k::text], 1);
SELECT pgcounters.incr('bench.soak_column', ARRAY[:p::text], 1);
COMMIT;

-- name: soak_sample
-- One sample of the soak: per table, its total size (heap, indexes, TOAST) and its live
-- and dead tuples as the statistics last saw them, and how often autovacuum ran on it.
SELECT c.relname, pg_total_relation_size(c.oid),
       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
       coalesce(s.autovacuum_count, 0)
  FROM pg_class AS c
  LEFT JOIN pg_stat_all_tables AS s ON s.relid = c.oid
 WHERE c.oid IN ('pgcounters.queue'::regclass, 'pgcounters.queue_unlogged'::regclass,
                 'pgcounters.counters'::regclass, 'bench_soak_parent'::regclass);

-- name: soak_totals
-- The soak's totals: the named counter's values and the parent rows' column.
SELECT (SELECT coalesce(sum(value), 0) FROM pgcounters.counters
         WHERE target_id = (SELECT id FROM pgcounters.targets WHERE name = 'bench.soak')),
       (SELECT coalesce(sum(n), 0) FROM bench_soak_parent);

-- name: pending_deltas
-- Deltas still queued, both queues.
SELECT (SELECT count(*) FROM pgcounters.queue) + (SELECT count(*) FROM pgcounters.queue_unlogged);

-- name: oldest_pending
-- The age of the oldest pending delta of the logged queue, in seconds (0 when empty).
SELECT coalesce(extract(epoch FROM clock_timestamp() - (
    SELECT created_at FROM pgcounters.queue ORDER BY id LIMIT 1)), 0)::float8;

-- name: pgbench_live_writer
-- One increment of the live read benchmark's counter (100 keys).
\set k random(0, 99)
SELECT pgcounters.incr('bench.live', ARRAY[:k::text], 1);

-- name: live_total
-- The live read benchmark's total.
SELECT coalesce(sum(value), 0) FROM pgcounters.counters
 WHERE target_id = (SELECT id FROM pgcounters.targets WHERE name = 'bench.live');
