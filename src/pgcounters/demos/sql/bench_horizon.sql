-- Named statements of the held-horizon benchmark ("-- name: NAME" blocks).

-- name: drop_tables
-- The benchmark's tables, dropped before and after a run.
DROP TABLE IF EXISTS bench_horizon_child, bench_horizon_parent CASCADE;

-- name: create_tables
-- The parent table whose counter column a declared counter keeps (the children per parent),
-- and the children.
CREATE TABLE bench_horizon_parent (
    id bigint PRIMARY KEY,
    n  bigint NOT NULL DEFAULT 0
);
CREATE TABLE bench_horizon_child (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    parent_id bigint NOT NULL REFERENCES bench_horizon_parent (id)
);
CREATE INDEX ON bench_horizon_child (parent_id, id);

-- name: fill_parents
-- The parent rows.
INSERT INTO bench_horizon_parent (id) SELECT generate_series(1, %(parents)s::integer);

-- name: fill_children
-- Children for every parent (counted by the declared counter's triggers).
INSERT INTO bench_horizon_child (parent_id)
SELECT p FROM generate_series(1, %(parents)s::integer) AS p, generate_series(1, %(each)s::integer);

-- name: pgbench_named
-- The named counter's load: one increment of a key out of 10,000.
\set k random(1, 10000)
SELECT pgcounters.incr('bench.horizon', ARRAY[:k::text], 1);

-- name: pgbench_children
-- The declared counter's load: a child inserted and the oldest child of a parent deleted.
\set p random(1, 1000)
INSERT INTO bench_horizon_child (parent_id) VALUES (:p);
DELETE FROM bench_horizon_child
 WHERE id = (SELECT id FROM bench_horizon_child WHERE parent_id = :p ORDER BY id LIMIT 1);

-- name: sample
-- One sample: per table its total size (heap, indexes, TOAST), live and dead tuples as the
-- statistics last saw them.
SELECT c.relname, pg_total_relation_size(c.oid),
       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0)
  FROM pg_class AS c
  LEFT JOIN pg_stat_all_tables AS s ON s.relid = c.oid
 WHERE c.oid IN ('pgcounters.queue'::regclass, 'pgcounters.counters'::regclass,
                 'bench_horizon_parent'::regclass);

-- name: drained
-- What the drains did so far: batches, deltas applied, seconds inside batches.
SELECT coalesce(sum(batches), 0)::float8, coalesce(sum(deltas), 0)::float8,
       coalesce(sum(seconds), 0)::float8
  FROM pgcounters.drain_stats;

-- name: oldest_pending
-- The age of the oldest pending delta of the logged queue, in seconds (0 when empty).
SELECT coalesce(extract(epoch FROM clock_timestamp() - (
    SELECT created_at FROM pgcounters.queue ORDER BY id LIMIT 1)), 0)::float8;

-- name: pending
-- Deltas still queued.
SELECT count(*) FROM pgcounters.queue;

-- name: hold
-- The long transaction: a snapshot taken and kept, idle (run after BEGIN ISOLATION LEVEL
-- REPEATABLE READ).
SELECT 1 FROM bench_horizon_parent LIMIT 1;

-- name: totals
-- The truth at the end: the named counter's values against the increments pgbench made, the
-- counter column against a count of the children.
SELECT (SELECT coalesce(sum(value), 0) FROM pgcounters.counters
         WHERE target_id = (SELECT id FROM pgcounters.targets WHERE name = 'bench.horizon')),
       (SELECT count(*) FROM bench_horizon_parent AS p
         WHERE p.n <> (SELECT count(*) FROM bench_horizon_child AS c WHERE c.parent_id = p.id));
